"""The layers of attnlab only point down (docs/architecture.md, "Layers").

* The import graph of ``src/attnlab``, read with :mod:`ast` (every ``import`` and ``from ...
  import`` anywhere in a file, also inside functions and ``TYPE_CHECKING`` blocks, relative
  imports resolved, plus ``importlib.import_module("attnlab...")`` with a literal name),
  has no cycle between modules and no import from a lower layer to a higher one.
* ``import attnlab`` and building and running every registered score, alignment,
  dimensionality, attention, feature and query mechanism loads no module of the layers
  above the core (models, the lab, evaluation, data, viz).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "attnlab"

#: The layers, lowest first: ``(layer, groups)``. A group is a top-level module or package
#: of attnlab (``"attnlab"`` is the package's own ``__init__``: the public core). A module
#: may import its own group and any group of a lower layer; groups of one layer may import
#: each other (without cycles) unless the layer is in :data:`INDEPENDENT`.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "base",
        frozenset(
            {
                "_atomic",
                "_checks",
                "_deprecation",
                "_optional",
                "_flash_kernels",
                "_local_kernels",
                "_recurrent",
                "capture",
                "masks",
                "output",
                "registry",
            }
        ),
    ),
    ("general", frozenset({"general", "functional"})),
    ("sections", frozenset({"feature", "query"})),
    ("package", frozenset({"attnlab"})),
    ("data", frozenset({"data"})),
    ("measures, models, figures", frozenset({"evaluation", "models", "viz"})),
    ("lab", frozenset({"lab"})),
    ("command line", frozenset({"cli"})),
    ("entry point", frozenset({"__main__"})),
)
#: Layers whose groups must not import one another (evaluation holds pure measures: no
#: task model; the task models need no measure; the figures need neither).
INDEPENDENT = frozenset({"measures, models, figures"})
#: Packages that ``import attnlab`` and the core mechanisms must never load.
ABOVE_THE_CORE = (
    "attnlab.models",
    "attnlab.lab",
    "attnlab.evaluation",
    "attnlab.data",
    "attnlab.viz",
)


# ----------------------------------------------------------------------------- the graph


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for every file of attnlab."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def _owner(name: str, known: dict[str, tuple[Path, bool]]) -> str | None:
    """The module that defines ``name``: the longest known prefix of the dotted name."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, package: str, known: dict[str, tuple[Path, bool]]) -> list[str]:
    """The attnlab modules one AST node imports (none for nodes that import nothing)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        # `from attnlab import masks` imports the module attnlab.masks
        names = [
            f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names
        ]
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        names = [node.args[0].value]
    else:
        return []
    return [t for n in names if n.split(".")[0] == "attnlab" and (t := _owner(n, known))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the attnlab modules it imports (itself left out)."""
    known = modules()
    graph = {}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = {t for node in ast.walk(tree) for t in _targets(node, package, known)}
        graph[name] = targets - {name}
    return graph


def group(module: str) -> str:
    """``attnlab.lab.tasks.vqa`` -> ``lab``; ``attnlab`` -> ``attnlab``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of() -> dict[str, int]:
    return {g: i for i, (_, groups) in enumerate(LAYERS) for g in groups}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b (layer x -> layer y)`` for every import that does not point down."""
    layers = layer_of()
    names = [name for name, _ in LAYERS]
    bad = []
    for source in sorted(graph):
        for target in sorted(graph[source]):
            a, b = group(source), group(target)
            if a == b:
                continue
            la, lb = layers[a], layers[b]
            if lb > la or (lb == la and names[la] in INDEPENDENT):
                bad.append(f"{source} -> {target} ({names[la]} -> {names[lb]})")
    return bad


# ----------------------------------------------------------------------------- tests


def test_every_group_has_a_layer() -> None:
    groups = {group(m) for m in modules()}
    missing = sorted(groups - set(layer_of()))
    assert not missing, f"add {missing} to LAYERS (and to docs/architecture.md, 'Layers')"


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    # a function-level import of a module, and a relative one, are edges like any other
    tree = ast.parse("def f():\n    from attnlab.lab import training\n    from . import masks\n")
    known = modules()
    got = {t for node in ast.walk(tree) for t in _targets(node, "attnlab", known)}
    assert got == {"attnlab.lab.training", "attnlab.masks"}
    assert "attnlab.cli" in graph["attnlab.__main__"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    lines = []
    for component in found:
        members = set(component)
        lines.append(f"cycle of {len(component)} modules:")
        lines += [f"  {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    assert not found, "import cycles (the imports between their modules):\n" + "\n".join(lines)


def test_no_upward_imports() -> None:
    bad = upward_edges(import_graph())
    assert not bad, (
        "imports from a lower layer to a higher one (docs/architecture.md, 'Layers'):\n"
        + "\n".join(bad)
    )


def test_the_checks_catch_a_cycle_and_an_upward_edge() -> None:
    graph = {
        "attnlab.registry": {"attnlab.general.attention"},
        "attnlab.general.attention": {"attnlab.registry"},
        "attnlab.evaluation.study": {"attnlab.models.sentence"},
        "attnlab.models.sentence": set(),
    }
    assert cycles(graph) == [["attnlab.general.attention", "attnlab.registry"]]
    assert upward_edges(graph) == [
        "attnlab.evaluation.study -> attnlab.models.sentence "
        "(measures, models, figures -> measures, models, figures)",
        "attnlab.registry -> attnlab.general.attention (base -> general)",
    ]


#: Run in a fresh interpreter: build every registered mechanism of the core kinds with
#: small sizes (the constructor's size arguments, by name) and run it once on small inputs, then list the attnlab modules loaded above the
#: core.
CORE_RUN = textwrap.dedent(
    """
    import inspect, json, sys
    import torch
    import attnlab
    from attnlab import registry

    SIZES = dict(
        d_model=8, num_heads=2, d_q=8, d_k=8, d1=8, d2=8, d_in=8, d_c=8, d_features=8,
        num_classes=2, max_len=8, dim=8, d_f=8, d_char=8, d_proj=8, embeddings=[8, 8],
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g)
    q = torch.randn(2, 3, 8, generator=g)
    char_to_word = torch.zeros(2, 3, 7, dtype=torch.bool)
    char_to_word[0, 0, :2] = char_to_word[0, 1, 2] = char_to_word[0, 2, 4:] = True
    char_to_word[1, 0, :4] = char_to_word[1, 1, 4:6] = True
    # the inputs of the mechanisms that take neither one, two nor three [B, n, d] tensors
    SPECIAL = {
        "hierarchical-attention": ((torch.randn(2, 3, 4, 8, generator=g),), {}),
        "dme": (([x, x],), {}),
        "cdme": (([x, x],), {}),
        "pointer-network": ((x[:, :4], torch.tensor([[3, 1, 0, 2], [2, 0, 1, -1]])), {}),
        "attention-via-attention": (
            (torch.randn(2, 8, generator=g), torch.randn(2, 7, 8), torch.randn(2, 3, 8)),
            {"char_to_word": char_to_word},
        ),
    }

    def wanted(kind, param):
        # a size the constructor needs: no default, num_heads, or (for the parts of the
        # general model) a None default, which means "no weights to build"
        empty = param.default is param.empty
        part = kind in ("score", "align", "dim") and param.default is None
        return empty or part or param.name == "num_heads"

    def calls(entry, module):
        if entry.kind == "score":
            return [((q, x), {})]
        if entry.kind == "align":
            mask = attnlab.masks.from_lengths(torch.tensor([5, 3]))
            return [((torch.randn(2, 3, 5), mask), {"query": q, "keys": x})]
        if entry.kind == "dim":
            a = torch.rand(2, 3, 5, 8) if module.multi else torch.rand(2, 3, 5)
            return [((a, x), {})]
        if entry.name in SPECIAL:
            return [SPECIAL[entry.name]]
        return [((x,) * n, {}) for n in (1, 2, 3)]

    ran, failed = [], []
    for kind in ("score", "align", "dim", "attention", "feature", "query"):
        for entry in registry.entries(kind):
            params = inspect.signature(entry.cls).parameters
            kwargs = {k: v for k, v in SIZES.items() if k in params and wanted(kind, params[k])}
            module = registry.build({"name": entry.name, "kind": kind, **kwargs})
            errors = []
            for args, kw in calls(entry, module):
                try:
                    module(*args, **kw)
                except Exception as err:  # another arity; reported when none runs
                    errors.append(f"{type(err).__name__}: {err}")
                else:
                    ran.append(f"{kind} {entry.name}")
                    break
            else:
                failed.append(f"{kind} {entry.name}: {errors}")
    loaded = sorted(m for m in sys.modules if m.startswith(ABOVE))
    print(json.dumps({"ran": ran, "failed": failed, "loaded": loaded}))
    """
)


def test_the_core_loads_nothing_above_it() -> None:
    code = f"ABOVE = {ABOVE_THE_CORE!r}\n" + CORE_RUN
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["failed"], "mechanisms that did not run:\n" + "\n".join(report["failed"])
    kinds = {r.split()[0] for r in report["ran"]}
    assert kinds == {"score", "align", "dim", "attention", "feature", "query"}, report["ran"]
    assert not report["loaded"], (
        "import attnlab and the core mechanisms loaded modules above the core:\n"
        + "\n".join(report["loaded"])
    )


@pytest.mark.parametrize("package", ["attnlab.models", "attnlab.lab.tasks"])
def test_importing_a_package_registers_its_entries(package: str) -> None:
    """The registry loads only the core: the task models and the tasks register when their
    package is imported."""
    kind, example = {
        "attnlab.models": ("model", "sentence-classifier"),
        "attnlab.lab.tasks": ("task", "sentiment"),
    }[package]
    code = (
        "import importlib, json\nfrom attnlab import registry\n"
        f"before = registry.names({kind!r})\nimportlib.import_module({package!r})\n"
        f"print(json.dumps([before, registry.names({kind!r})]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    before, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert before == []
    assert example in after
