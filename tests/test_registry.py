"""Tests for attnlab.registry: names -> mechanisms, build from a config dict, and the
get_config() round trip."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import attnlab
from attnlab import registry
from attnlab.general import (
    ActivatedGeneralScore,
    AdditiveScore,
    BiasedGeneralScore,
    CosineScore,
    DotScore,
    Entmax15Align,
    GeneralScore,
    HardAlign,
    LocalMAlign,
    LocalPAlign,
    MultiDimensional,
    QuerylessScore,
    ReinforcedAlign,
    ScaledDotScore,
    SingleDimensional,
    SoftAlign,
    SparsemaxAlign,
)

SCORES = {
    "dot": DotScore,
    "scaled-dot": ScaledDotScore,
    "general": GeneralScore,
    "biased-general": BiasedGeneralScore,
    "activated-general": ActivatedGeneralScore,
    "cosine": CosineScore,
    "additive": AdditiveScore,
    "queryless": QuerylessScore,
}
ALIGNS = {
    "soft": SoftAlign,
    "hard": HardAlign,
    "local-m": LocalMAlign,
    "local-p": LocalPAlign,
    "reinforced": ReinforcedAlign,
    "sparsemax": SparsemaxAlign,
    "entmax15": Entmax15Align,
}
DIMS = {"single": SingleDimensional, "multi": MultiDimensional}


# ------------------------------------------------------------------------ names / entries


@pytest.mark.parametrize(("kind", "table"), [("score", SCORES), ("align", ALIGNS), ("dim", DIMS)])
def test_names_list_every_mechanism(kind, table):
    got = registry.names(kind)
    assert got == sorted(got)
    assert set(table) <= set(got)
    for name, cls in table.items():
        entry = registry.get(kind, name)
        assert entry.cls is cls
        assert entry.kind == kind
        assert entry.name == name
        assert cls.registry_name == name
        assert cls.registry_kind == kind


@pytest.mark.parametrize("kind", ["score", "align", "dim", "attention"])
def test_entries_carry_formula_and_source(kind):
    entries = registry.entries(kind)
    assert entries, f"no {kind} registered"
    for e in entries:
        assert e.kind == kind
        assert e.formula.strip(), f"{kind} {e.name} has no formula"
        assert e.source.strip(), f"{kind} {e.name} has no source"


def test_entries_without_kind_is_the_union():
    every = registry.entries()
    for kind in ("score", "align", "dim", "attention"):
        assert [e for e in every if e.kind == kind] == registry.entries(kind)
    names = {(e.kind, e.name) for e in every}
    assert {("score", n) for n in SCORES} <= names
    assert {("align", n) for n in ALIGNS} <= names
    assert {("dim", n) for n in DIMS} <= names
    assert ("attention", "general") in names


def test_names_of_unknown_kind_is_empty():
    assert registry.names("no-such-kind") == []


@pytest.mark.parametrize(
    ("kind", "alias", "name"),
    [
        ("score", "multiplicative", "dot"),
        ("score", "scaled_dot", "scaled-dot"),
        ("score", "SDP", "scaled-dot"),
        ("score", "bilinear", "general"),
        ("score", "biased_general", "biased-general"),
        ("score", "activated_general", "activated-general"),
        ("score", "concat", "additive"),
        ("score", "bahdanau", "additive"),
        ("score", "similarity", "cosine"),
        ("score", "self-attentive", "queryless"),
        ("score", "query_less", "queryless"),
        ("align", "global", "soft"),
        ("align", "softmax", "soft"),
        ("align", "stochastic", "hard"),
        ("align", "local_m", "local-m"),
        ("align", "local-predictive", "local-p"),
        ("align", "resan", "reinforced"),
        ("align", "entmax-1.5", "entmax15"),
        ("dim", "multi-dimensional", "multi"),
        ("dim", "single-dimensional", "single"),
        ("attention", "attention", "general"),
    ],
)
def test_aliases_resolve(kind, alias, name):
    assert registry.get(kind, alias).name == name


def test_aliases_work_in_attention():
    attn = attnlab.Attention(
        score="bahdanau", align="global", dim="multi-dimensional", d_q=4, d_k=4
    )
    assert isinstance(attn.score, AdditiveScore)
    assert isinstance(attn.align, SoftAlign)
    assert attn.multi


def test_get_unknown_name_lists_the_registered_ones():
    with pytest.raises(KeyError) as err:
        registry.get("score", "dotty")
    msg = str(err.value)
    assert "unknown score 'dotty'" in msg
    for name in SCORES:
        assert name in msg


def test_get_unknown_kind():
    with pytest.raises(KeyError, match=r"unknown kind 'scores'.*score"):
        registry.get("scores", "dot")


# ------------------------------------------------------------------------------------ build


def test_build_without_name_builds_attention():
    attn = attnlab.build(
        {"score": "additive", "align": "local-p", "dim": "single", "d_q": 4, "d_k": 6, "D": 2}
    )
    assert isinstance(attn, attnlab.Attention)
    assert isinstance(attn.score, AdditiveScore)
    assert isinstance(attn.align, LocalPAlign)
    assert attn.align.D == 2
    out = attn(torch.randn(2, 3, 4), torch.randn(2, 7, 6))
    assert out.context.shape == (2, 3, 6)


def test_build_empty_dict_is_the_default_attention():
    attn = attnlab.build({})
    assert isinstance(attn, attnlab.Attention)
    assert isinstance(attn.score, ScaledDotScore)
    assert isinstance(attn.align, SoftAlign)


def test_build_named_component():
    score = attnlab.build({"name": "additive", "kind": "score", "d_q": 4, "d_k": 4})
    assert type(score) is AdditiveScore
    assert score.W1.weight.shape == (4, 4)
    align = attnlab.build({"name": "local-m", "D": 3})  # kind inferred (unique name)
    assert type(align) is LocalMAlign
    assert align.D == 3
    assert type(attnlab.build({"name": "multi"})) is MultiDimensional
    attn = attnlab.build({"name": "general", "kind": "attention", "score": "dot"})
    assert type(attn) is attnlab.Attention


def test_build_with_alias_and_underscores():
    assert type(attnlab.build({"name": "scaled_dot", "kind": "score"})) is ScaledDotScore
    assert type(attnlab.build({"name": "bilinear", "d_q": 2, "d_k": 3})) is GeneralScore


def test_build_unknown_name():
    with pytest.raises(KeyError) as err:
        attnlab.build({"name": "no-such-thing"})
    msg = str(err.value)
    assert "'no-such-thing'" in msg
    assert "additive" in msg and "soft" in msg  # the registered names are listed


def test_build_unknown_name_of_a_kind():
    with pytest.raises(KeyError, match=r"unknown align 'additive'"):
        attnlab.build({"name": "additive", "kind": "align"})


def test_build_unknown_key_names_the_key_and_the_accepted_ones():
    with pytest.raises(TypeError) as err:
        attnlab.build({"name": "additive", "kind": "score", "d_q": 4, "d_k": 4, "hidden": 8})
    msg = str(err.value)
    assert "['hidden']" in msg
    assert "d_w" in msg and "act" in msg


def test_build_unknown_attention_option_names_it():
    with pytest.raises(TypeError, match=r"unknown options \['window'\]"):
        attnlab.build({"score": "dot", "align": "local-m", "window": 3})


def test_build_ambiguous_name_asks_for_kind():
    # "general" is a score and the general attention module
    with pytest.raises(KeyError, match=r"several kinds.*add 'kind'"):
        attnlab.build({"name": "general", "d_q": 2, "d_k": 2})


def test_build_kind_without_name_is_an_error():
    with pytest.raises(ValueError, match=r"kind='score' but no 'name'"):
        attnlab.build({"kind": "score", "d_q": 4, "d_k": 4})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"name": 5}, r"^config 'name' must be text, got 5$"),
        ({"name": "dot", "kind": 5}, r"^config 'kind' must be text, got 5$"),
        ({"name": None, "kind": ["score"]}, r"^config 'kind' must be text, got \['score'\]$"),
    ],
)
def test_build_names_and_kinds_are_text(config, message):
    """``{"name": 5}`` was an ``AttributeError`` ('int' object has no attribute 'lower')."""
    with pytest.raises(TypeError, match=message):
        registry.build(config)
    with pytest.raises(TypeError, match=r"^a score name must be text, got 5$"):
        registry.get("score", 5)
    with pytest.raises(TypeError, match=r"^kind must be text, got 5$"):
        registry.get(5, "dot")


def test_build_needs_a_dict():
    with pytest.raises(TypeError, match=r"config must be a dict, got list"):
        attnlab.build([("score", "dot")])


def test_build_does_not_mutate_the_config():
    cfg = {"name": "additive", "kind": "score", "d_q": 4, "d_k": 4}
    before = copy.deepcopy(cfg)
    attnlab.build(cfg)
    assert cfg == before


def test_register_rejects_a_second_class_under_one_name(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", copy.copy(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", copy.copy(registry._ALIASES))

    @registry.register("test-kind", "thing", formula="x", source="y", aliases=("stuff",))
    class Thing(registry.Configurable):
        def __init__(self, size: int = 2) -> None:
            super().__init__()
            self.size = size

    assert registry.get("test-kind", "stuff").cls is Thing
    built = registry.build({"name": "thing", "kind": "test-kind", "size": 5})
    assert built.size == 5
    assert built.get_config() == {"name": "thing", "kind": "test-kind", "size": 5}
    with pytest.raises(ValueError, match=r"already registered"):

        @registry.register("test-kind", "thing", formula="x", source="y")
        class Other(nn.Module):
            pass


def test_an_alias_never_takes_a_name_or_another_alias(monkeypatch):
    """An alias that named another mechanism of its kind was taken from it without a word
    (the last registration won); the built-in lcr-rot-hop listed its own name."""
    monkeypatch.setattr(registry, "_REGISTRY", copy.deepcopy(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", copy.deepcopy(registry._ALIASES))

    def define(name: str, aliases: tuple[str, ...] = ()) -> type:
        @registry.register("test-kind", name, formula="x", source="y", aliases=aliases)
        class Thing(nn.Module):
            pass

        return Thing

    first = define("first", ("one",))
    cases = [
        ("second", ("one",), r"alias 'one' of 'second' is already an alias of 'first'$"),
        ("second", ("first",), r"alias 'first' of 'second' is the name of another test-kind$"),
        ("one", (), r"test-kind 'one' is already an alias of 'first'$"),
        ("second", ("second",), r"test-kind 'second' lists its own name among its aliases$"),
        ("My_Thing", (), r"lower case with '-', got 'My_Thing' \('my-thing'\)$"),
        ("second", ("Two",), r"lower case with '-', got 'Two' \('two'\)$"),
        ("second", ("",), r"lower case with '-', got ''$"),
    ]
    for name, aliases, message in cases:
        with pytest.raises(ValueError, match=message):
            define(name, aliases)
    assert registry.get("test-kind", "one").cls is first
    assert registry.names("test-kind") == ["first"]
    registry.register("test-kind", "first", formula="x", source="y", aliases=("one",))(first)
    assert registry.get("test-kind", "one").cls is first  # the same class again: allowed
    assert all(e.name not in e.aliases for e in registry.entries())
    for thing in (len, object()):
        with pytest.raises(TypeError, match=r"^register\('test-kind', 'x'\) decorates a class"):
            registry.register("test-kind", "x", formula="x", source="y")(thing)
    for kind, name in (("test-kind", "one"), ("test-kind", "nope"), ("no-kind", "first")):
        with pytest.raises(KeyError, match=f"no {kind} '{name}' is registered"):
            registry.unregister(kind, name)
    assert registry.unregister("test-kind", "first").cls is first
    with pytest.raises(KeyError):
        registry.get("test-kind", "one")  # its aliases went with it


def test_register_reads_the_card_from_the_docstring_fields(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", copy.copy(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", copy.copy(registry._ALIASES))

    @registry.register("test-kind", "carded")
    class Carded(nn.Module):
        """A toy with its card in the docstring.

        Cost: prose about the cost, not a field.

        :formula: e_l = q^T k_l
            + b (a continuation line)
        :source: Nobody 2024, A Toy
        :cost: O(n)
        """

    entry = registry.get("test-kind", "carded")
    assert entry.formula == "e_l = q^T k_l + b (a continuation line)"
    assert entry.source == "Nobody 2024, A Toy"
    assert entry.cost == "O(n)"

    @registry.register("test-kind", "overridden", source="Given 2025")
    class Overridden(Carded):
        """:formula: x"""

    entry = registry.get("test-kind", "overridden")
    # the keyword wins; a subclass does not inherit its parent's card
    assert (entry.formula, entry.source, entry.cost) == ("x", "Given 2025", "")


def test_a_wrong_constructor_argument_names_the_class():
    from attnlab.query.reformer import LSHAttention
    from attnlab.query.transformer import TransformerDecoderLayer

    with pytest.raises(
        TypeError,
        match=r"^LSHAttention.__init__\(\) got an unexpected keyword argument 'bucket_sise'$",
    ):
        LSHAttention(8, 2, bucket_sise=4)
    with pytest.raises(
        TypeError, match=r"^LSHAttention.__init__\(\) missing a required argument: 'num_heads'$"
    ):
        LSHAttention(8)
    with pytest.raises(TypeError, match=r"^TransformerDecoderLayer.__init__\(\) got an unexpected"):
        TransformerDecoderLayer(8, 2, dim_feedforwad=16)


def test_register_without_a_card_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"no formula and no source: give formula= or"):

        @registry.register("test-kind", "cardless")
        class Cardless(nn.Module):
            """No fields here."""


def test_every_builtin_card_is_read_from_its_docstring():
    import attnlab.lab.tasks
    import attnlab.models  # noqa: F401

    builtin = [e for e in registry.entries() if e.cls.__module__.startswith("attnlab.")]
    assert len(builtin) >= 72
    for entry in builtin:
        card = registry.card_from_docstring(entry.cls)
        assert card.get("formula") == entry.formula, entry.name
        assert card.get("source") == entry.source, entry.name
        assert card.get("cost", "") == entry.cost, entry.name


# ----------------------------------------------------------------------- config round trip


def _same_params(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


ATTENTION_CONFIGS = [
    {},
    {"score": "additive", "align": "soft", "d_q": 4, "d_k": 6, "d_w": 5, "act": "relu"},
    {"score": "additive", "align": "soft", "dim": "multi", "d_q": 4, "d_k": 6},
    {"score": "general", "align": "local-p", "d_q": 4, "d_k": 6, "D": 2, "d_p": 3},
    {"score": "dot", "align": "local-m", "d_q": 4, "d_k": 4, "D": 1, "gaussian": True},
    {"score": "scaled-dot", "d_q": 4, "d_k": 6, "key_dim": 4, "value_dim": 3, "dropout": 0.1},
    {"score": "cosine", "align": "hard", "d_q": 4, "d_k": 4, "eval_mode": "argmax"},
    {"score": "queryless", "align": "reinforced", "d_k": 6, "d_h": 5},
    {"score": "activated-general", "align": "sparsemax", "d_q": 4, "d_k": 6, "path": "explicit"},
    {"score": "general", "align": "structured", "d_q": 4, "d_k": 6, "pairwise": False},
]


@pytest.mark.parametrize("cfg", ATTENTION_CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_attention_config_round_trip(cfg):
    torch.manual_seed(0)
    attn = attnlab.build(cfg).eval()
    conf = attn.get_config()
    assert conf["name"] == "general"
    assert conf["kind"] == "attention"
    for key, value in cfg.items():
        assert conf[key] == value
    torch.manual_seed(1)  # a different initialisation
    again = attnlab.build(conf).eval()
    assert type(again) is type(attn)
    assert again.get_config() == conf
    again.load_state_dict(attn.state_dict())
    _same_params(attn, again)
    d_q = cfg.get("d_q", 4)
    d_k = cfg.get("d_k", 4)
    q, k = torch.randn(2, 3, d_q), torch.randn(2, 7, d_k)
    mask = attnlab.masks.from_lengths(torch.tensor([7, 4]))
    if not attn.score.needs_query:
        q = None  # a query-less score takes no query
    a = attn(q, k, mask=mask, need_weights=True)
    b = again(q, k, mask=mask, need_weights=True)
    assert torch.equal(a.context, b.context)
    assert torch.equal(a.weights, b.weights)
    assert a.path == b.path


COMPONENTS = [
    ("score", "dot", {}),
    ("score", "scaled-dot", {"d_q": 4, "d_k": 4}),
    ("score", "general", {"d_q": 4, "d_k": 4}),
    ("score", "biased-general", {"d_q": 4, "d_k": 4}),
    ("score", "activated-general", {"d_q": 4, "d_k": 4, "act": "sigmoid"}),
    ("score", "cosine", {"temperature": 0.5}),
    ("score", "additive", {"d_q": 4, "d_k": 4, "d_w": 3, "bias": False}),
    ("score", "queryless", {"d_k": 4, "d_w": 3}),
    ("score", "location-aware", {"d_q": 4, "d_k": 4, "n_filters": 2, "kernel_size": 3}),
    ("align", "soft", {}),
    ("align", "sparsemax", {}),
    ("align", "entmax15", {}),
    ("align", "hard", {"estimator": "gumbel", "tau": 0.5}),
    ("align", "local-m", {"D": 1}),
    ("align", "local-p", {"d_q": 4, "D": 2}),
    ("align", "reinforced", {"d_k": 4, "d_h": 3}),
    ("align", "structured", {"sum_to_one": True}),
    ("dim", "single", {}),
    ("dim", "multi", {}),
]


def _run_component(kind: str, module: nn.Module, gen: torch.Generator):
    q = torch.randn(2, 3, 4, generator=gen)
    k = torch.randn(2, 5, 4, generator=gen)
    if kind == "score":
        return module(q, k)
    if kind == "align":
        e = torch.randn(2, 3, 5, generator=gen)
        mask = attnlab.masks.from_lengths(torch.tensor([5, 3]))
        return module(e, mask, query=q, keys=k).weights
    a = torch.rand(2, 3, 5, generator=gen)
    if module.multi:
        a = torch.rand(2, 3, 5, 4, generator=gen)
    return module(a, k)


@pytest.mark.parametrize(("kind", "name", "kwargs"), COMPONENTS, ids=lambda x: str(x))
def test_component_config_round_trip(kind, name, kwargs):
    torch.manual_seed(0)
    module = attnlab.build({"name": name, "kind": kind, **kwargs}).eval()
    conf = module.get_config()
    assert conf["name"] == name
    assert conf["kind"] == kind
    for key, value in kwargs.items():
        assert conf[key] == value
    torch.manual_seed(1)
    again = attnlab.build(conf).eval()
    assert type(again) is type(module)
    assert again.get_config() == conf
    again.load_state_dict(module.state_dict())
    _same_params(module, again)
    out_a = _run_component(kind, module, torch.Generator().manual_seed(2))
    out_b = _run_component(kind, again, torch.Generator().manual_seed(2))
    assert torch.equal(out_a, out_b)


def test_every_registered_component_is_covered_by_the_round_trip():
    covered = {(kind, name) for kind, name, _ in COMPONENTS}
    for kind in ("score", "align", "dim"):
        for name in registry.names(kind):
            assert (kind, name) in covered, f"add {kind} {name!r} to COMPONENTS"


def test_registry_loads_every_builtin_mechanism_module():
    """`attnlab list` and `build` see every built-in mechanism, also those in modules that
    `import attnlab` does not import. Checked in a fresh interpreter: the registry's view
    equals the one after importing every module of the mechanism subpackages by hand."""
    code = textwrap.dedent(
        """
        import importlib, json, pkgutil
        from attnlab import registry
        first = sorted((e.kind, e.name) for e in registry.entries())
        for pkg_name in ("attnlab.general", "attnlab.feature", "attnlab.query"):
            try:
                pkg = importlib.import_module(pkg_name)
            except ModuleNotFoundError:
                continue
            for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
                importlib.import_module(info.name)
        after = sorted((e.kind, e.name) for e in registry.entries())
        print(json.dumps([first, after]))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    first, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first == after
    assert ["attention", "general"] in first


def test_printed_modules_show_their_non_default_arguments():
    """``print(module)`` names what tells one configuration from another: the constructor
    arguments that differ from their defaults, in signature order; a tensor by its shape, a
    module by its class, a long value cut."""
    attn = attnlab.Attention("additive", "soft", "multi", d_q=4, d_k=4, dropout=0.1)
    assert attn.extra_repr() == "score='additive', dim='multi', d_q=4, d_k=4, dropout=0.1"
    assert repr(attn).startswith("Attention(\n  score='additive', dim='multi', d_q=4, d_k=4")
    assert attnlab.Attention("dot").extra_repr() == "score='dot'"

    from attnlab.feature.meta_embedding import DME

    dme = DME([torch.zeros(10, 3), nn.Embedding(7, 2)], 4, align="sparsemax")
    assert (
        dme.extra_repr()
        == "embeddings=[tensor[10, 3], Embedding(...)], d_proj=4, align='sparsemax'"
    )

    class Wide(registry.Configurable):
        def __init__(self, names: tuple[str, ...] = ()) -> None:
            super().__init__()

    text = Wide(names=tuple(f"name{i}" for i in range(20))).extra_repr()
    assert text.startswith("names=('name0', ") and text.endswith("...") and len(text) == 66
    assert Wide().extra_repr() == ""


def test_reset_parameters_initialises_again_in_the_modules_dtype_and_device():
    torch.manual_seed(0)
    attn = attnlab.Attention("additive", d_q=4, d_k=4).double()
    first = {k: v.clone() for k, v in attn.state_dict().items()}
    torch.manual_seed(1)
    attn.reset_parameters()
    assert all(v.dtype == torch.float64 for v in attn.state_dict().values())
    assert not torch.equal(attn.score.w, first["score.w"])  # a new draw
    torch.manual_seed(0)
    attn.reset_parameters()  # the constructor's draw under the same seed, cast to float64
    for k, v in first.items():
        assert torch.equal(attn.state_dict()[k], v), k


def test_reset_parameters_refuses_meta_tensors_and_a_changed_module():
    with torch.device("meta"):
        attn = attnlab.Attention("additive", d_q=4, d_k=4)
    with pytest.raises(RuntimeError, match=r"on the meta device: move it first \(module\.to_empty"):
        attn.reset_parameters()
    attn.to_empty(device="cpu")
    attn.register_buffer("extra", torch.zeros(2))
    with pytest.raises(
        RuntimeError,
        match=r"no longer has the tensors its constructor makes; differing names: \['extra'\]",
    ):
        attn.reset_parameters()


def test_a_subclass_without_its_own_init_records_its_base_constructor_arguments():
    """A subclass that only overrides ``forward`` is built by its base's constructor: its
    config is that constructor's arguments, not those of the inner base the constructor
    calls (``MultiHeadAttention`` calls ``ProjectedHeadAttention``, whose ``inputs`` then
    broke ``reset_parameters``); a subclass with its own ``__init__`` records its own."""

    class MyMHA(attnlab.MultiHeadAttention):
        pass

    class MyKV(attnlab.ConcatenatedKeyValueAttention):
        pass

    class Own(attnlab.MultiHeadAttention):
        def __init__(self, d: int, extra: int = 1) -> None:
            super().__init__(d, 2)
            self.extra = extra

    mha = MyMHA(8, 2, num_kv_heads=1)
    assert mha._config == attnlab.MultiHeadAttention(8, 2, num_kv_heads=1)._config
    torch.manual_seed(0)
    mha.reset_parameters()
    kv = MyKV(num_queries=3, concat=False)
    assert kv._config["num_queries"] == 3 and kv._config["concat"] is False
    assert Own(8, extra=5)._config == {"d": 8, "extra": 5}
