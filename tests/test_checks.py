"""Tests for attnlab._checks.check_module_dtype and its use by every query- and
feature-related module with parameters: a float64 input to a float32 module is refused
with one line that names the argument, both dtypes and the fix, not PyTorch's
``mat1 and mat2 must have the same dtype`` from deep inside a matmul."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab import registry
from attnlab._checks import (
    ConfigError,
    check_callable,
    check_device,
    check_int,
    check_module_dtype,
    check_number,
    check_optional_int,
    check_path,
    check_seed,
)
from attnlab.feature.co_attention import (
    AlternatingCoAttention,
    InteractiveCoAttention,
    MultiGrainedCoAttention,
    ParallelCoAttention,
)
from attnlab.feature.meta_embedding import CDME, DME
from attnlab.feature.multilevel import AttentionViaAttention, HierarchicalAttention
from attnlab.feature.rotatory import LCRRotHop, RotatoryAttention
from attnlab.query.attention_over_attention import AttentionOverAttention
from attnlab.query.capsule import CapsuleAttention, CapsuleRouting
from attnlab.query.graph import GraphAttention
from attnlab.query.key_value import ConcatenatedKeyValueAttention, KeyValueAttention
from attnlab.query.linformer import LinformerAttention
from attnlab.query.multi_head import MultiHeadAttention
from attnlab.query.multi_hop import MultiHopAttention
from attnlab.query.pointer import PointerNetwork
from attnlab.query.positional import LearnedPositions, RelativePositionAttention, RotaryPositions
from attnlab.query.reformer import LSHAttention
from attnlab.query.self_attention import (
    ConstantQuerySelfAttention,
    LearnedQuerySelfAttention,
    RelationalSelfAttention,
)
from attnlab.query.synthesizer import SynthesizerAttention
from attnlab.query.transformer import TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.query.transformer_xl import TransformerXLAttention

B, N, D = 2, 5, 8

#: registered query/feature mechanisms without parameters: they accept any float dtype
PARAMETER_FREE = {"sinusoidal-positions", "rotary-positions"}


def _inputs(dtype: torch.dtype) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    # characters 0-1 -> word 0, 2-3 -> word 1, 4 -> word 2; as [B, n_w, n_c]
    char_to_word = torch.eye(3, dtype=torch.bool)[[0, 0, 1, 1, 2]].T.expand(B, 3, N)
    return {"r": r, "char_to_word": char_to_word}


# name -> (registry name, builder, call(module, inputs), the argument the error must name)
Case = tuple[str, Callable[[], nn.Module], Callable[[nn.Module, dict[str, Any]], Any], str]
CASES: dict[str, Case] = {
    "attention-over-attention": (
        "attention-over-attention",
        lambda: AttentionOverAttention(D, D, score="general"),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 3, D)),
        "document",
    ),
    "capsule": (
        "capsule",
        lambda: CapsuleAttention(D, 3),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "capsule-routing": (
        "capsule-routing",
        lambda: CapsuleRouting(D, 3),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "key-value": (
        "key-value",
        lambda: KeyValueAttention(D, D, D, score="general"),
        lambda m, i: m(i["r"](B, 2, D), i["r"](B, N, D), i["r"](B, N, D)),
        "key",
    ),
    "concatenated-key-value": (
        "concatenated-key-value",
        lambda: ConcatenatedKeyValueAttention(D, D, D, num_queries=2, score="general"),
        lambda m, i: m(i["r"](B, 2, D), i["r"](B, N, D), i["r"](B, N, D)),
        "key",
    ),
    "linformer": (
        "linformer",
        lambda: LinformerAttention(D, 2, max_len=N, proj_len=3),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "multi-head": (
        "multi-head",
        lambda: MultiHeadAttention(D, 2),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "multi-head-cross-general": (
        "multi-head",
        lambda: MultiHeadAttention(D, 2, d_k=6, d_v=6, score="general"),
        lambda m, i: m(i["r"](B, 3, D), i["r"](B, N, 6)),
        "query",
    ),
    "multi-head-grouped-additive": (
        "multi-head",
        lambda: MultiHeadAttention(D, 4, num_kv_heads=2, score="additive"),
        lambda m, i: m(i["r"](B, N, D), causal=True),
        "query",
    ),
    "multi-head-no-bias": (
        "multi-head",
        lambda: MultiHeadAttention(D, 2, bias=False, head_dim=3, out_dim=5),
        lambda m, i: m(i["r"](B, N, D), need_weights=True),
        "query",
    ),
    "multi-hop": (
        "multi-hop",
        lambda: MultiHopAttention(D, D),
        lambda m, i: m(i["r"](B, D), i["r"](B, N, D)),
        "key",
    ),
    "pointer-network": (
        "pointer-network",
        lambda: PointerNetwork(D, 8),
        lambda m, i: m(i["r"](B, N, D), torch.arange(N).repeat(B, 1)),
        "x",
    ),
    "learned-positions": (
        "learned-positions",
        lambda: LearnedPositions(N, D),
        lambda m, i: m(i["r"](B, N, D)),
        "x",
    ),
    "relative-positions": (
        "relative-positions",
        lambda: RelativePositionAttention(D, 2),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "reformer": (
        "reformer",
        lambda: LSHAttention(D, 2, bucket_size=2),
        lambda m, i: m(i["r"](B, 4, D)),
        "query",
    ),
    "constant-query-self-attention": (
        "constant-query-self-attention",
        lambda: ConstantQuerySelfAttention(D),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "learned-query-self-attention": (
        "learned-query-self-attention",
        lambda: LearnedQuerySelfAttention(D),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "relational-self-attention": (
        "relational-self-attention",
        lambda: RelationalSelfAttention(D),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "synthesizer": (
        "synthesizer",
        lambda: SynthesizerAttention(D, 2, max_len=N),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "transformer-encoder-layer": (
        "transformer-encoder-layer",
        lambda: TransformerEncoderLayer(D, 2, dim_feedforward=8, dropout=0.0),
        lambda m, i: m(i["r"](B, N, D)),
        "src",
    ),
    "transformer-encoder-layer-norm-first": (
        "transformer-encoder-layer",
        lambda: TransformerEncoderLayer(D, 2, dim_feedforward=8, dropout=0.0, norm_first=True),
        lambda m, i: m(i["r"](B, N, D)),
        "src",
    ),
    "transformer-decoder-layer": (
        "transformer-decoder-layer",
        lambda: TransformerDecoderLayer(D, 2, dim_feedforward=8, dropout=0.0),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 3, D)),
        "tgt",
    ),
    "transformer-xl": (
        "transformer-xl",
        lambda: TransformerXLAttention(D, 2),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
    "alternating-co-attention": (
        "alternating-co-attention",
        lambda: AlternatingCoAttention(D, 6),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 3, 6)),
        "f1",
    ),
    "interactive-co-attention": (
        "interactive-co-attention",
        lambda: InteractiveCoAttention(D, 6),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 3, 6)),
        "f1",
    ),
    "parallel-co-attention": (
        "parallel-co-attention",
        lambda: ParallelCoAttention(D, 6),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 3, 6)),
        "f1",
    ),
    "parallel-co-attention-max": (
        "parallel-co-attention",
        lambda: ParallelCoAttention(D, D, affinity="concat", scores="max"),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 3, D)),
        "f1",
    ),
    "multi-grained-co-attention": (
        "multi-grained-co-attention",
        lambda: MultiGrainedCoAttention(D, 6, affinity="bilinear"),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 3, 6)),
        "f1",
    ),
    "hierarchical-attention": (
        "hierarchical-attention",
        lambda: HierarchicalAttention(D),
        lambda m, i: m(i["r"](B, 3, N, D)),
        "x",
    ),
    "attention-via-attention": (
        "attention-via-attention",
        lambda: AttentionViaAttention(D, 6, 6),
        lambda m, i: m(
            i["r"](B, D), i["r"](B, N, 6), i["r"](B, 3, 6), char_to_word=i["char_to_word"]
        ),
        "q",
    ),
    "dme": (
        "dme",
        lambda: DME([D, 6], 4),
        lambda m, i: m([i["r"](B, N, D), i["r"](B, N, 6)]),
        "inputs[0]",
    ),
    "cdme": (
        "cdme",
        lambda: CDME([D, 6], 4),
        lambda m, i: m([i["r"](B, N, D), i["r"](B, N, 6)]),
        "inputs[0]",
    ),
    "lcr-rot-hop": (
        "lcr-rot-hop",
        lambda: LCRRotHop(D),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 2, D), i["r"](B, 3, D)),
        "left",
    ),
    "rotatory": (
        "rotatory",
        lambda: RotatoryAttention(D),
        lambda m, i: m(i["r"](B, N, D), i["r"](B, 2, D), i["r"](B, 3, D)),
        "left",
    ),
    "graph-attention": (
        "graph-attention",
        lambda: GraphAttention(D, 2),
        lambda m, i: m(i["r"](B, N, D), mask=torch.eye(N, dtype=torch.bool)),
        "query",
    ),
    "graph-attention-v2": (
        "graph-attention",
        lambda: GraphAttention(D, 2, version="v2", concat=False),
        lambda m, i: m(i["r"](B, N, D)),
        "query",
    ),
}


def test_every_query_and_feature_mechanism_with_parameters_is_covered():
    registered = {e.name for kind in ("query", "feature") for e in registry.entries(kind)}
    covered = {case[0] for case in CASES.values()}
    assert registered - PARAMETER_FREE == covered


@pytest.mark.parametrize("case", sorted(CASES))
def test_float64_input_to_float32_module_names_the_argument_and_the_fix(case):
    _, build, call, arg = CASES[case]
    torch.manual_seed(0)
    module = build()
    assert next(module.parameters()).dtype == torch.float32
    with pytest.raises(TypeError) as err:
        call(module, _inputs(torch.float64))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{arg} has dtype torch.float64 but the parameters of ")
    assert type(module).__name__ in msg
    assert "have dtype torch.float32" in msg
    assert f"{arg}.to(torch.float32)" in msg
    assert "module.to(torch.float64)" in msg
    # both fixes it names work
    call(module, _inputs(torch.float32))
    call(module.to(torch.float64), _inputs(torch.float64))


@pytest.mark.parametrize(
    "case", ["multi-head", "transformer-encoder-layer", "parallel-co-attention"]
)
def test_mixed_dtypes_stay_allowed_under_autocast(case):
    """Under autocast a bfloat16 activation meets float32 parameters by design."""
    _, build, call, _ = CASES[case]
    torch.manual_seed(0)
    module = build()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        call(module, _inputs(torch.bfloat16))


def test_check_module_dtype_accepts_anything_without_float_parameters():
    check_module_dtype(nn.Identity(), torch.zeros(2, dtype=torch.float64), "x")
    check_module_dtype(nn.ReLU(), torch.zeros(2, dtype=torch.float16), "x")


def test_check_module_dtype_reports_the_device():
    module = nn.Linear(2, 2, device="meta")
    with pytest.raises(ValueError) as err:
        check_module_dtype(module, torch.zeros(1, 2), "x")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("x is on cpu but the parameters of Linear are on meta")
    assert "x.to('meta')" in msg and "module.to('cpu')" in msg


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_parameter_checked_is_the_first_floating_one_of_the_walk(name):
    # the fast walk finds what next(p for p in module.parameters() if float) finds
    from attnlab._checks import _first_float_parameter

    torch.manual_seed(0)
    module = CASES[name][1]()
    want = next((p for p in module.parameters() if p.is_floating_point()), None)
    assert _first_float_parameter(module) is want


def test_the_first_floating_parameter_skips_integer_and_absent_ones():
    from attnlab._checks import _first_float_parameter

    outer = nn.Module()
    outer.register_parameter("none", None)
    outer.count = nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)
    outer.empty = nn.Identity()
    outer.inner = nn.Sequential(nn.ReLU(), nn.Linear(2, 2))
    assert _first_float_parameter(outer) is outer.inner[1].weight
    assert _first_float_parameter(nn.ReLU()) is None


def test_check_module_dtype_passes_a_matching_input():
    check_module_dtype(nn.Linear(2, 2).double(), torch.zeros(1, 2, dtype=torch.float64), "x")


def test_check_same_allows_mixed_dtypes_only_under_autocast():
    """Under autocast an encoder's bfloat16 output meets a float32 query (the lab's
    --precision bf16); outside it a mixed pair is still refused."""
    from attnlab._checks import check_same

    k = torch.zeros(2, 3, dtype=torch.bfloat16)
    q = torch.zeros(2, 3)
    with pytest.raises(TypeError, match=r"q has dtype torch\.float32 but k has dtype"):
        check_same(k, "k", q=q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check_same(k, "k", q=q)
    with pytest.raises(ValueError, match="is on meta"):
        check_same(k, "k", q=torch.zeros(2, 3, dtype=torch.bfloat16, device="meta"))


# ----------------------------------------------------------------------------- check_int


def test_check_int_takes_numpy_integers_as_ints():
    """A size read from an array (``np.int64``) is an int, returned as a Python int (it
    was refused, while check_seed took it); NumPy bools and floats are still refused."""
    import numpy as np

    import attnlab

    assert check_int(np.int64(8), "d") == 8 and type(check_int(np.int32(3), "d")) is int
    for bad in (np.bool_(True), np.float64(3.0), np.int64(0)):
        with pytest.raises(ConfigError, match="must be an int >= 1"):
            check_int(bad, "d")
    module = attnlab.MultiHeadAttention(np.int64(8), np.int64(2))
    assert module(torch.randn(2, 5, 8)).context.shape == (2, 5, 8)


def test_check_int_message_and_wording():
    assert check_int(3, "n") == 3
    with pytest.raises(ConfigError, match=r"^num_heads must be an int >= 1, got 0$"):
        check_int(0, "num_heads")
    with pytest.raises(ValueError, match=r"^Co: d1 must be a positive int, got True$"):
        check_int(True, "d1", owner="Co", wording="a positive int", error=ValueError)
    with pytest.raises(TypeError, match=r"^k must be an int >= 2, got 1\.5$"):
        check_int(1.5, "k", 2, error=TypeError)


@pytest.mark.parametrize("value", ["yes", "no", 1])
def test_call_switches_must_be_bools(value):
    # a truthy string used to switch need_weights / causal on ("no" included)
    x = torch.randn(2, 3, D)
    calls = [
        ("need_weights", lambda: attnlab.Attention("dot")(x, x, need_weights=value)),
        ("need_weights", lambda: KeyValueAttention(D, D, D)(x, x, x, need_weights=value)),
        ("causal", lambda: MultiHeadAttention(D, 2)(x, causal=value)),
        ("average_weights", lambda: MultiHeadAttention(D, 2)(x, average_weights=value)),
    ]
    for name, call in calls:
        with pytest.raises(TypeError, match=rf"^{name} must be a bool, got {value!r}$"):
            call()
    # None is the convention's "the module's default" (need_weights_default), not the
    # general module's
    assert KeyValueAttention(D, D, D)(x, x, x, need_weights=None).weights is None
    with pytest.raises(TypeError, match=r"^need_weights must be a bool, got None$"):
        attnlab.Attention("dot")(x, x, need_weights=None)


def test_check_dropout_is_the_one_dropout_check():
    import numpy as np

    from attnlab._checks import check_dropout
    from attnlab.models import _inputs
    from attnlab.query import efficient

    assert check_dropout(0) == 0.0 and type(check_dropout(0)) is float
    assert check_dropout(np.float32(0.25)) == 0.25
    for bad in (1.0, -0.1, float("nan"), True, "0.1", None):
        with pytest.raises(ConfigError, match=r"^dropout must be in \[0, 1\), got "):
            check_dropout(bad)
    assert efficient.check_dropout is check_dropout and _inputs.check_dropout is check_dropout
    for build in (  # the modules that had their own copy of the check
        lambda: attnlab.Attention(dropout=1.0),
        lambda: attnlab.SinusoidalPositions(8, dropout=1.0),
        lambda: attnlab.LearnedPositions(4, 8, dropout="0.1"),
    ):
        with pytest.raises(ConfigError, match=r"^dropout must be in \[0, 1\)"):
            build()


def test_check_choice_names_every_choice():
    from attnlab._checks import check_choice
    from attnlab.models import _inputs

    assert check_choice("dot", "score", ("dot", "additive")) == "dot"
    assert check_choice(None, "loss", (None, "bce")) is None
    with pytest.raises(ConfigError, match=r"^score must be 'dot' or 'additive', got 'x'$"):
        check_choice("x", "score", ("dot", "additive"))
    with pytest.raises(ConfigError, match=r"^mode must be one of 'a', 'b', 'c', got 3$"):
        check_choice(3, "mode", iter("abc"))  # any iterable
    assert _inputs.check_choice is check_choice  # the models' checks are the same one


def test_check_positive_is_the_one_check_of_a_positive_number():
    import math

    import numpy as np

    from attnlab._checks import check_positive
    from attnlab.evaluation import explanation, image_quality, vqa_correctness
    from attnlab.general import alignment, scoring

    assert check_positive(2, "tau") == 2.0 and type(check_positive(2, "tau")) is float
    assert check_positive(np.float32(0.5), "tau") == 0.5
    for bad in (0, -1.0, math.nan, math.inf, -math.inf, True, "1", None, 10**400):
        with pytest.raises(ConfigError) as caught:
            check_positive(bad, "tau")
        assert str(caught.value) == f"tau must be a finite number > 0, got {bad!r}"
    with pytest.raises(ValueError, match=r"^alpha must be") as caught:
        check_positive(0, "alpha", error=ValueError)
    assert type(caught.value) is ValueError
    # every user calls this one function (their own inline tests let inf, or NaN, through)
    for module in (explanation, image_quality, vqa_correctness, alignment, scoring):
        assert module.check_positive is check_positive
    for make in (
        lambda: scoring.CosineScore(temperature=math.inf),
        lambda: alignment.HardAlign(tau=math.inf),
        lambda: alignment.gumbel_softmax_align(torch.zeros(1, 2), tau=math.nan),
        lambda: vqa_correctness.check_alpha(math.inf),
    ):
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            make()


def test_check_callable_names_the_argument_and_the_type():
    check_callable(print, "hook")
    check_callable(lambda: None, "hook")
    for bad, kind in ((3, "int"), ("print", "str"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"^hook must be callable, got {kind}$"):
            check_callable(bad, "hook")


def test_check_device_takes_devices_and_their_names_whatever_this_machine_has():
    cuda = torch.device("cuda", 1)
    assert check_device(cuda) is cuda
    assert check_device("cuda:1") == cuda and check_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^plan device 'gpu' is not a device name"):
        check_device("gpu", "plan device")
    for bad in (0, None, ["cpu"]):
        with pytest.raises(TypeError, match=r"^device must be a torch.device or its name, got"):
            check_device(bad)


def test_check_path_refuses_empty_text_and_what_is_no_path(tmp_path):
    assert check_path("runs/x", "out") == Path("runs/x")
    assert check_path(tmp_path, "out") == tmp_path
    assert check_path("~/x", "out") == Path.home() / "x"
    for empty in ("", "   "):  # an unset shell variable: Path("") is the working folder
        with pytest.raises(ConfigError, match=r"^out must not be empty \(it would be the working"):
            check_path(empty, "out")
    for bad, kind in ((3, "int"), (None, "NoneType"), (b"runs", "bytes")):
        with pytest.raises(
            TypeError, match=rf"^out_dir must be a path \(a str or os\.PathLike\), got {kind}$"
        ):
            check_path(bad, "out_dir")


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        (
            float("nan"),
            {"low": 0, "high": 4, "open_high": True},
            "x must be a number in [0, 4), got nan",
        ),
        (4, {"low": 0, "high": 4, "open_high": True}, "x must be a number in [0, 4), got 4"),
        (0, {"low": 0, "high": 1, "open_low": True}, "x must be a number in (0, 1], got 0"),
        (-1, {"low": 0}, "x must be a number >= 0, got -1"),
        (0, {"low": 0, "open_low": True}, "x must be a number > 0, got 0"),
        (2, {"high": 1}, "x must be a number <= 1, got 2"),
        (float("inf"), {}, "x must be a finite number, got inf"),
        (10**400, {}, f"x must be a finite number, got {10**400}"),  # OverflowError once
        (True, {}, "x must be a finite number, got True"),
        ("0.5", {"low": 0}, "x must be a number >= 0, got '0.5'"),
    ],
)
def test_check_number_refuses_with_its_range(value, bounds, message):
    with pytest.raises(ConfigError) as caught:
        check_number(value, "x", **bounds)
    assert str(caught.value) == message
    with pytest.raises(KeyError):  # the error type is the caller's
        check_number(value, "x", error=KeyError, **bounds)


def test_check_number_returns_floats_on_the_bounds():
    assert check_number(0, "x", low=0, high=1) == 0.0
    assert check_number(1, "x", low=0, high=1) == 1.0
    assert check_number(np.float32(0.5), "x", low=0, high=1, open_low=True, open_high=True) == 0.5


def test_check_seed_takes_python_and_numpy_ints_only():
    assert check_seed(3) == 3 and check_seed(np.int64(4)) == 4 and check_seed(-2) == -2
    for bad in (1.5, True, "1", None):
        with pytest.raises(TypeError, match=rf"^seed must be an int, got {re.escape(repr(bad))}$"):
            check_seed(bad)
    with pytest.raises(ConfigError, match=r"^run seed must be an int"):
        check_seed(1.0, "run seed", error=ConfigError)
    with pytest.raises(ValueError, match=r"^seed must be an int >= 0, got -1$") as caught:
        check_seed(-1, minimum=0)
    assert type(caught.value) is ValueError  # a TypeError for the type, not for the range
    # a ValueError kind asked for (ConfigError: the CLI's one-line errors) is kept
    with pytest.raises(ConfigError, match=r"^run seed must be an int >= 0, got -1$"):
        check_seed(-1, "run seed", minimum=0, error=ConfigError)


@pytest.mark.parametrize(
    ("build", "flag"),
    [
        (lambda v: LSHAttention(8, 2, restrict_to_bucket=v), "restrict_to_bucket"),
        (lambda v: RotaryPositions(4, interleaved=v), "interleaved"),
        (lambda v: RelativePositionAttention(8, 2, share_heads=v), "share_heads"),
        (lambda v: SynthesizerAttention(8, 2, max_len=5, mix_dot=v), "mix_dot"),
        (lambda v: TransformerEncoderLayer(8, 2, norm_first=v), "norm_first"),
        (lambda v: ConcatenatedKeyValueAttention(4, 4, 4, num_queries=2, concat=v), "concat"),
    ],
)
def test_a_switch_of_a_module_must_be_a_bool(build, flag):
    """``bool("no")`` is True: a switch given as text used to turn the option on."""
    build(True)
    build(False)
    for bad in ("no", 1, None):
        with pytest.raises(TypeError, match=rf"^{flag} must be a bool, got {bad!r}$"):
            build(bad)


def test_check_optional_int_passes_none_and_checks_the_rest() -> None:
    assert check_optional_int(None, "d_v") is None
    assert check_optional_int(0, "n_k", minimum=0) == 0
    with pytest.raises(ConfigError, match=r"^d_v must be an int >= 1 or None, got 2\.5$"):
        check_optional_int(2.5, "d_v")
    with pytest.raises(ValueError, match=r"^Att: d_v must be a positive int, got True$"):
        check_optional_int(True, "d_v", owner="Att", wording="a positive int", error=ValueError)


def test_is_traced_in_eager_mode_under_torch_func_and_under_compile() -> None:
    """``is_traced`` (no host read, no data-dependent branch) is False in eager mode and
    True inside every torch.func transform, forward-mode AD and a torch.compile trace;
    ``is_transformed`` only inside the first two."""
    from attnlab._checks import is_traced, is_transformed

    seen: list[tuple[bool, bool]] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        seen.append((is_traced(), is_transformed()))
        return x.sum()

    x = torch.ones(2, 3)
    f(x)
    torch.func.vmap(f)(x)
    torch.func.grad(f)(x[0])
    torch.func.jvp(f, (x,), (x,))
    with torch.autograd.forward_ad.dual_level():
        f(x)
    assert seen == [(False, False)] + [(True, True)] * 4
    f(x)
    assert seen[-1] == (False, False)

    @torch.compile(backend="eager", fullgraph=True)
    def g(x: torch.Tensor) -> torch.Tensor:
        if is_traced():
            return x + 1
        return x - 1

    torch.testing.assert_close(g(x), x + 1)  # the traced branch was compiled
    assert not is_traced()


def test_compiled_steps_round_up_to_a_power_of_two_of_at_least_eight() -> None:
    from attnlab._checks import compiled_steps

    assert [compiled_steps(k) for k in (0, 1, 8, 9, 16, 17, 33, 512, 513)] == [
        8, 8, 8, 16, 16, 32, 64, 512, 1024,
    ]  # fmt: skip


def test_unrolled_loops_are_rounded_under_torch_compile_only() -> None:
    """``rounds_unrolled_loops()`` (the loops over a sequence run ``compiled_steps(n)``
    steps) is True under ``torch.compile`` only: not in eager mode, under ``torch.func``
    nor under ``torch.export`` (strict or not: its graph keeps the traced sizes)."""
    from attnlab._checks import rounds_unrolled_loops

    class Probe(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x.sum() * 0 + float(rounds_unrolled_loops())

    x = torch.zeros(2, 5)
    assert Probe()(x).item() == 0
    assert torch.func.vmap(Probe())(x).tolist() == [0, 0]
    assert torch.compile(Probe(), backend="eager", fullgraph=True)(x).item() == 1
    for strict in (False, True):
        program = torch.export.export(Probe(), (x,), strict=strict)
        assert program.module()(x).item() == 0, strict
