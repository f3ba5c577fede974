"""The shape of the core's code (issue 15): no function of the mechanisms' packages
(general/, feature/, query/) is longer than 80 lines, docstring included, so each reads
as one step of its formula. Complexity is checked by ruff (C901, max 12, pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"
CORE = ("general", "feature", "query")
MAX_LINES = 80


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` for every function or method longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return found


@pytest.mark.parametrize("package", CORE)
def test_no_core_function_is_longer_than_80_lines(package: str) -> None:
    too_long = long_functions(SRC / package, MAX_LINES)
    assert not too_long, "split these into named steps:\n" + "\n".join(too_long)


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n", encoding="utf-8")
    assert long_functions(tmp_path, MAX_LINES) == [f"m.py:1 f ({MAX_LINES + 1} lines)"]
    assert long_functions(tmp_path, MAX_LINES + 1) == []
