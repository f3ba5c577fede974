"""Location-aware score (Chorowski et al. 2015): the formula against a loop, gradients,
masks, the Attention integration and a learning test that content alone cannot pass."""

from __future__ import annotations

import pytest
import torch
from attention_harness import Inputs, check_fully_masked_row, check_masked_keys_zero, check_output

import attnlab
from attnlab.general.location import LocationAwareScore, location_aware_score
from attnlab.general.scoring import AdditiveScore


def _score(seed: int = 0, dtype=torch.float32, **kw) -> LocationAwareScore:
    torch.manual_seed(seed)
    s = LocationAwareScore(d_q=3, d_k=4, d_w=5, n_filters=2, kernel_size=3, **kw).to(dtype)
    with torch.no_grad():
        for p in s.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return s


def test_formula_against_a_loop() -> None:
    s = _score()
    g = torch.Generator().manual_seed(1)
    B, n_q, n_k = 2, 3, 5
    q, k = torch.randn(B, n_q, 3, generator=g), torch.randn(B, n_k, 4, generator=g)
    prev = torch.softmax(torch.randn(B, n_q, n_k, generator=g), -1)
    e = s(q, k, prev)
    assert e.shape == (B, n_q, n_k)
    W1, W2, U, w, b = s.W1.weight, s.W2.weight, s.U.weight, s.w, s.b
    Fw = s.conv.weight[:, 0, :]  # [n_f, r]
    r = Fw.shape[1]
    for bi in range(B):
        for i in range(n_q):
            for l in range(n_k):
                # f_{i,l}[c] = sum_t F[c, t] a_{i-1}[l + t - r//2] (zero outside the keys)
                f = torch.zeros(Fw.shape[0])
                for t in range(r):
                    j = l + t - r // 2
                    if 0 <= j < n_k:
                        f = f + Fw[:, t] * prev[bi, i, j]
                ref = w @ torch.tanh(W1 @ q[bi, i] + W2 @ k[bi, l] + U @ f + b)
                torch.testing.assert_close(e[bi, i, l], ref, atol=1e-5, rtol=1e-5)


def test_without_previous_weights_it_is_the_additive_score() -> None:
    s = _score()
    add = AdditiveScore(d_q=3, d_k=4, d_w=5)
    with torch.no_grad():
        add.W1.weight.copy_(s.W1.weight)
        add.W2.weight.copy_(s.W2.weight)
        add.w.copy_(s.w)
        add.b.copy_(s.b)
    q, k = torch.randn(2, 3, 3), torch.randn(2, 5, 4)
    torch.testing.assert_close(s(q, k), add.explicit(q, k), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s(q, k, torch.zeros(2, 3, 5)), s(q, k))
    # a single query with [B, n_k] previous weights
    prev = torch.softmax(torch.randn(2, 5), -1)
    torch.testing.assert_close(s(q[:, 0], k, prev), s(q[:, :1], k, prev[:, None])[:, 0])


def test_gradcheck() -> None:
    s = _score(dtype=torch.float64)
    q = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    prev = torch.rand(2, 2, 4, dtype=torch.float64, requires_grad=True)
    params = (s.W1.weight, s.W2.weight, s.U.weight, s.conv.weight, s.w, s.b)
    assert torch.autograd.gradcheck(
        lambda q, k, prev, *p: location_aware_score(q, k, prev, *p), (q, k, prev, *params)
    )


def test_attention_masks_and_padding() -> None:
    torch.manual_seed(0)
    attn = attnlab.Attention("location-aware", "soft", d_q=3, d_k=4, n_filters=2, kernel_size=3)
    assert attn.explain()[0] == "explicit"
    q, k = torch.randn(2, 3), torch.randn(2, 5, 4)
    lengths = torch.tensor([5, 3])
    mask = attnlab.masks.from_lengths(lengths, 5)[:, 0]  # [B, n_k]
    prev = torch.softmax(torch.randn(2, 5), -1) * mask
    # the padded keys (3 and 4 of example 1) get exactly zero weight
    out = check_masked_keys_zero(attn, Inputs((q, k), {"mask": mask, "prev_weights": prev}), mask)
    assert out.path == "explicit" and out.weights.shape == (2, 5)
    assert (out.weights[1, 3:] == 0).all()
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(2))
    # whatever the previous weights hold at masked keys (NaN included) does not matter
    junk = prev.clone()
    junk[1, 3:] = float("nan")
    again = attn(q, k, mask=mask, need_weights=True, prev_weights=junk)
    torch.testing.assert_close(again.weights, out.weights)
    # the previous weights change the result
    other = attn(q, k, mask=mask, need_weights=True, prev_weights=prev.flip(-1) * mask)
    assert not torch.allclose(other.weights[0], out.weights[0])
    # a fully masked row: zero weights and context, finite gradients
    nothing = torch.zeros(2, 5, dtype=torch.bool)
    none = check_fully_masked_row(attn, Inputs((q, k), {"mask": nothing}), (...,))
    assert (none.weights == 0).all() and (none.context == 0).all()


@pytest.mark.parametrize("single", [True, False])
def test_an_empty_key_set_with_previous_weights(single: bool) -> None:
    """No keys (n_k = 0) with previous weights ``[B, (n_q,) 0]``: empty weights and a zero
    context, as without previous weights, and gradients that are zero (conv1d refused the
    empty input before: "Kernel size can't be greater than actual input size")."""
    torch.manual_seed(0)
    attn = attnlab.Attention("location-aware", "soft", d_q=3, d_k=4, n_filters=2, kernel_size=3)
    q = torch.randn(2, 3) if single else torch.randn(2, 4, 3)
    k = torch.randn(2, 0, 4, requires_grad=True)
    prev = torch.zeros(*q.shape[:-1], 0)
    out = check_fully_masked_row(attn, Inputs((q, k), {"prev_weights": prev}), (...,))
    assert out.weights.shape == (*q.shape[:-1], 0)
    assert torch.equal(out.context, torch.zeros(*q.shape[:-1], 4))
    e = attn.score(q, k, prev)
    assert e.shape == (*q.shape[:-1], 0)


def test_every_alignment_runs_and_local_takes_the_explicit_path() -> None:
    q, k = torch.randn(2, 3, 3), torch.randn(2, 6, 4)
    prev = torch.softmax(torch.randn(2, 3, 6), -1)
    for align in ("soft", "hard", "sparsemax", "local-m", "local-p"):
        window = {"D": 2} if align.startswith("local") else {}
        attn = attnlab.Attention("location-aware", align, d_q=3, d_k=4, **window)
        inputs = Inputs((q, k), {"prev_weights": prev})
        out = check_output(attn, inputs, context_shape=(2, 3, 4), weights_shape=(2, 3, 6))
        assert out.path == "explicit" and out.weights.shape == (2, 3, 6), align


def test_errors_name_the_fix() -> None:
    attn = attnlab.Attention("additive", "soft", d_q=3, d_k=4)
    with pytest.raises(ValueError, match="score='location-aware'"):
        attn(torch.randn(2, 3), torch.randn(2, 5, 4), prev_weights=torch.zeros(2, 5))
    loc = attnlab.Attention("location-aware", "soft", d_q=3, d_k=4)
    with pytest.raises(ValueError, match=r"prev_weights has shape \(2, 4\)"):
        loc(torch.randn(2, 3), torch.randn(2, 5, 4), prev_weights=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="odd"):
        LocationAwareScore(d_q=3, d_k=4, kernel_size=4)
    with pytest.raises(ValueError, match="vector score"):
        attnlab.Attention("location-aware", "soft", "multi", d_q=3, d_k=4)
    assert attnlab.registry.get("score", "chorowski").cls is LocationAwareScore


def _shift_data(n: int, g: torch.Generator) -> torch.Tensor:
    """Keys with random content and no position information: the output at step t must
    be key t, reached only by moving one key on from where step t - 1 attended."""
    return torch.randn(n, 6, 4, generator=g)


def _train_monotonic(kind: str, seed: int, steps: int = 150) -> float:
    """Attend over 6 keys for 5 steps with a constant query, starting from weights on key
    0; the target of step t is key t. Returns the test MSE of the contexts."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    query = torch.nn.Parameter(torch.zeros(1, 4))
    attn = None if kind == "mean" else attnlab.Attention(kind, "soft", d_q=4, d_k=4, d_w=8)
    params = [query] + (list(attn.parameters()) if attn is not None else [])
    opt = torch.optim.Adam(params, lr=0.05)

    def run(keys: torch.Tensor) -> torch.Tensor:
        B = keys.shape[0]
        prev = torch.zeros(B, 6)
        prev[:, 0] = 1.0
        loss = keys.new_zeros(())
        for t in range(1, 6):
            if attn is None:
                context = keys.mean(1)
            else:
                extra = {"prev_weights": prev} if kind == "location-aware" else {}
                out = attn(query.expand(B, 4), keys, need_weights=True, **extra)
                context, prev = out.context, out.weights
            loss = loss + ((context - keys[:, t]) ** 2).mean() / 5
        return loss

    for _ in range(steps if attn is not None else 0):  # the mean has nothing to learn
        opt.zero_grad()
        run(_shift_data(32, g)).backward()
        opt.step()
    with torch.no_grad():
        return float(run(_shift_data(256, torch.Generator().manual_seed(10_000 + seed))))


@pytest.mark.slow
def test_location_learns_to_move_on_where_content_and_mean_cannot(one_thread) -> None:
    seed = 0  # seeds 0-7 all pass (checked locally)
    mean = _train_monotonic("mean", seed)
    content = _train_monotonic("additive", seed)
    location = _train_monotonic("location-aware", seed)
    assert location < 0.15 * mean, (location, mean)
    assert location < 0.15 * content, (location, content)


@pytest.mark.parametrize("bias", ["no", 1, None])
def test_location_aware_bias_must_be_a_bool(bias: object) -> None:
    with pytest.raises(TypeError, match=r"^bias must be a bool, got"):
        LocationAwareScore(d_q=4, d_k=4, bias=bias)
