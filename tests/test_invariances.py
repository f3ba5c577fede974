"""Invariances every registered attention mechanism owes a demanding user: batch
independence, padding (masked positions appended to a sequence), joint key permutation, and
module hygiene (deepcopy, pickle, a state dict loaded into a fresh module, float64,
non-contiguous inputs), half precision (bfloat16 and float16 against float32, with the
stated tolerance ``HALF_TOL``), an empty batch, training after a call under
``torch.inference_mode()``, exact second derivatives, and a backward pass that
``torch.autograd.detect_anomaly`` finds no NaN in, activation checkpointing,
``torch.export``, ONNX export run in ONNX Runtime (with the ``onnx`` extra), the ``torch.func`` transforms, the meta-device
pattern (``to_empty``, then ``reset_parameters``), and LoRA adapters and pruning on every
``nn.Linear`` / ``nn.Conv1d`` of the module.

The mechanisms are those the other suites already enumerate: every score x alignment x
dimensionality of :class:`attnlab.Attention` (``VALID`` of ``tests/general/
test_attention.py``, from the registry) and every query / feature module of the per-module
table ``CASES`` of ``tests/test_checks.py`` (whose builders are reused here; a test below
fails when a mechanism of that table has no call described here). The checks themselves
are the ``check_*_invariance`` / ``check_module_hygiene`` functions of
``tests/attention_harness.py``; this file only says how each mechanism is called: its
inputs (a ``str`` in a shape names a *sequence*, whose positions the checks permute or
pad), which sequences it can mask, and along which axes of its outputs each sequence runs.

Where a property does not hold by design, the mechanism is listed in :data:`EXEMPT` with
the reason; everything else is checked strictly (fp32, ``atol=rtol=1e-5``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from attention_harness import (
    HALF_TOL,
    Mechanism,
    check_activation_checkpointing,
    check_backward_without_anomaly,
    check_batch_independence,
    check_empty_batch,
    check_export,
    check_half_precision,
    check_inference_mode_then_training,
    check_key_padding_invariance,
    check_key_permutation_equivariance,
    check_layer_replacements,
    check_meta_device_init,
    check_module_hygiene,
    check_onnx_export,
    check_second_derivatives,
    check_torch_func,
)
from torch import Tensor

from attnlab import Attention
from attnlab.feature.multilevel import HierarchicalAttention
from attnlab.feature.rotatory import LCRRotHop
from attnlab.query.graph import GraphAttention
from attnlab.query.multi_head import MultiHeadAttention
from attnlab.query.multi_hop import MultiHopAttention
from attnlab.query.pointer import PointerNetwork
from attnlab.query.positional import RotaryPositions, SinusoidalPositions
from attnlab.query.reformer import LSHAttention
from attnlab.query.self_attention import (
    ConstantQuerySelfAttention,
    LearnedQuerySelfAttention,
    RelationalSelfAttention,
)
from attnlab.query.synthesizer import SynthesizerAttention
from tests.general.test_attention import LOCAL, QUERYLESS, VALID
from tests.test_checks import CASES, PARAMETER_FREE

D = 8  # the feature size of the modules of tests/test_checks.py's CASES
N = 5  # the sequence length (CASES' max_len where a module has one)


def _key_mask(mk: dict[str, Tensor], seq: str) -> Tensor | None:
    """The ``[B, n]`` mask of ``seq`` as the convention's key mask ``[B, 1, n]``."""
    m = mk.get(seq)
    return None if m is None else m[:, None, :]


def _built(name: str) -> Callable[[], Any]:
    """The builder of ``CASES[name]`` (``tests/test_checks.py``)."""
    return CASES[name][1]


# ------------------------------------------------------------------ query / feature modules


def _self(name: str, *, pooled: bool = False, weights_rows: bool = True, **kw: Any) -> Mechanism:
    """Self-attention over ``query`` ``[B, n, D]`` with a key mask: the context runs along
    the sequence (or is pooled), the weights along it on their last axis (and on axis 1
    when the rows are the queries)."""
    w_axes = ((1, "s"), (-1, "s")) if weights_rows else ((-1, "s"),)
    return Mechanism(
        _built(name),
        {"query": ("s", D)},
        lambda m, x, mk, nw: m(x["query"], mask=_key_mask(mk, "s"), need_weights=nw, **kw),
        masked=("s",),
        axes={"context": () if pooled else ((1, "s"),), "weights": w_axes},
    )


def _cross(name: str, d_k: int = D, *, n_q: int | None = 3) -> Mechanism:
    """Cross-attention from ``n_q`` queries (``None``: one query ``[B, D]``) over keys and
    values ``[B, n, d_k]`` with a key mask."""
    q_shape = (D,) if n_q is None else (n_q, D)
    return Mechanism(
        _built(name),
        {"query": q_shape, "key": ("k", d_k), "value": ("k", d_k)},
        lambda m, x, mk, nw: m(
            x["query"], x["key"], x["value"], mask=_key_mask(mk, "k"), need_weights=nw
        ),
        masked=("k",),
        axes={"context": (), "weights": ((-1, "k"),)},
    )


def _co(name: str, d2: int = 6, *, fine: bool = False) -> Mechanism:
    """Co-attention of ``f1`` ``[B, n1, D]`` and ``f2`` ``[B, n2, d2]``, masks ``mask1`` /
    ``mask2``; pooled contexts, weights ``a1`` / ``a2`` (and the fine-grained ones)."""
    outs = ["a1", "a2"] + (["a1_fine", "a2_fine"] if fine else [])
    return Mechanism(
        _built(name),
        {"f1": ("a", D), "f2": ("b", d2)},
        lambda m, x, mk, nw: m(
            x["f1"], x["f2"], mask1=mk.get("a"), mask2=mk.get("b"), need_weights=nw
        ),
        masked=("a", "b"),
        outputs=lambda o: {"context": o.context, **{k: getattr(o, k) for k in outs}},
        axes={"context": (), **{k: ((-1, "a" if k.startswith("a1") else "b"),) for k in outs}},
    )


_ROT_PARTS = {"left": "l", "right": "r", "target_left": "t", "target_right": "t"}


def _rotatory(name: str) -> Mechanism:
    """Rotatory attention over ``left`` / ``target`` / ``right``, each with its mask; the
    weights of the last hop."""
    return Mechanism(
        _built(name),
        {"left": ("l", D), "target": ("t", D), "right": ("r", D)},
        lambda m, x, mk, nw: m(
            x["left"],
            x["target"],
            x["right"],
            left_mask=mk.get("l"),
            target_mask=mk.get("t"),
            right_mask=mk.get("r"),
            need_weights=nw,
        ),
        masked=("l", "t", "r"),
        outputs=lambda o: {"context": o.context, **{k: o.hops[-1][k] for k in _ROT_PARTS}},
        axes={"context": (), **{k: ((-1, s),) for k, s in _ROT_PARTS.items()}},
    )


def _han(build: Callable[[], Any]) -> Mechanism:
    """Hierarchical attention over a document ``[B, n_t, n_w, D]``: sentences ``t`` of
    words ``w``, the word mask shared by the sentences and combined with a sentence mask;
    the weights of the words ``[B, n_t, n_w]`` and of the sentences ``[B, n_t]``."""

    def call(m: Any, x: dict[str, Tensor], mk: dict[str, Tensor], nw: bool) -> Any:
        B, n_t, n_w = x["x"].shape[:3]
        mask = None
        if mk:
            words = mk.get("w", torch.ones(B, n_w, dtype=torch.bool))
            sents = mk.get("t", torch.ones(B, n_t, dtype=torch.bool))
            mask = sents[:, :, None] & words[:, None, :]
        return m(x["x"], mask=mask, need_weights=nw)

    return Mechanism(
        build,
        {"x": ("t", "w", D)},
        call,
        masked=("t", "w"),
        outputs=lambda o: {
            "context": o.context,
            "words": None if o.weights is None else o.weights[0],
            "sents": None if o.weights is None else o.weights[1],
        },
        axes={"context": (), "words": ((1, "t"), (2, "w")), "sents": ((1, "t"),)},
    )


def _meta(name: str) -> Mechanism:
    """A meta-embedding over two embeddings ``[B, n, D]`` and ``[B, n, 6]`` of the same
    tokens, with a token mask; per-token contexts and weights over the embeddings."""
    return Mechanism(
        _built(name),
        {"a": ("s", D), "b": ("s", 6)},
        lambda m, x, mk, nw: m([x["a"], x["b"]], mask=mk.get("s"), need_weights=nw),
        masked=("s",),
        axes={"context": ((1, "s"),), "weights": ((1, "s"),)},
    )


def _pointer_targets(batch: int, lengths: dict[str, int]) -> dict[str, Tensor]:
    # three distinct pointers, real in every row (the shortest masked row has 3 inputs)
    return {"targets": torch.tensor([2, 0, 1]).repeat(batch, 1)}


def _ava_offsets(batch: int, lengths: dict[str, int]) -> dict[str, Tensor]:
    # word i starts at character i; the last real word runs to the last real character
    offsets = torch.arange(lengths["w"]).clamp(max=lengths["c"] - 1)
    return {"word_offsets": offsets.repeat(batch, 1)}


MECHANISMS: dict[str, Mechanism] = {
    "attention-over-attention": Mechanism(
        _built("attention-over-attention"),
        {"document": ("d", D), "question": ("q", D)},
        lambda m, x, mk, nw: m(
            x["document"], x["question"], mask1=mk.get("d"), mask2=mk.get("q"), need_weights=nw
        ),
        masked=("d", "q"),
        outputs=lambda o: {"context": o.context, "s": o.s, "beta_bar": o.beta_bar},
        axes={"context": (), "s": ((-1, "d"),), "beta_bar": ((-1, "q"),)},
    ),
    "capsule": replace(
        _self("capsule"),
        outputs=lambda o: {"probs": o.probs, "contexts": o.contexts, "weights": o.weights},
        axes={"probs": (), "contexts": (), "weights": ((-1, "s"),)},
    ),
    "capsule-routing": replace(
        _self("capsule-routing"),
        outputs=lambda o: {"probs": o.probs, "capsules": o.capsules, "weights": o.weights},
        axes={"probs": (), "capsules": (), "weights": ((-1, "s"),)},
    ),
    "key-value": _cross("key-value"),
    "concatenated-key-value": _cross("concatenated-key-value", n_q=2),
    # its weights run over the k projected positions, not over the keys
    "linformer": replace(_self("linformer"), axes={"context": ((1, "s"),), "weights": ((1, "s"),)}),
    "multi-head": _self("multi-head"),
    "multi-head-cross-general": _cross("multi-head-cross-general", 6),
    "multi-head-grouped-additive": _self("multi-head-grouped-additive", causal=True),
    "multi-head-no-bias": _self("multi-head-no-bias"),
    "multi-hop": _cross("multi-hop", n_q=None),
    "pointer-network": Mechanism(
        _built("pointer-network"),
        {"x": ("s", D)},
        lambda m, x, mk, nw: m(x["x"], x["targets"], mask=mk.get("s")),
        masked=("s",),
        fixed=_pointer_targets,
        outputs=lambda o: {"log_probs": o.log_probs, "target_log_prob": o.target_log_prob},
        axes={"log_probs": ((-1, "s"),), "target_log_prob": ()},
    ),
    "learned-positions": Mechanism(
        _built("learned-positions"),
        {"x": ("s", D)},
        lambda m, x, mk, nw: m(x["x"]),
        outputs=lambda o: {"context": o},
        axes={"context": ((1, "s"),)},
    ),
    "relative-positions": _self("relative-positions"),
    # the rotations from a generator seeded alike at every call: without one they are
    # drawn afresh at every call (documented), and no two calls could be compared
    "reformer": Mechanism(
        _built("reformer"),
        {"query": ("s", D)},
        lambda m, x, mk, nw: m(
            x["query"],
            mask=_key_mask(mk, "s"),
            need_weights=nw,
            generator=torch.Generator().manual_seed(0),
        ),
        masked=("s",),
        axes={"context": ((1, "s"),), "weights": ((1, "s"), (-1, "s"))},
    ),
    "constant-query-self-attention": _self(
        "constant-query-self-attention", pooled=True, weights_rows=False
    ),
    "learned-query-self-attention": _self(
        "learned-query-self-attention", pooled=True, weights_rows=False
    ),
    "relational-self-attention": _self("relational-self-attention"),
    "synthesizer": _self("synthesizer"),
    "transformer-encoder-layer": _self("transformer-encoder-layer"),  # the input is called src
    "transformer-encoder-layer-norm-first": _self(
        "transformer-encoder-layer-norm-first"
    ),  # the input is called src
    "transformer-decoder-layer": Mechanism(
        _built("transformer-decoder-layer"),
        {"tgt": ("t", D), "memory": ("m", D)},
        lambda m, x, mk, nw: m(
            x["tgt"],
            x["memory"],
            tgt_mask=_key_mask(mk, "t"),
            memory_mask=_key_mask(mk, "m"),
            need_weights=nw,
        ),
        masked=("t", "m"),
        outputs=lambda o: {
            "context": o.context,
            "weights": o.weights,
            "cross": o.extras["cross_weights"],
        },
        axes={
            "context": ((1, "t"),),
            "weights": ((1, "t"), (-1, "t")),
            "cross": ((1, "t"), (-1, "m")),
        },
    ),
    "transformer-xl": _self("transformer-xl"),
    "alternating-co-attention": _co("alternating-co-attention"),
    "interactive-co-attention": _co("interactive-co-attention"),
    "parallel-co-attention": _co("parallel-co-attention"),
    "parallel-co-attention-max": _co("parallel-co-attention-max", D),
    "multi-grained-co-attention": _co("multi-grained-co-attention", fine=True),
    "hierarchical-attention": _han(_built("hierarchical-attention")),
    "attention-via-attention": Mechanism(
        _built("attention-via-attention"),
        {"q": (D,), "chars": ("c", 6), "words": ("w", 6)},
        lambda m, x, mk, nw: m(
            x["q"],
            x["chars"],
            x["words"],
            word_offsets=x["word_offsets"],
            word_mask=mk.get("w"),
            mask=mk.get("c"),
            need_weights=nw,
        ),
        masked=("c", "w"),
        fixed=_ava_offsets,
        axes={"context": (), "weights": ((-1, "c"),)},
    ),
    "dme": _meta("dme"),
    "cdme": _meta("cdme"),
    "lcr-rot-hop": _rotatory("lcr-rot-hop"),
    "rotatory": _rotatory("rotatory"),
    "graph-attention": _self("graph-attention"),
    "graph-attention-v2": _self("graph-attention-v2"),
    # the registered mechanisms without parameters (tests/test_checks.py's PARAMETER_FREE)
    "sinusoidal-positions": Mechanism(
        lambda: SinusoidalPositions(D),
        {"x": ("s", D)},
        lambda m, x, mk, nw: m(x["x"]),
        outputs=lambda o: {"context": o},
        axes={"context": ((1, "s"),)},
    ),
    "rotary-positions": Mechanism(
        lambda: RotaryPositions(D),
        {"q": (3, D), "k": ("s", D)},
        lambda m, x, mk, nw: m(x["q"], x["k"]),
        outputs=lambda o: {"q": o[0], "k": o[1]},
        axes={"q": (), "k": ((1, "s"),)},
    ),
}


# Options of the same modules whose code paths differ: weights with a feature axis,
# other alignments and scores in the multi-head form, RNN encoders, query transforms.
VARIANTS: dict[str, Mechanism] = {
    "relational-self-attention/additive-multi": replace(
        MECHANISMS["relational-self-attention"],
        build=lambda: RelationalSelfAttention(D, score="additive", dim="multi"),
        axes={"context": ((1, "s"),), "weights": ((1, "s"), (-2, "s"))},
    ),
    "constant-query-self-attention/multi": replace(
        MECHANISMS["constant-query-self-attention"],
        build=lambda: ConstantQuerySelfAttention(D, dim="multi", value_dim=3),
        axes={"context": (), "weights": ((-2, "s"),)},
    ),
    "learned-query-self-attention/two-queries": replace(
        MECHANISMS["learned-query-self-attention"],
        build=lambda: LearnedQuerySelfAttention(D, num_queries=2, score="general"),
    ),
    "multi-head/sparsemax": replace(
        MECHANISMS["multi-head"], build=lambda: MultiHeadAttention(D, 2, align="sparsemax")
    ),
    "multi-head/cosine-gqa": replace(
        MECHANISMS["multi-head"],
        build=lambda: MultiHeadAttention(D, 4, num_kv_heads=2, score="cosine", dropout=0.2),
    ),
    "multi-hop/gru": replace(
        MECHANISMS["multi-hop"],
        build=lambda: MultiHopAttention(D, D, D, hops=3, transform="gru", score="general"),
    ),
    "graph-attention/no-self-loops": replace(
        MECHANISMS["graph-attention"], build=lambda: GraphAttention(D, 2, self_loops=False)
    ),
    "synthesizer/factorized-random": replace(
        MECHANISMS["synthesizer"],
        build=lambda: SynthesizerAttention(D, 2, max_len=N, mode="factorized-random", mix_dot=True),
    ),
    "hierarchical-attention/bigru": _han(
        lambda: HierarchicalAttention(D, encoder="bigru", encoder_hidden=3)
    ),
    "lcr-rot-hop/sparsemax": replace(
        MECHANISMS["lcr-rot-hop"],
        build=lambda: LCRRotHop(D, hops=2, share_weights=False, align="sparsemax"),
    ),
    "reformer/fixed-buckets": replace(
        MECHANISMS["reformer"], build=lambda: LSHAttention(D, 2, bucket_size=2, num_buckets=2)
    ),
    # seed and num_buckets: the rotations are a buffer, the calls take no generator
    "reformer/seeded": replace(
        MECHANISMS["reformer"],
        build=lambda: LSHAttention(D, 2, bucket_size=2, num_buckets=2, seed=0),
        call=lambda m, x, mk, nw: m(x["query"], mask=_key_mask(mk, "s"), need_weights=nw),
    ),
    "pointer-network/general": replace(
        MECHANISMS["pointer-network"], build=lambda: PointerNetwork(D, 8, score="general")
    ),
}
MECHANISMS.update(VARIANTS)


# ------------------------------------------------------------------------ general Attention


def _general(score: str, align: str, dim: str) -> Mechanism:
    """``Attention(score, align, dim)``: 3 queries (none for a query-less score) over keys
    and values ``[B, n, D]`` with a key mask; the weights' key axis is the last one (the
    one before the features for multi-dimensional weights)."""

    def build() -> Attention:
        return Attention(score, align, dim, d_q=D, d_k=D)

    shapes: dict[str, tuple[int | str, ...]] = {"key": ("k", D), "value": ("k", D)}
    if score not in QUERYLESS:
        shapes["query"] = (3, D)
    return Mechanism(
        build,
        shapes,
        lambda m, x, mk, nw: m(
            x.get("query"), x["key"], x["value"], mask=_key_mask(mk, "k"), need_weights=nw
        ),
        masked=("k",),
        axes={"context": (), "weights": ((-2 if dim == "multi" else -1, "k"),)},
    )


for _score, _align, _dim in VALID:
    MECHANISMS[f"attention/{_score}/{_align}/{_dim}"] = _general(_score, _align, _dim)
    if _dim == "single" and _score in ("general", "additive", "queryless"):
        # projected keys and values, and dropout (inactive in evaluation mode)
        MECHANISMS[f"attention/{_score}/{_align}/{_dim}/projected"] = replace(
            MECHANISMS[f"attention/{_score}/{_align}/{_dim}"],
            build=lambda s=_score, a=_align: Attention(
                s, a, d_q=D, d_k=D, key_dim=4, value_dim=3, dropout=0.3
            ),
        )
# the score VALID leaves out (it reads the previous step's weights ``[B, n_q, n_k]``)
MECHANISMS["attention/location-aware/soft/single"] = Mechanism(
    lambda: Attention("location-aware", d_q=D, d_k=D, n_filters=2, kernel_size=3),
    {"query": (3, D), "key": ("k", D), "value": ("k", D), "prev": (3, "k")},
    lambda m, x, mk, nw: m(
        x["query"],
        x["key"],
        x["value"],
        mask=_key_mask(mk, "k"),
        need_weights=nw,
        prev_weights=x["prev"],
    ),
    masked=("k",),
    axes={"context": (), "weights": ((-1, "k"),)},
)


# ------------------------------------------------------------------------------- exemptions

_POSITIONAL = "positional by design: "
_LSH = (
    "LSH buckets are sorted and chunked by (bucket, position): a permutation changes which "
    "keys share a chunk"
)
_SYNTHESISED = _POSITIONAL + "synthesised weights indexed by key position"
_LSTM_POINTER = _POSITIONAL + "an LSTM encoder over the inputs, decoded step by step"
_STEPS = (
    "a traced call loops over the positions in Python (the padded rows, as under "
    "torch.compile), so the ONNX graph holds the traced length's steps: "
)
_POINTER_STEPS = _STEPS + "the encoder's and the decoder's steps"
_LSH_ONNX = (
    "the hash rotations are drawn in the call from a torch.Generator, which ONNX cannot "
    "hold (its RandomNormal draws other numbers): torch.export.export works, and with "
    "seed and num_buckets ONNX too (reformer/seeded)"
)
#: The exemptions: mechanism -> {property: why the property does not hold by design}.
#: ``property`` is ``"permutation"`` (joint key permutation equivariance), or
#: ``"permutation:<sequence>"`` for one sequence of a mechanism with several, or
#: ``"padding"`` (masked positions appended), or ``"onnx"`` (no ONNX export), or
#: ``"onnx-lengths"`` (an ONNX graph with the traced sequence lengths, a dynamic batch).
#: Batch independence and hygiene exempt nothing.
EXEMPT: dict[str, dict[str, str]] = {
    "attention-via-attention": {
        "permutation": _POSITIONAL + "words are spans of consecutive characters (word_offsets)",
    },
    "attention/location-aware/soft/single": {
        "permutation": _POSITIONAL + "a convolution along the previous weights",
    },
    "cdme": {
        "permutation": _POSITIONAL + "a BiLSTM contextualises the tokens",
        "onnx-lengths": _STEPS + "the BiLSTM's steps",
    },
    "hierarchical-attention/bigru": {
        "permutation": _POSITIONAL + "a BiGRU encodes the words and the sentences in order",
        "onnx-lengths": _STEPS + "the BiGRU's steps",
    },
    "learned-positions": {"permutation": _POSITIONAL + "a learned embedding per position"},
    "linformer": {
        "permutation": _POSITIONAL + "learned projections E, F [k, n] along the sequence",
    },
    "multi-head-grouped-additive": {"permutation": _POSITIONAL + "called with causal=True"},
    "pointer-network": {"permutation": _LSTM_POINTER, "onnx-lengths": _POINTER_STEPS},
    "pointer-network/general": {"permutation": _LSTM_POINTER, "onnx-lengths": _POINTER_STEPS},
    "reformer": {
        "permutation": _LSH,
        "onnx": _LSH_ONNX,
        "padding": "num_buckets defaults from the padded length n, which changes the "
        "hashing (checked with a fixed num_buckets: reformer/fixed-buckets)",
    },
    "reformer/fixed-buckets": {"permutation": _LSH, "onnx": _LSH_ONNX},
    "reformer/seeded": {"permutation": _LSH},
    "relative-positions": {"permutation": _POSITIONAL + "relative position embeddings"},
    "rotary-positions": {"permutation": _POSITIONAL + "a rotation by each position's angle"},
    "sinusoidal-positions": {"permutation": _POSITIONAL + "the encoding of each position"},
    "synthesizer": {"permutation": _SYNTHESISED},
    "synthesizer/factorized-random": {"permutation": _SYNTHESISED},
    "transformer-decoder-layer": {
        "permutation:t": _POSITIONAL + "causal self-attention over the target",
    },
    "transformer-xl": {"permutation": _POSITIONAL + "relative positional encoding"},
}
for _score, _align, _dim in VALID:
    for _suffix in ("", "/projected"):
        _name = f"attention/{_score}/{_align}/{_dim}{_suffix}"
        if _align in LOCAL and _name in MECHANISMS:
            EXEMPT.setdefault(_name, {})["permutation"] = (
                _POSITIONAL + "a window around a position of the key sequence"
            )
        if _align == "structured" and _name in MECHANISMS:
            EXEMPT.setdefault(_name, {})["permutation"] = (
                _POSITIONAL + "a linear-chain CRF over neighbouring keys"
            )
            EXEMPT[_name]["onnx-lengths"] = _STEPS + "the CRF's forward-backward recursions"


def _exempt(name: str, prop: str) -> str | None:
    return EXEMPT.get(name, {}).get(prop)


def _skip_if_exempt(name: str, prop: str) -> None:
    reason = _exempt(name, prop)
    if reason is not None:
        pytest.skip(f"{name}: {reason}")


NAMES = sorted(MECHANISMS)


# ------------------------------------------------------------------------------------ tests


def test_every_query_and_feature_case_is_described_here():
    """A module added to ``tests/test_checks.py``'s table must be added here too."""
    assert set(CASES) | PARAMETER_FREE <= set(MECHANISMS), sorted(set(CASES) - set(MECHANISMS))
    assert {f"attention/{'/'.join(c)}" for c in VALID} <= set(MECHANISMS)


def test_every_exemption_names_a_mechanism_and_gives_a_reason():
    for name, props in EXEMPT.items():
        assert name in MECHANISMS, name
        for prop, reason in props.items():
            assert prop.split(":")[0] in ("permutation", "padding", "onnx", "onnx-lengths"), prop
            assert len(reason) > 20, (name, prop)


@pytest.mark.parametrize("name", NAMES)
def test_batch_independence(name):
    check_batch_independence(
        MECHANISMS[name],
        n=N,
        trimmed=_exempt(name, "padding") is None,
        # its targets point at real inputs: a sample without any is an invalid call
        empty_sample=not name.startswith("pointer-network"),
    )


@pytest.mark.parametrize("name", [n for n in NAMES if MECHANISMS[n].masked])
def test_appended_masked_positions_change_nothing(name):
    _skip_if_exempt(name, "padding")
    check_key_padding_invariance(MECHANISMS[name], n=N - 2, extra=2)


@pytest.mark.parametrize("name", NAMES)
def test_joint_key_permutation(name):
    _skip_if_exempt(name, "permutation")
    mech = MECHANISMS[name]
    seqs = [s for s in mech.sequences() if _exempt(name, f"permutation:{s}") is None]
    check_key_permutation_equivariance(mech, n=N, sequences=seqs)


@pytest.mark.parametrize("name", NAMES)
def test_module_hygiene(name):
    check_module_hygiene(MECHANISMS[name], n=N)


#: outputs that stay float32 for half-precision inputs, by design (with the reason)
FLOAT32_OUTPUTS: dict[str, tuple[tuple[str, ...], str]] = {
    name: (
        ("log_probs", "target_log_prob"),
        "log-probabilities stay in the scores' float32, as torch.autocast keeps log_softmax",
    )
    for name in NAMES
    if name.startswith("pointer-network")
}


@pytest.mark.parametrize("dtype", sorted(HALF_TOL, key=str), ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_half_precision(name, dtype):
    outputs, _ = FLOAT32_OUTPUTS.get(name, ((), ""))
    check_half_precision(MECHANISMS[name], dtype, n=N, float32_outputs=outputs)


@pytest.mark.parametrize("name", NAMES)
def test_empty_batch(name):
    check_empty_batch(MECHANISMS[name], n=N)


@pytest.mark.parametrize("name", NAMES)
def test_inference_mode_then_training(name):
    check_inference_mode_then_training(MECHANISMS[name], n=N)


@pytest.mark.parametrize("name", NAMES)
def test_second_derivatives(name):
    """Under PyTorch's math SDPA backend (its CPU flash kernel has no double backward, as
    docs/attention.md says) every mechanism's second derivatives are exact: attnlab's own
    kernels differentiate the broadcast formula under ``create_graph=True``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        check_second_derivatives(MECHANISMS[name])


@pytest.mark.parametrize("name", NAMES)
def test_backward_without_anomaly(name):
    check_backward_without_anomaly(
        MECHANISMS[name],
        n=N,
        # its targets point at real inputs: a sample without any is an invalid call
        empty_sample=not name.startswith("pointer-network"),
    )


@pytest.mark.parametrize("name", NAMES)
def test_activation_checkpointing(name):
    check_activation_checkpointing(MECHANISMS[name], n=N)


class _CountingSelfAttention(torch.nn.Module):
    """Multi-head self-attention whose forward scales the context by 1 or 2 as it has been
    called an even or odd number of times: a forward with a side effect. The check's
    checkpointed call, then the plain one, see the same parity (the same outputs), but the
    checkpoint's second run of the forward in the backward pass sees the other one: only
    the gradients show it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = MultiHeadAttention(D, 2)
        self.calls = 0

    def forward(self, query: Tensor, *, mask: Tensor | None = None, need_weights: bool = False):
        self.calls += 1
        out = self.inner(query, mask=mask, need_weights=need_weights)
        scale = torch.full((), 1.0 + self.calls % 2)  # a tensor: the backward saves it
        return replace(out, context=out.context * scale)


def test_activation_checkpointing_check_fails_on_a_forward_with_a_side_effect():
    mech = replace(MECHANISMS["multi-head"], build=_CountingSelfAttention)
    with pytest.raises(AssertionError, match=r"checkpointed \(training mode\), gradient"):
        check_activation_checkpointing(mech, n=N)


@pytest.mark.parametrize("name", NAMES)
def test_export(name):
    check_export(MECHANISMS[name], n=N)


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("name", NAMES)
def test_torch_func(name):
    """vmap, per-sample gradients and forward mode (``check_torch_func``): attnlab's
    value checks, fast paths and kernels step aside under a ``torch.func`` transform
    (``attnlab._checks.is_traced``), the sparse mappings have a vmap rule and a
    forward-mode formula. Under PyTorch's math SDPA backend, as for second derivatives."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        check_torch_func(MECHANISMS[name], n=N)


@pytest.mark.parametrize("name", NAMES)
def test_meta_device_init(name):
    check_meta_device_init(MECHANISMS[name], n=N)


#: the mechanisms without an ``nn.Linear`` / ``nn.Conv1d``: the dot-family scores
#: compare the inputs themselves (their alignments here have no parameters either), the
#: capsules and learned queries hold raw parameters, the positions are tables or formulas
NO_LAYERS = {
    f"attention/{score}/{align}/single"
    for score in ("cosine", "dot", "scaled-dot")
    for align in ("entmax15", "hard", "local-m", "soft", "sparsemax", "structured")
} | {
    "capsule",
    "capsule-routing",
    "learned-positions",
    "learned-query-self-attention",
    "parallel-co-attention-max",
    "rotary-positions",
    "sinusoidal-positions",
}


@pytest.mark.parametrize("name", NAMES)
def test_layer_replacements(name):
    """LoRA-style adapters and ``torch.nn.utils.prune`` on every ``nn.Linear`` /
    ``nn.Conv1d`` of the mechanism take effect (``check_layer_replacements``): the scores
    call their layers (``attnlab.general.scoring.apply_layer``) instead of reading
    ``weight``."""
    checked = check_layer_replacements(MECHANISMS[name], n=N)
    assert bool(checked) != (name in NO_LAYERS), f"{name}: {checked} layers; NO_LAYERS is stale"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", NAMES)
def test_onnx_export(name):
    """``torch.onnx.export`` with dynamic batch and sequence sizes, run in ONNX Runtime
    (``check_onnx_export``; the mechanisms of ``EXEMPT[...]["onnx-lengths"]`` with a
    dynamic batch only); needs the ``onnx`` extra (``make data`` installs it)."""
    _skip_if_exempt(name, "onnx")
    pytest.importorskip(
        "onnxscript", reason="torch.onnx.export needs onnxscript (pip install '.[onnx]')"
    )
    pytest.importorskip(
        "onnxruntime", reason="the exported graph runs in onnxruntime (pip install '.[onnx]')"
    )
    check_onnx_export(MECHANISMS[name], n=N, dynamic_lengths=_exempt(name, "onnx-lengths") is None)
