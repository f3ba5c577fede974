"""Seq2SeqTranslator: decoder steps against hand computations, gradients, masks, decoding
and a learning test on a generated reversal task."""

from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import attnlab
from attnlab._checks import ConfigError
from attnlab.models.translator import (
    Encoded,
    Seq2SeqTranslator,
    sequence_log_prob,
)

PAD, BOS, EOS = 0, 2, 3


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 9, (2, 5), generator=g)
    lengths = torch.tensor([5, 3])
    src[1, 3:] = PAD
    tgt_in = torch.randint(4, 7, (2, 3), generator=g)
    tgt_in[:, 0] = BOS
    return src, lengths, tgt_in


def _model(**kw) -> Seq2SeqTranslator:
    torch.manual_seed(0)
    opts = {"embed_dim": 3, "hidden_size": 4, **kw}
    return Seq2SeqTranslator(9, 7, **opts).eval()


def test_hard_attention_log_prob_counts_the_real_target_steps_only() -> None:
    """The sampled choices of the padded target steps are no part of a sentence's
    log_prob: a sentence batched with a longer one has the log_prob it has alone."""
    model = _model(attention={"align": "hard"})  # evaluation: the argmax, no sampling
    src = torch.tensor([[4, 5, 6, 0], [4, 5, 6, 7]])
    lengths = torch.tensor([3, 4])
    tgt_in = torch.tensor([[1, 3, 4, 0, 0], [1, 3, 4, 5, 6]])  # BOS = 1, PAD = 0
    both = model(src, lengths, tgt_in).log_prob
    alone = model(src[:1, :3], lengths[:1], tgt_in[:1, :3]).log_prob
    torch.testing.assert_close(both[0], alone[0])
    assert both[1] < 0


def _lstm_cell(rnn: torch.nn.LSTM, x, h, c):
    """One LSTM step from the gate equations, with the module's weights."""
    gates = rnn.weight_ih_l0 @ x + rnn.bias_ih_l0 + rnn.weight_hh_l0 @ h + rnn.bias_hh_l0
    n = h.shape[0]
    i, f, g, o = (gates[k * n : (k + 1) * n] for k in range(4))
    c1 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c1), c1


def _softmax(scores: list[float]) -> list[float]:
    m = max(scores)
    ex = [math.exp(s - m) for s in scores]
    return [x / sum(ex) for x in ex]


def _check_init(model: Seq2SeqTranslator, enc: Encoded, lengths) -> None:
    half = model.d // 2
    for b, L in enumerate(lengths.tolist()):
        last = torch.cat([enc.states[b, L - 1, :half], enc.states[b, 0, half:]])
        expect = torch.tanh(model.bridge.weight @ last + model.bridge.bias)
        torch.testing.assert_close(enc.init[b], expect)


# ----------------------------------------------------------------------------- by hand


def test_bahdanau_steps_by_hand() -> None:
    model = _model(style="bahdanau")
    src, lengths, tgt_in = _batch()
    with torch.no_grad():
        enc = model.encode(src, lengths)
        out = model.decode(enc, tgt_in)
        _check_init(model, enc, lengths)
        sc = model.attention.score
        for b, L in enumerate(lengths.tolist()):
            s, c = enc.init[b], torch.zeros(model.d)
            for t in range(tgt_in.shape[1]):
                emb = model.tgt_embedding.weight[tgt_in[b, t]]
                # additive score with the PREVIOUS state as the query
                e = [
                    float(
                        sc.w @ torch.tanh(sc.W1.weight @ s + sc.W2.weight @ enc.states[b, l] + sc.b)
                    )
                    for l in range(L)
                ]
                a = _softmax(e)
                ctx = sum(a[l] * enc.states[b, l] for l in range(L))
                s, c = _lstm_cell(model.decoder, torch.cat([emb, ctx]), s, c)
                hid = torch.tanh(
                    model.pre_output.weight @ torch.cat([s, ctx, emb]) + model.pre_output.bias
                )
                logits = model.output.weight @ hid + model.output.bias
                torch.testing.assert_close(out.logits[b, t], logits, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(
                    out.weights[b, t], torch.tensor(a + [0.0] * (5 - L)), atol=1e-6, rtol=1e-5
                )


@pytest.mark.parametrize("feeding", [True, False])
def test_luong_steps_by_hand(feeding: bool) -> None:
    model = _model(style="luong", attention="general", input_feeding=feeding)
    src, lengths, tgt_in = _batch(1)
    with torch.no_grad():
        enc = model.encode(src, lengths)
        out = model.decode(enc, tgt_in)
        W = model.attention.score.W.weight  # e_l = h_l^T W s
        for b, L in enumerate(lengths.tolist()):
            s, c = enc.init[b], torch.zeros(model.d)
            feed = torch.zeros(model.d)
            for t in range(tgt_in.shape[1]):
                emb = model.tgt_embedding.weight[tgt_in[b, t]]
                x = torch.cat([emb, feed]) if feeding else emb
                s, c = _lstm_cell(model.decoder, x, s, c)
                # general score with the CURRENT state as the query
                e = [float(enc.states[b, l] @ (W @ s)) for l in range(L)]
                a = _softmax(e)
                ctx = sum(a[l] * enc.states[b, l] for l in range(L))
                h_tilde = torch.tanh(model.combine.weight @ torch.cat([ctx, s]))
                feed = h_tilde
                logits = model.output.weight @ h_tilde + model.output.bias
                torch.testing.assert_close(out.logits[b, t], logits, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(
                    out.weights[b, t, :L], torch.tensor(a), atol=1e-6, rtol=1e-5
                )


def test_local_m_window_follows_the_output_position() -> None:
    model = _model(style="luong", attention={"align": "local-m", "D": 1})
    src = torch.randint(4, 9, (1, 7))
    tgt_in = torch.full((1, 5), 5)
    with torch.no_grad():
        w = model(src, None, tgt_in).weights[0]
    for t in range(5):
        for l in range(7):
            if abs(l - t) > 1:
                assert w[t, l] == 0
        assert w[t].sum() == pytest.approx(1.0, abs=1e-5)  # local-m has no Gaussian factor


def test_mean_baseline_context_is_the_mean_state() -> None:
    model = _model(style="bahdanau", attention="mean")
    assert model.attention is None
    src, lengths, _ = _batch()
    with torch.no_grad():
        enc = model.encode(src, lengths)
        ctx, w, _ = model._attend(enc.init, enc, torch.zeros(2, dtype=torch.long))
    torch.testing.assert_close(ctx[1], enc.states[1, :3].mean(0))
    torch.testing.assert_close(w[1], torch.tensor([1 / 3] * 3 + [0.0, 0.0]))


def test_uniform_baseline_keeps_the_attention_parameters() -> None:
    model = _model(attention="uniform")
    assert model.attention is not None and model.uniform
    src, lengths, tgt_in = _batch()
    with torch.no_grad():
        w = model(src, lengths, tgt_in).weights
    torch.testing.assert_close(w[1, :, :3], torch.full((3, 3), 1 / 3))
    assert (w[1, :, 3:] == 0).all()


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    "kw",
    [
        {"style": "bahdanau"},
        {"style": "luong", "attention": "dot"},
        {"style": "luong", "attention": {"align": "local-p", "D": 2}},
        {"style": "bahdanau", "rnn": "gru", "attention": "mean"},
    ],
    ids=["bahdanau", "luong-dot", "local-p", "gru-mean"],
)
def test_gradcheck_float64(kw) -> None:
    model = _model(**kw).double()
    src, lengths, tgt_in = _batch()
    enc = model.encode(src, lengths)
    states = enc.states.detach().clone().requires_grad_(True)
    init = enc.init.detach().clone().requires_grad_(True)

    def f(states, init):
        return model.decode(Encoded(states * enc.mask[..., None], enc.mask, init), tgt_in).logits

    assert torch.autograd.gradcheck(f, (states, init), eps=1e-6, atol=1e-5)


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize(
    "kw",
    [
        {"style": "bahdanau"},
        {"style": "luong"},
        {"style": "luong", "attention": {"align": "local-m", "D": 1}},
        {"style": "luong", "attention": {"align": "local-p", "D": 2}},
        {"style": "bahdanau", "attention": "mean"},
    ],
    ids=["bahdanau", "luong", "local-m", "local-p", "mean"],
)
def test_padding_gets_no_weight_and_changes_nothing(kw) -> None:
    model = _model(**kw)
    src, lengths, tgt_in = _batch()
    with torch.no_grad():
        out = model(src, lengths, tgt_in)
        assert (out.weights[1, :, 3:] == 0).all()
        other = src.clone()
        other[1, 3:] = 8  # different padding content
        wider = torch.cat([other, torch.full((2, 2), 7)], 1)  # and two more padding columns
        out2 = model(wider, lengths, tgt_in)
    torch.testing.assert_close(out2.logits, out.logits)
    torch.testing.assert_close(out2.weights[:, :, :5], out.weights)
    assert (out2.weights[:, :, 5:] == 0).all()


def test_one_sentence_alone_equals_its_batch_row() -> None:
    model = _model(style="luong")
    src, lengths, tgt_in = _batch()
    with torch.no_grad():
        out = model(src, lengths, tgt_in)
        alone = model(src[1:, :3], None, tgt_in[1:])
    torch.testing.assert_close(alone.logits[0], out.logits[1])


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
def test_compiled_translator_serves_varied_lengths_with_a_few_graphs(style: str) -> None:
    """Compiled, the encoder's recurrence and the teacher-forced decoder run their padded
    lengths rounded up to a power of two (``attnlab._checks.compiled_steps``): nine
    batches of different source and target lengths, both within the powers of two 8, 16
    and 32, take at most five graphs (a graph per pair of lengths hit Dynamo's recompile
    limit, 8, and fell back to eager), and the logits, weights and gradients are
    eager's."""
    model = _model(style=style)
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter)
    g = torch.Generator().manual_seed(4)
    pairs = [(5, 3), (7, 6), (6, 8), (9, 10), (13, 12), (16, 15), (17, 20), (30, 31), (25, 18)]
    for n, T in pairs:
        src = torch.randint(4, 9, (3, n), generator=g)
        lengths = torch.tensor([n, max(1, n - 3), 1])
        src[1, max(1, n - 3) :], src[2, 1:] = PAD, PAD
        tgt_in = torch.randint(4, 7, (3, T), generator=g)
        tgt_in[:, 0] = BOS
        got, want = compiled(src, lengths, tgt_in), model(src, lengths, tgt_in)
        assert got.logits.shape == (3, T, 7)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got.weights, want.weights, atol=1e-6, rtol=1e-5)
        params = [p for p in model.parameters() if p.requires_grad]
        for a, b in zip(
            torch.autograd.grad(got.logits.square().sum(), params, allow_unused=True),
            torch.autograd.grad(want.logits.square().sum(), params, allow_unused=True),
            strict=True,
        ):
            if a is None or b is None:
                assert a is None and b is None
                continue
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    graphs = counter.frame_count
    assert graphs <= 5, f"{graphs} graphs for the (source, target) lengths {pairs}"
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
def test_greedy_equals_beam_of_one(style: str) -> None:
    for seed in range(3):
        torch.manual_seed(seed)
        model = Seq2SeqTranslator(9, 7, embed_dim=4, hidden_size=6, style=style).eval()
        src, lengths, _ = _batch(seed)
        g = model.greedy_decode(src, lengths, max_len=8)
        b = model.beam_search(src, lengths, beam_size=1, max_len=8)
        assert g.tokens == b.tokens
        for x, y in zip(g.attention, b.attention, strict=True):
            torch.testing.assert_close(x, y)
        assert g.scores == pytest.approx(b.scores, abs=1e-5)


def test_decoded_score_is_the_sequence_log_probability() -> None:
    model = _model(style="luong")
    src, lengths, _ = _batch()
    b = model.beam_search(src[:1], lengths[:1], beam_size=3, max_len=6)
    eos = len(b.tokens[0]) < 6
    expect = sequence_log_prob(model, src[0], b.tokens[0], eos=eos)
    assert b.scores[0] == pytest.approx(expect, abs=1e-4)
    assert b.attention[0].shape == (len(b.tokens[0]), 5)


class _TableModel(Seq2SeqTranslator):
    """Next-token probabilities from a fixed table indexed by the previous token:
    after BOS: A 0.6, B 0.4; after A: A 0.4, B 0.3, EOS 0.3; after B: EOS 0.9, A 0.1."""

    A, B = 4, 5

    def decode_step(self, y_prev, state, enc):
        probs = torch.full((y_prev.shape[0], 6), 1e-9)
        for n, y in enumerate(y_prev.tolist()):
            row = {BOS: {self.A: 0.6, self.B: 0.4}, self.A: {self.A: 0.4, self.B: 0.3, EOS: 0.3}}
            for tok, p in row.get(y, {EOS: 0.9, self.A: 0.1}).items():
                probs[n, tok] = p
        new = dict(state)
        new["step"] = state["step"] + 1
        weights = enc.mask.to(probs.dtype) / enc.mask.sum(1, keepdim=True)
        return probs.log(), new, weights, None


def test_beam_search_finds_the_more_probable_sequence() -> None:
    model = _TableModel(6, 6, embed_dim=2, hidden_size=2).eval()
    src = torch.tensor([[4, 5]])
    greedy = model.greedy_decode(src, max_len=4)
    beam = model.beam_search(src, beam_size=2, max_len=4)
    # greedy follows A (0.6) and then A (0.4) ...: A A A A, probability 0.6 * 0.4^3
    assert greedy.tokens == [[4, 4, 4, 4]]
    assert greedy.scores[0] == pytest.approx(math.log(0.6 * 0.4**3), abs=1e-6)
    # beam search finds B EOS: 0.4 * 0.9 = 0.36 > A EOS (0.18) and every A... path
    assert beam.tokens == [[5]]
    assert beam.scores[0] == pytest.approx(math.log(0.36), abs=1e-6)


def test_length_penalty_prefers_longer_hypotheses() -> None:
    model = _TableModel(6, 6, embed_dim=2, hidden_size=2).eval()
    src = torch.tensor([[4, 5]])
    # with a strong length penalty the long unfinished A A A A (log 0.0384 / lp(4)) beats
    # B EOS (log 0.36 / lp(2)): lp(n) = ((5 + n) / 6) ** alpha
    alpha = 8.0
    long_ = math.log(0.6 * 0.4**3) / ((5 + 4) / 6) ** alpha
    short = math.log(0.36) / ((5 + 2) / 6) ** alpha
    assert long_ > short
    beam = model.beam_search(src, beam_size=2, max_len=4, length_penalty=alpha)
    assert len(beam.tokens[0]) > 1


# ----------------------------------------------------------------------------- config


def test_config_round_trip() -> None:
    model = _model(style="luong", attention={"score": "general", "align": "local-p", "D": 2})
    cfg = model.get_config()
    assert cfg["name"] == "translator"
    again = attnlab.build(cfg).eval()
    again.load_state_dict(model.state_dict())
    src, lengths, tgt_in = _batch()
    with torch.no_grad():
        torch.testing.assert_close(
            again(src, lengths, tgt_in).logits, model(src, lengths, tgt_in).logits
        )


def test_bad_configuration_and_input() -> None:
    with pytest.raises(ConfigError, match="style"):
        Seq2SeqTranslator(5, 5, style="transformer")
    with pytest.raises(ConfigError, match="even"):
        Seq2SeqTranslator(5, 5, hidden_size=5)
    with pytest.raises(ConfigError, match="rnn"):
        Seq2SeqTranslator(5, 5, rnn="rnn")
    model = _model()
    with pytest.raises(ValueError, match="src"):
        model(torch.tensor([[1, 99]]), None, torch.tensor([[BOS]]))
    with pytest.raises(TypeError, match="src"):
        model(torch.zeros(1, 2), None, torch.tensor([[BOS]]))
    with pytest.raises(ValueError, match="beam_size"):
        model.beam_search(torch.tensor([[4, 5]]), beam_size=0)


@pytest.mark.parametrize("max_len", [0, -1, 2.5, True])
def test_decoding_lengths_and_penalties_are_checked(max_len) -> None:
    """``max_len=-1`` decoded nothing without a word, ``True`` one step, ``2.5`` was a
    ``TypeError`` from ``range``; a NaN length penalty ranked no hypothesis above another."""
    model, src = _model().eval(), torch.tensor([[4, 5]])
    message = rf"^max_len must be an int >= 1, got {max_len!r}$"
    with pytest.raises(ValueError, match=message):
        model.greedy_decode(src, max_len=max_len)
    with pytest.raises(ValueError, match=message):
        model.beam_search(src, max_len=max_len)
    with pytest.raises(ValueError, match=r"^length_penalty must be a number >= 0, got nan$"):
        model.beam_search(src, length_penalty=float("nan"))


# ----------------------------------------------------------------------------- learning


V = 20  # 16 symbols (ids 4..19) besides the specials


def _reverse_data(n: int, g: torch.Generator):
    L = 10
    lengths = torch.randint(6, L + 1, (n,), generator=g)
    src = torch.randint(4, V, (n, L), generator=g)
    src[torch.arange(L)[None] >= lengths[:, None]] = PAD
    tgt = torch.full((n, L + 1), PAD)
    for i in range(n):
        k = int(lengths[i])
        tgt[i, :k] = src[i, :k].flip(0)
        tgt[i, k] = EOS
    tgt_in = torch.cat([torch.full((n, 1), BOS), tgt[:, :-1]], 1)
    tgt_in[tgt_in == EOS] = PAD
    return src, lengths, tgt_in, tgt


def _train_reverse(attention, steps: int = 200) -> float:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = Seq2SeqTranslator(
        V, V, embed_dim=16, hidden_size=16, style="luong", attention=attention
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        src, lengths, tgt_in, tgt = _reverse_data(32, g)
        logits = model(src, lengths, tgt_in).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, V), tgt.reshape(-1), ignore_index=PAD
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, lengths, tgt_in, tgt = _reverse_data(200, torch.Generator().manual_seed(99))
    with torch.no_grad():
        pred = model(src, lengths, tgt_in).logits.argmax(-1)
    real = tgt != PAD
    return float(((pred == tgt) & real).sum() / real.sum())


@pytest.mark.slow
def test_attention_learns_to_reverse_and_mean_pooling_does_not() -> None:
    # reversing 6-10 symbols (16 kinds), 200 steps, teacher-forced token accuracy on
    # held-out sequences: the attention translator (Luong, general score) reaches 0.85
    # (asserted >= 0.8); the mean baseline, whose context is the same at every step,
    # 0.43 (asserted <= 0.6)
    acc = _train_reverse("general")
    base = _train_reverse("mean")
    assert acc >= 0.8, acc
    assert base <= 0.6, base


def test_bad_flags_and_indices_are_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"^input_feeding must be a bool, got 'no'$"):
        _model(input_feeding="no")
    with pytest.raises(ConfigError, match=r"^eos_idx must be an int or None, got 2\.5$"):
        _model(eos_idx=2.5)
