"""A newcomer reads ops/ and trainer/ a screen at a time: no module over MAX_LINES and no
function over MAX_FUNCTION_LINES (issue 49). A long one is split where its concerns part."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ops", "trainer")
MAX_LINES, MAX_FUNCTION_LINES = 300, 60


def too_long(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(root.parent)
        if (lines := len(source.splitlines())) > MAX_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno}: {node.name}() is {length} lines")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_long_module_or_function(package):
    assert too_long(REPO / package) == []


def test_the_check_finds_a_long_module_and_a_long_function(tmp_path):
    """A negative control: a planted 301-line module with a 61-line function is named twice."""
    pkg = tmp_path / "ops"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (pkg / "big.py").write_text("def f():\n" + body + "\n" * (MAX_LINES - 61 + 1))
    assert too_long(pkg) == ["ops/big.py: 301 lines", "ops/big.py:1: f() is 61 lines"]
