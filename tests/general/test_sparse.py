"""Tests of the sparse alignments sparsemax and 1.5-entmax (attnlab.general.sparse).

References: the ``entmax`` package (an independent implementation by the method's
authors) and examples worked out by hand. Only the tests that compare against the package
skip when it is missing; the hand examples, gradchecks and properties always run.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

from attnlab.general.sparse import entmax15, sparsemax

F64 = torch.float64
FNS = {"sparsemax": sparsemax, "entmax15": entmax15}
both = pytest.mark.parametrize("name", list(FNS))


def reference(name: str):
    """The ``entmax`` package's function ``name``: the independent reference
    implementation (a dev dependency: pip install -e '.[dev]'). Skips the calling test
    when the package is not installed."""
    entmax = pytest.importorskip("entmax", reason="the reference package entmax is not installed")
    return getattr(entmax, name)


def rand(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=g, dtype=F64)


def ref_masked(name: str, e: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """The reference mapping applied, slice by slice, to the allowed entries only (skips
    the calling test when the package is missing)."""
    ref = reference(name)
    x = e.movedim(dim, -1).reshape(-1, e.shape[dim])
    m = torch.broadcast_to(mask, e.shape).movedim(dim, -1).reshape(-1, e.shape[dim])
    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        allowed = m[r].nonzero().flatten()
        if len(allowed):
            out[r, allowed] = ref(x[r, allowed], dim=-1)
    moved = list(e.movedim(dim, -1).shape)
    return out.reshape(moved).movedim(-1, dim)


# ----------------------------------------------------------------- reference values


@both
@pytest.mark.parametrize("scale", [0.3, 1.0, 5.0])
def test_matches_entmax_package(name, scale):
    fn, ref = FNS[name], reference(name)
    e = rand(3, 4, 7, seed=1, scale=scale)
    for dim in (-1, 0, 1, 2):
        torch.testing.assert_close(fn(e, dim=dim), ref(e, dim=dim))


def test_sparsemax_hand_example():
    # tau = (1 + 0.5 - 1) / 2 = 0.25 over the support {1, 0.5}; -1 - 0.25 < 0
    torch.testing.assert_close(
        sparsemax(torch.tensor([1.0, 0.5, -1.0], dtype=F64)),
        torch.tensor([0.75, 0.25, 0.0], dtype=F64),
    )
    # two equal scores share the mass; one at least 1 above all others takes all of it
    torch.testing.assert_close(
        sparsemax(torch.tensor([2.0, 2.0, 0.0])), torch.tensor([0.5, 0.5, 0.0])
    )
    torch.testing.assert_close(
        sparsemax(torch.tensor([3.0, 1.5, 0.0])), torch.tensor([1.0, 0.0, 0.0])
    )


def test_entmax15_hand_example():
    # z = [1, 0]: p = (z/2 - tau)_+^2 with both in the support: (0.5 + a)^2 + a^2 = 1,
    # a = -tau = (sqrt(7) - 1) / 4, so p = [((sqrt 7 + 1)/4)^2, ((sqrt 7 - 1)/4)^2]
    r7 = math.sqrt(7.0)
    torch.testing.assert_close(
        entmax15(torch.tensor([1.0, 0.0], dtype=F64)),
        torch.tensor([((r7 + 1) / 4) ** 2, ((r7 - 1) / 4) ** 2], dtype=F64),
    )
    # z = [3, 0]: with only the first in the support tau = 1.5 - 1 = 0.5 and 0/2 - 0.5 < 0
    torch.testing.assert_close(entmax15(torch.tensor([3.0, 0.0])), torch.tensor([1.0, 0.0]))


@both
def test_simplex_and_exact_zeros(name):
    fn = FNS[name]
    e = rand(5, 9, seed=2, scale=3.0)
    p = fn(e)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(5, dtype=F64))
    assert (p == 0).sum() > 0  # genuinely sparse
    assert ((p == 0).sum(-1) < 9).all()


@both
def test_shift_invariance_and_large_scores(name):
    # regression: with scores of large magnitude the float32 cumulative sums used to lose
    # the support (sparsemax raised an index error; masked 1.5-entmax summed to 0.5)
    fn = FNS[name]
    base = torch.tensor([0.0, 128.0, -128.0])
    for offset in (0.0, 2.0**20, 2.0**30):
        torch.testing.assert_close(fn(base + offset), torch.tensor([0.0, 1.0, 0.0]))
    e = torch.tensor([2.0**30, 2.0**30 + 256.0, 2.0**30 - 128.0])
    mask = torch.tensor([True, False, True])
    torch.testing.assert_close(fn(e, mask), torch.tensor([1.0, 0.0, 0.0]))
    small = rand(4, 6, seed=3)
    torch.testing.assert_close(fn(small + 1e6), fn(small), atol=1e-8, rtol=1e-6)


# ----------------------------------------------------------------- gradients


@both
def test_gradcheck(name):
    fn = FNS[name]
    e = rand(3, 6, seed=4, scale=2.0).requires_grad_()
    assert gradcheck(fn, (e,))
    assert gradcheck(lambda x: fn(x, dim=0), (e,))
    mask = torch.tensor([[1, 1, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0], [1, 0, 1, 1, 1, 1]]).bool()
    assert gradcheck(lambda x: fn(x, mask), (e,))


@both
def test_gradgradcheck(name):
    """Second derivatives (gradient penalties, Hessian-vector products) are exact, also
    with scores outside the support (weight 0: 1.5-entmax's backward takes sqrt(p), whose
    own derivative is infinite at 0) and masked or fully masked rows."""
    fn = FNS[name]
    e = rand(3, 6, seed=4, scale=2.0).requires_grad_()
    assert (fn(e) == 0).any()  # some scores fall outside the support
    assert gradgradcheck(fn, (e,))
    mask = torch.tensor([[1, 1, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0], [1, 0, 1, 1, 1, 1]]).bool()
    assert gradgradcheck(lambda x: fn(x, mask), (e,))


@both
def test_torch_func_vmap_and_forward_mode(name):
    """The mappings under the torch.func transforms: ``vmap`` over the rows gives the
    batched result; the forward-mode Jacobian (``jacfwd``, through the ``jvp`` formula)
    equals the reverse-mode one (``jacrev``) and a central finite difference, with masked
    entries, scores outside the support and a fully masked row."""
    fn = FNS[name]
    e = rand(3, 6, seed=4, scale=2.0)
    mask = torch.tensor([[1, 1, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0], [1, 0, 1, 1, 1, 1]]).bool()
    assert (fn(e, mask)[mask] == 0).any()  # some allowed scores fall outside the support
    torch.testing.assert_close(torch.func.vmap(fn)(e, mask), fn(e, mask))
    for row, m in zip(e, mask, strict=True):
        fwd = torch.func.jacfwd(lambda x, m=m: fn(x, m))(row)
        rev = torch.func.jacrev(lambda x, m=m: fn(x, m))(row)
        torch.testing.assert_close(fwd, rev)
        h = 1e-6
        cols = [
            (fn(row + h * u, m) - fn(row - h * u, m)) / (2 * h) for u in torch.eye(6, dtype=F64)
        ]
        torch.testing.assert_close(fwd, torch.stack(cols, 1), atol=1e-6, rtol=1e-6)


@both
def test_gradient_matches_entmax_package(name):
    fn, ref = FNS[name], reference(name)
    e1 = rand(4, 7, seed=5, scale=2.0).requires_grad_()
    e2 = e1.detach().clone().requires_grad_()
    g = rand(4, 7, seed=6)
    (fn(e1) * g).sum().backward()
    (ref(e2, dim=-1) * g).sum().backward()
    torch.testing.assert_close(e1.grad, e2.grad)


# ----------------------------------------------------------------- masks


def masked_example() -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``[2, 3, 5]`` (requiring grad) and a mask with a fully masked row ``[1, 2]``."""
    e = rand(2, 3, 5, seed=7, scale=2.0).requires_grad_()
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[0, 0, [1, 3]] = False
    mask[1, 2] = False  # fully masked row
    mask[0, 1, 0] = False
    return e, mask


def feature_axis_example() -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``[2, 3, 5, 4]`` to normalise over axis 2 (the keys) separately for each of
    the 4 features, and a mask ``[2, 3, 5, 1]`` that broadcasts over the features (row
    ``[0, 1]`` fully masked)."""
    e = rand(2, 3, 5, 4, seed=10, scale=2.0)
    mask = rand(2, 3, 5, 1, seed=11) > -0.5
    mask[0, 1] = False
    return e, mask


@both
def test_mask_zeroes_masked_and_fully_masked_rows(name):
    fn = FNS[name]
    e, mask = masked_example()
    e_masked = e.detach().clone()
    e_masked[~mask] = 1e6  # huge scores at masked positions must not matter
    p = fn(e, mask)
    assert (p[~mask] == 0).all()
    assert (p[1, 2] == 0).all()
    torch.testing.assert_close(p.sum(-1)[mask.any(-1)], torch.ones(5, dtype=F64))
    # (the comparison with the entmax package: test_masked_matches_entmax_package)
    torch.testing.assert_close(fn(e_masked, mask), p.detach())
    (p * rand(2, 3, 5, seed=8)).sum().backward()
    assert torch.isfinite(e.grad).all()
    assert (e.grad[~mask] == 0).all() and (e.grad[1, 2] == 0).all()


@both
def test_all_masked_gives_zeros_without_nan(name):
    fn = FNS[name]
    e = rand(2, 4, seed=9).requires_grad_()
    p = fn(e, torch.zeros(2, 4, dtype=torch.bool))
    assert (p == 0).all()
    p.sum().backward()
    assert (e.grad == 0).all()


@both
def test_dim_argument_with_broadcast_mask(name):
    fn = FNS[name]
    e, mask = feature_axis_example()
    p = fn(e, mask, dim=2)
    assert p.shape == e.shape
    # (the comparison with the entmax package: test_masked_matches_entmax_package)
    torch.testing.assert_close(fn(e, mask, dim=-2), p)
    assert (p[0, 1] == 0).all()
    allowed = mask.any(2).expand(2, 3, 4)
    torch.testing.assert_close(p.sum(2)[allowed], torch.ones(int(allowed.sum()), dtype=F64))
    small, small_mask = e[:1, :2, :, :2].clone().requires_grad_(), mask[:1, :2]
    assert gradcheck(lambda x: fn(x, small_mask, dim=2), (small,))


@both
def test_masked_matches_entmax_package(name):
    # the examples of test_mask_zeroes_masked_and_fully_masked_rows and
    # test_dim_argument_with_broadcast_mask against the package, applied to the allowed
    # entries only
    fn = FNS[name]
    e, mask = masked_example()
    torch.testing.assert_close(fn(e, mask), ref_masked(name, e.detach(), mask, -1))
    e, mask = feature_axis_example()
    torch.testing.assert_close(fn(e, mask, dim=2), ref_masked(name, e, mask, 2))


@both
def test_bfloat16_input(name):
    fn = FNS[name]
    e = rand(3, 8, seed=12, scale=2.0)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[1, :3] = False
    eb = e.to(torch.bfloat16).requires_grad_()
    p = fn(eb, mask)
    assert p.dtype == torch.bfloat16
    torch.testing.assert_close(p.float(), fn(eb.detach().float(), mask), atol=1e-2, rtol=0)
    torch.testing.assert_close(p.float().sum(-1), torch.ones(3), atol=2e-2, rtol=0)
    p.sum().backward()
    assert eb.grad.dtype == torch.bfloat16 and torch.isfinite(eb.grad.float()).all()


@both
def test_empty_last_dim(name):
    fn = FNS[name]
    e = torch.zeros(2, 3, 0, dtype=F64, requires_grad=True)
    p = fn(e)
    assert p.shape == (2, 3, 0)
    assert fn(e, torch.zeros(2, 3, 0, dtype=torch.bool)).shape == (2, 3, 0)
    p.sum().backward()
    assert e.grad.shape == (2, 3, 0)


# ----------------------------------------------------------------- bad input


@both
def test_bad_input(name):
    fn = FNS[name]
    e = rand(2, 4, seed=13)
    with pytest.raises(TypeError, match=r"mask has dtype torch\.int64"):
        fn(e, torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 5\)"):
        fn(e, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask has shape \(3, 2, 4\)"):  # would enlarge e
        fn(e, torch.ones(3, 2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"e has dtype torch\.int64"):
        fn(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="dim=2"):
        fn(e, dim=2)


# ----------------------------------------------------------------- property test


@st.composite
def scores_and_mask(draw):
    rows = draw(st.integers(1, 4))
    n = draw(st.integers(1, 7))
    floats = st.floats(-30.0, 30.0, allow_nan=False, allow_subnormal=False)
    e = torch.tensor(draw(st.lists(floats, min_size=rows * n, max_size=rows * n)), dtype=F64)
    bits = draw(st.lists(st.booleans(), min_size=rows * n, max_size=rows * n))
    return e.reshape(rows, n), torch.tensor(bits).reshape(rows, n)


@both
@settings(max_examples=60, deadline=None)
@given(data=scores_and_mask())
def test_property_masked_weights_on_the_simplex(name, data):
    fn = FNS[name]
    e, mask = data
    p = fn(e, mask)
    assert not torch.isnan(p).any()
    assert (p >= 0).all()
    assert (p[~mask] == 0).all()
    expected = mask.any(-1).to(F64)  # 1 where something is allowed, else 0
    torch.testing.assert_close(p.sum(-1), expected)


@both
@settings(max_examples=60, deadline=None)
@given(data=scores_and_mask())
def test_property_masked_weights_match_entmax_package(name, data):
    # examples drawn like those of test_property_masked_weights_on_the_simplex, against the
    # package
    fn = FNS[name]
    e, mask = data
    torch.testing.assert_close(fn(e, mask), ref_masked(name, e, mask, -1))
