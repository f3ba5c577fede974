"""The documentation is tested like code.

* Every ```python block of README.md and docs/**/*.md runs. The blocks of one page run in
  order in one fresh namespace (a later block may use names from an earlier one); a failure
  names the page and the block number. A page whose examples need an optional package says
  so in a comment, ``<!-- needs: matplotlib (pip install 'attnlab[eval]') -->``; without
  the package its examples skip with that install command as the reason.
* Every registered mechanism has a docs page that names it and cites its source paper.
* Every relative link in the docs points at a file that exists.
* docs/functional.md lists the exact signatures of ``attnlab.functional``.
* Every public name (the ``__all__`` of attnlab and of its public packages) is named in a
  code span of the docs or the README.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import traceback
from pathlib import Path

import pytest
import torch

import attnlab
import attnlab.functional
import attnlab.lab.tasks  # registers the tasks (the registry loads only the core)
import attnlab.models  # registers the task models
from attnlab import registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])

# Where the page of a registered mechanism lives: docs/<folder>/<name>.md, with the folder
# chosen by the mechanism's kind; the general attention module has docs/attention.md.
KIND_FOLDERS = {
    "score": "scores",
    "align": "alignments",
    "dim": "dimensionality",
    "feature": "feature",
    "query": "query",
    "model": "models",
    "task": "tasks",
}
SPECIAL_PAGES = {("attention", "general"): "attention.md"}

_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
_NEEDS = re.compile(r"<!--\s*needs:\s*(?P<module>[\w.]+)\s*\((?P<install>[^)]*)\)\s*-->")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a markdown text, in order."""
    return [m["body"] for m in _FENCE.finditer(text) if m["lang"] in ("python", "py")]


def _without_code(text: str) -> str:
    return _FENCE.sub("", text)


def missing_needs(text: str) -> list[str]:
    """The install commands of the optional packages a page's examples need and that are
    not installed (declared as ``<!-- needs: MODULE (INSTALL) -->``)."""
    return [
        f"{m['module']} is not installed ({m['install'].strip()})"
        for m in _NEEDS.finditer(text)
        if importlib.util.find_spec(m["module"]) is None
    ]


# ----------------------------------------------------------------------------- examples


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_examples_run(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = missing_needs(text)
    if missing:
        pytest.skip(f"{_rel(page)}: " + "; ".join(missing))
    blocks = python_blocks(text)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    torch.manual_seed(0)
    for number, code in enumerate(blocks, start=1):
        where = f"{_rel(page)}, python block {number} of {len(blocks)}"
        try:
            exec(compile(code, where, "exec"), namespace)
        except Exception:
            pytest.fail(f"{where} failed:\n{code}\n{traceback.format_exc()}", pytrace=False)


def test_block_extraction_sees_fences() -> None:
    text = "intro\n```python\nx = 1\n```\ntext\n```text\nnot code\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]


def test_needs_marker_is_read() -> None:
    text = "<!-- needs: attnlab_no_such_module (pip install x) -->\n<!-- needs: torch (y) -->"
    assert missing_needs(text) == ["attnlab_no_such_module is not installed (pip install x)"]


def test_pages_that_import_optional_packages_declare_them() -> None:
    # an example importing an optional package must say so, or a fresh clone fails on it
    optional = {"matplotlib": "attnlab.viz", "pysword": None, "eflomal": None, "ray": None}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        code = "\n".join(python_blocks(text))
        for module, via in optional.items():
            uses = re.search(rf"^\s*(from|import) {module}\b", code, re.M) or (
                via is not None and re.search(rf"^\s*(from|import) {re.escape(via)}\b", code, re.M)
            )
            declared = any(m["module"] == module for m in _NEEDS.finditer(text))
            assert not uses or declared, f"{_rel(page)} imports {module} without a needs: marker"


def test_every_page_has_an_example() -> None:
    missing = [
        _rel(p)
        for p in PAGES
        if p.parent != DOCS
        or p.name
        not in ("index.md", "architecture.md", "benchmarks.md", "results.md", "explanation.md")
        if not python_blocks(p.read_text(encoding="utf-8"))
    ]
    assert not missing, f"pages without a runnable ```python example: {missing}"


# ----------------------------------------------------------------------------- coverage


def page_for(entry: registry.Entry) -> Path:
    """docs/<folder>/<name>.md; failing that, a page of the same folder that names the
    mechanism in code (one page may describe a family, e.g. a mechanism and its variant)."""
    special = SPECIAL_PAGES.get((entry.kind, entry.name))
    if special is not None:
        return DOCS / special
    folder = DOCS / KIND_FOLDERS.get(entry.kind, entry.kind)
    own = folder / f"{entry.name}.md"
    if own.is_file() or not folder.is_dir():
        return own
    token = re.compile(rf"`(?:{re.escape(entry.kind)}/)?{re.escape(entry.name)}`")
    for page in sorted(folder.glob("*.md")):
        if token.search(page.read_text(encoding="utf-8")):
            return page
    return own


def source_keys(source: str) -> list[str]:
    """What a page must mention to cite ``source``: for every ``;``-separated reference,
    the first author's surname, the year and the first three words of the title."""
    keys: list[str] = []
    for ref in source.split(";"):
        year = re.search(r"\b(1[89]|20)\d\d\b", ref)
        assert year, f"no year in the source {ref!r}"
        surnames = re.findall(r"[A-Z][a-zA-Z-]+", ref[: year.start()])
        assert surnames, f"no author in the source {ref!r}"
        keys += [surnames[0], year.group(0)]
        title = re.sub(r"\([^)]*\)", "", ref[year.end() :]).strip(" ,;)")
        if title:
            keys.append(" ".join(title.split()[:3]))
    return keys


def _norm(text: str) -> str:
    return " ".join(text.replace("`", "").split()).lower()


def test_source_keys() -> None:
    source = (
        "Lin et al. 2017, A Structured Self-attentive Sentence Embedding; Yang et al. 2016 (HAN)"
    )
    assert source_keys(source) == ["Lin", "2017", "A Structured Self-attentive", "Yang", "2016"]
    assert source_keys("Peters, Niculae & Martins 2019, Sparse Sequence-to-Sequence Models") == [
        "Peters",
        "2019",
        "Sparse Sequence-to-Sequence Models",
    ]
    assert source_keys("all (e.g. Bahdanau et al. 2015)") == ["Bahdanau", "2015"]


# the library's own entries (tests register throw-away tasks such as "toy" as plugins)
LIBRARY_ENTRIES = [e for e in registry.entries() if e.cls.__module__.startswith("attnlab.")]


@pytest.mark.parametrize("entry", LIBRARY_ENTRIES, ids=lambda e: f"{e.kind}-{e.name}")
def test_every_mechanism_has_a_page(entry: registry.Entry) -> None:
    page = page_for(entry)
    assert page.is_file(), f"{entry.kind} {entry.name!r} has no docs page {_rel(page)}"
    text = _norm(page.read_text(encoding="utf-8"))
    assert _norm(entry.name) in text, f"{_rel(page)} never names {entry.name!r}"
    missing = [key for key in source_keys(entry.source) if _norm(key) not in text]
    assert not missing, (
        f"{_rel(page)} does not cite the source of {entry.name!r} ({entry.source!r}): "
        f"missing {missing}"
    )


def test_index_lists_every_page() -> None:
    # the top-level pages and those of the general attention model (survey section 3.2)
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = {(DOCS / m["target"].split("#")[0]).resolve() for m in _LINK.finditer(index)}
    pages = [*DOCS.glob("*.md")]
    for folder in ("scores", "alignments", "dimensionality"):
        pages += (DOCS / folder).glob("*.md")
    unlisted = [_rel(p) for p in pages if p.name != "index.md" and p.resolve() not in linked]
    assert not unlisted, f"docs/index.md does not link to {unlisted}"


# ----------------------------------------------------------------------------- links


def anchors(text: str) -> set[str]:
    """The anchors a renderer derives from the headings (GitHub's rule)."""
    slugs = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", _without_code(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def test_anchors() -> None:
    assert "implementation-paths-and-explain" in anchors("## Implementation paths and `explain()`")
    assert "alignment-modules-return-aligned" in anchors("### Alignment modules return `Aligned`")


def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        for m in _LINK.finditer(_without_code(page.read_text(encoding="utf-8"))):
            target = m["target"]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            file = (page.parent / path) if path else page
            if not file.exists():
                broken.append(f"{_rel(page)} -> {target}")
            elif anchor and file.suffix == ".md":
                if anchor not in anchors(file.read_text(encoding="utf-8")):
                    broken.append(f"{_rel(page)} -> {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


# ----------------------------------------------------------------------------- contents


def render_signature(name: str, fn: object) -> str:
    """``name(a, b=1, *, c=None, **kw)``: the signature without annotations."""
    parts = []
    star_done = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star_done = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.default is p.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={p.default!r}")
    return f"{name}({', '.join(parts)})"


def test_functional_signatures_are_documented() -> None:
    text = (DOCS / "functional.md").read_text(encoding="utf-8")
    missing = [
        render_signature(name, getattr(attnlab.functional, name))
        for name in attnlab.functional.__all__
        if render_signature(name, getattr(attnlab.functional, name)) not in text
    ]
    assert not missing, "docs/functional.md lacks these exact signatures:\n" + "\n".join(missing)


# the packages whose __all__ is the public API a user reads about in the docs
PUBLIC_PACKAGES = (
    "attnlab",
    "attnlab.general",
    "attnlab.feature",
    "attnlab.query",
    "attnlab.functional",
    "attnlab.masks",
    "attnlab.models",
    "attnlab.data",
    "attnlab.evaluation",
    "attnlab.lab",
    "attnlab.viz",
    "attnlab.registry",
)


def _code_spans(text: str) -> str:
    """The text inside the code spans and code blocks of ``text``."""
    blocks = [m.group("body") for m in _FENCE.finditer(text)]
    spans = re.findall(r"`([^`]+)`", _FENCE.sub("", text))  # a span may wrap a line
    return "\n".join(blocks + spans)


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_every_public_name_is_documented(package: str) -> None:
    code = "\n".join(_code_spans(p.read_text(encoding="utf-8")) for p in PAGES)
    module = importlib.import_module(package)
    missing = [
        name
        for name in module.__all__
        if not name.startswith("__") and not re.search(rf"(?<!\w){re.escape(name)}\b", code)
    ]
    assert not missing, f"{package} exports names no docs page shows in code: {missing}"


def test_no_pipe_inside_table_code() -> None:
    # a `|` inside a code span of a table row splits the cell when the page is rendered
    bad = [
        f"{_rel(page)}: {line.strip()[:80]}"
        for page in PAGES
        for line in _without_code(page.read_text(encoding="utf-8")).splitlines()
        if line.lstrip().startswith("|")
        for span in re.findall(r"`([^`]*)`", line)
        if "|" in span
    ]
    assert not bad, "table cells with a | inside code:\n" + "\n".join(bad)


def test_readme_names_the_setup_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in ("make test", "make demo", "make bench", "make lint"):
        assert command in readme, f"README.md does not mention `{command}`"
    assert attnlab.__version__


# ----------------------------------------------------------------------------- README


def _readme_commands() -> list[list[str]]:
    import shlex

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [m["body"] for m in _FENCE.finditer(text) if m["lang"] in ("text", "")]
    return [
        shlex.split(line.split("#", 1)[0])
        for block in blocks
        for line in block.splitlines()
        if line.startswith("attnlab ")
    ]


def _run_dir_of_train(words: list[str]) -> str:
    """The run directory an `attnlab train TASK ...` line of the README creates."""
    from attnlab.lab.config import parse_attention
    from attnlab.lab.task import spec_slug

    task, spec, seed, out = words[2], None, "0", None
    for k, word in enumerate(words):
        if word in ("-a", "--attention"):
            spec = words[k + 1]
        elif word == "--seed":
            seed = words[k + 1]
        elif word == "--out":
            out = words[k + 1]
    base = out or f"runs/{task}"
    return f"{base}/{spec_slug(parse_attention(spec))}--seed{seed}"


def test_readme_explains_a_run_its_own_train_line_creates() -> None:
    commands = _readme_commands()
    created = {_run_dir_of_train(c) for c in commands if c[1] == "train" and "--help" not in c}
    explained = [c[2] for c in commands if c[1] == "explain"]
    assert explained, "the README no longer shows `attnlab explain`"
    for run_dir in explained:
        assert run_dir in created, f"README: explain {run_dir} names no run a train line makes"
