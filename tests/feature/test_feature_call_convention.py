"""The call convention of the feature-related modules (issue 15): every mechanism is called
``forward(query, key=None, value=None, *, mask=None, need_weights=False, ...)``, returns an
``AttentionOutput`` (or its documented subclass), and still takes its old call form for one
release with a ``DeprecationWarning`` and the same numbers.

The generic checks (output type and shapes, need_weights keeps the context, weights only
when asked, masked keys get zero weight, gradients reach every input and parameter, a wrong
dtype names the argument, the rebuild from the config) come from the shared harness
``tests/attention_harness.py``; the mechanism-specific tests stay in the other files here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from attention_harness import (
    Inputs,
    check_fully_masked_row,
    check_gradients,
    check_masked_keys_zero,
    check_need_weights_keeps_context,
    check_output,
    check_rebuild_same_output,
    check_weights_none_unless_asked,
    check_wrong_dtype,
)
from torch import Tensor, nn

import attnlab
import attnlab.feature
from attnlab import registry
from attnlab.feature import (
    CDME,
    DME,
    AlternatingCoAttention,
    AttentionViaAttention,
    CoAttentionOutput,
    HierarchicalAttention,
    InteractiveCoAttention,
    LCRRotHop,
    MultiGrainedCoAttention,
    ParallelCoAttention,
    RotatoryAttention,
    RotatoryOutput,
)
from attnlab.output import AttentionOutput

# ----------------------------------------------------------------------------- the cases


@dataclass
class Case:
    """One module with a call in the new convention, what the harness needs to check it,
    and the same call in the deprecated form."""

    module: nn.Module
    inputs: Inputs
    context_shape: tuple[int, ...]
    output_type: type
    key_mask: Tensor  # the mask as the weights see it
    weights_of: Callable[[Any], Tensor]
    weights_shape: tuple[int, ...] | None
    dtype_name: str | None  # the name a wrong-dtype message uses (None: checked apart)
    old_args: tuple[Any, ...]
    old_kwargs: dict[str, Any]
    old_warning: str


def _seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _co(cls: type, fine: bool = False) -> Case:
    torch.manual_seed(0)
    g = _seeded()
    f1, f2 = torch.randn(2, 3, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    m1 = torch.tensor([[True, True, True], [True, True, False]])
    m2 = torch.tensor([[True, True, True, False, False], [True] * 5])
    module = cls(4, 4)
    n = 3 + 5
    mask = torch.cat([m1, m2], -1)
    return Case(
        module,
        Inputs((f1, f2), {"mask1": m1, "mask2": m2}, names=("query", "key")),
        (2, 16 if fine else 8),
        CoAttentionOutput,
        torch.cat([mask, mask], -1) if fine else mask,
        lambda o: o.weights,
        (2, 2 * n if fine else n),
        "f1",
        (f1, f2, m1, m2),
        {},
        "passing masks positionally",
    )


def _rotatory(cls: type) -> Case:
    torch.manual_seed(0)
    g = _seeded()
    left, target, right = (torch.randn(2, n, 4, generator=g) for n in (3, 2, 4))
    lm = torch.tensor([[True, True, True], [False, False, False]])
    tm = torch.tensor([[True, True], [True, False]])
    rm = torch.tensor([[True, True, False, False], [True] * 4])
    module = cls(4)
    order = ("left", "right", "target_left", "target_right")
    return Case(
        module,
        Inputs((left, target, right), {"left_mask": lm, "target_mask": tm, "right_mask": rm}),
        (2, 16),
        RotatoryOutput,
        torch.cat([lm, rm, tm, tm], -1),
        lambda o: torch.cat([o.weights[k] for k in order], -1),
        None,
        "left",
        (left, target, right, lm, tm, rm),
        {},
        "passing masks positionally",
    )


def _han() -> Case:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, generator=_seeded())
    mask = torch.rand(2, 3, 4, generator=_seeded(1)) > 0.3
    mask[1, 2] = False  # an empty sentence
    module = HierarchicalAttention(5, levels=2, encoder="bigru", encoder_hidden=3)
    return Case(
        module,
        Inputs((x,), {"mask": mask}, names=("query",)),
        (2, 6),
        AttentionOutput,
        mask,
        lambda o: o.weights[0],
        None,
        "x",
        (x, mask),
        {},
        "passing masks positionally",
    )


def _ava() -> Case:
    torch.manual_seed(0)
    g = _seeded()
    q, chars = torch.randn(2, 3, generator=g), torch.randn(2, 7, 4, generator=g)
    words = torch.randn(2, 3, 4, generator=g)
    cm = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    wm = torch.tensor([[True] * 3, [True, True, False]])
    offsets = torch.tensor([[0, 2, 5], [0, 3, 0]])
    module = AttentionViaAttention(3, 4, d_w=5)
    extra = {"word_mask": wm, "word_offsets": offsets}
    return Case(
        module,
        Inputs((q, chars, words), {"mask": cm, **extra}),
        (2, 8),
        AttentionOutput,
        cm,
        lambda o: o.weights,
        (2, 7),
        "q",
        (),
        {"q": q, "chars": chars, "words": words, "char_mask": cm, **extra},
        "q=, chars=, words=, char_mask= are deprecated",
    )


def _meta(cls: type) -> Case:
    torch.manual_seed(0)
    ids = torch.tensor([[1, 4, -1, 2], [3, 0, 9, 5]])
    vec = torch.randn(2, 4, 3, generator=_seeded())
    tm = torch.tensor([[True, True, True, False], [True] * 4])
    module = cls([(10, 4), 3], d_proj=5)
    avail = torch.stack([(ids != -1) & tm, tm], -1)
    return Case(
        module,
        Inputs(([ids, vec],), {"mask": tm}, names=("query",)),
        (2, 4, 5),
        AttentionOutput,
        avail,
        lambda o: o.weights,
        (2, 4, 2),
        None,
        (),
        {"inputs": [ids, vec], "token_mask": tm},
        "inputs=, token_mask= are deprecated.*use query=, mask=",
    )


CASES: dict[str, Callable[[], Case]] = {
    "alternating": lambda: _co(AlternatingCoAttention),
    "interactive": lambda: _co(InteractiveCoAttention),
    "parallel": lambda: _co(ParallelCoAttention),
    "multi-grained": lambda: _co(MultiGrainedCoAttention, fine=True),
    "rotatory": lambda: _rotatory(RotatoryAttention),
    "lcr-rot-hop": lambda: _rotatory(LCRRotHop),
    "hierarchical": _han,
    "attention-via-attention": _ava,
    "dme": lambda: _meta(DME),
    "cdme": lambda: _meta(CDME),
}


# ----------------------------------------------------------------------------- the harness


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_type_and_shapes(name):
    c = CASES[name]()
    out = check_output(
        c.module,
        c.inputs,
        context_shape=c.context_shape,
        weights_shape=c.weights_shape,
        output_type=c.output_type,
    )
    assert isinstance(out, AttentionOutput)


@pytest.mark.parametrize("name", sorted(CASES))
def test_need_weights_keeps_context_and_weights_only_when_asked(name):
    c = CASES[name]()
    check_need_weights_keeps_context(c.module, c.inputs, atol=0.0, rtol=0.0)
    check_weights_none_unless_asked(c.module, c.inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_masked_positions_get_zero_weight(name):
    c = CASES[name]()
    check_masked_keys_zero(c.module, c.inputs, c.key_mask, weights_of=c.weights_of)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_reach_inputs_and_parameters(name):
    c = CASES[name]()
    check_gradients(c.module, c.inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rebuild_from_config(name):
    c = CASES[name]()
    check_rebuild_same_output(c.module, c.inputs)


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n]().dtype_name))
def test_wrong_dtype_names_the_argument(name):
    c = CASES[name]()
    check_wrong_dtype(c.module, c.inputs, 0, name=c.dtype_name)


def test_meta_embedding_wrong_dtype_names_the_argument():
    c = CASES["dme"]()
    ids, vec = c.inputs.args[0]
    with pytest.raises(TypeError, match=r"inputs\[1\] gives dtype torch\.float64"):
        c.module([ids, vec.double()], mask=c.inputs.kwargs["mask"])


# ----------------------------------------------------------------------------- deprecation


@pytest.mark.parametrize("name", sorted(CASES))
def test_old_call_warns_and_gives_the_same_numbers(name):
    c = CASES[name]()
    c.module.eval()
    with torch.no_grad():
        new = c.module(*c.inputs.args, **c.inputs.kwargs, need_weights=True)
        with pytest.warns(DeprecationWarning, match=c.old_warning) as record:
            old = c.module(*c.old_args, **c.old_kwargs, need_weights=True)
    assert torch.equal(new.context, old.context)
    assert torch.equal(c.weights_of(new), c.weights_of(old))
    # the warning points at the caller's line, not at attnlab or torch internals
    assert all(w.filename == __file__ for w in record), [w.filename for w in record]


def test_old_keyword_names_of_two_input_modules():
    c = CASES["parallel"]()
    f1, f2 = c.inputs.args
    m1, m2 = c.inputs.kwargs["mask1"], c.inputs.kwargs["mask2"]
    new = c.module(f1, f2, mask1=m1, mask2=m2)
    with pytest.warns(DeprecationWarning, match=r"f1=, f2= are deprecated.*use query=, key="):
        old = c.module(f1=f1, f2=f2, mask1=m1, mask2=m2)
    assert torch.equal(new.output, old.output) and torch.equal(new.a1, old.a1)
    with pytest.warns(DeprecationWarning, match="passing masks positionally"):
        half = c.module(f1, f2, None, m2)  # the old form with only the second mask
    assert torch.equal(half.context, c.module(f1, f2, mask2=m2).context)


def test_old_keyword_names_of_rotatory_and_hierarchical():
    c = CASES["lcr-rot-hop"]()
    left, target, right = c.inputs.args
    new = c.module(left, target, right, **c.inputs.kwargs)
    with pytest.warns(
        DeprecationWarning, match=r"left=, target=, right= are deprecated.*use query=, key=, value="
    ):
        old = c.module(left=left, target=target, right=right, **c.inputs.kwargs)
    assert torch.equal(new.output, old.output)
    h = CASES["hierarchical"]()
    (x,) = h.inputs.args
    with pytest.warns(DeprecationWarning, match=r"x= is deprecated"):
        old = h.module(x=x, mask=h.inputs.kwargs["mask"])
    assert torch.equal(old.context, h.module(x, mask=h.inputs.kwargs["mask"]).context)


def test_misuse_of_the_convention_is_a_clear_type_error():
    c = CASES["interactive"]()
    f1, f2 = c.inputs.args
    m1 = c.inputs.kwargs["mask1"]
    with pytest.raises(TypeError, match=r"takes no mask: give one mask per input, mask1="):
        c.module(f1, f2, mask=m1)
    with pytest.raises(TypeError, match=r"takes no value: the features are their own values"):
        c.module(f1, f2, f2)
    with pytest.raises(TypeError, match=r"got both query= and its deprecated name f1="):
        c.module(f1, f2, f1=f1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bogus'"):
        c.module(f1, f2, bogus=1)
    with pytest.raises(TypeError, match=r"needs both inputs"):
        c.module(f1)
    with pytest.raises(TypeError, match=r"at most 2 masks"):
        c.module(f1, f2, m1, m1, m1)
    r = CASES["rotatory"]()
    with pytest.raises(TypeError, match=r"takes no mask: give one mask per part"):
        r.module(*r.inputs.args, mask=r.inputs.kwargs["left_mask"])
    with pytest.raises(TypeError, match=r"needs the three parts"):
        r.module(*r.inputs.args[:2])
    h = CASES["hierarchical"]()
    with pytest.raises(TypeError, match=r"takes no value"):
        h.module(h.inputs.args[0], None, h.inputs.args[0])
    d = CASES["dme"]()
    with pytest.raises(TypeError, match=r"takes no key"):
        d.module(d.inputs.args[0], d.inputs.args[0][1])


# ----------------------------------------------------------------------------- exports


def test_every_feature_mechanism_is_exported_by_its_section_package():
    entries = registry.entries("feature")
    assert entries
    for entry in entries:
        name = entry.cls.__name__
        assert name in attnlab.feature.__all__, name
        assert getattr(attnlab.feature, name) is entry.cls
    assert sorted(attnlab.feature.__all__) == sorted(set(attnlab.feature.__all__))
    for name in attnlab.feature.__all__:
        assert hasattr(attnlab.feature, name), name


# the input that leaves a row with nothing to attend to, the weights to look at, the row
EMPTY_ROWS: dict[str, Callable[[Case], tuple[Inputs, Callable[[Any], Tensor], tuple]]] = {
    "co-attention": lambda c: (
        c.inputs.with_arg("mask2", torch.zeros_like(c.inputs.kwargs["mask2"])),
        lambda o: o.a2,
        (0,),
    ),
    "rotatory": lambda c: (c.inputs, lambda o: o.weights["left"], (1,)),
    "hierarchical": lambda c: (c.inputs, lambda o: o.weights[0], (1, 2)),
    "attention-via-attention": lambda c: (
        c.inputs.with_arg("mask", torch.zeros_like(c.inputs.kwargs["mask"])),
        lambda o: o.weights,
        (1,),
    ),
    "meta": lambda c: (c.inputs, lambda o: o.weights, (0, 3)),
}
_FAMILY = {
    "alternating": "co-attention",
    "interactive": "co-attention",
    "parallel": "co-attention",
    "multi-grained": "co-attention",
    "rotatory": "rotatory",
    "lcr-rot-hop": "rotatory",
    "hierarchical": "hierarchical",
    "attention-via-attention": "attention-via-attention",
    "dme": "meta",
    "cdme": "meta",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_row_with_nothing_to_attend_gets_zero_weights_and_finite_grads(name):
    c = CASES[name]()
    inputs, weights_of, row = EMPTY_ROWS[_FAMILY[name]](c)
    check_fully_masked_row(c.module, inputs, row, weights_of=weights_of)
