"""The product (contract, infra, bootstrap, trainer, ops) never imports its test bed (localpod,
demo, bench): not at module level, not inside a function, not by name through importlib. The test
bed reaches the CLI through the `tpupod.commands` entry points it declares (ops/cli.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("contract", "infra", "bootstrap", "trainer", "ops")
TEST_BED = ("localpod", "demo", "bench")
_BY_NAME = re.compile(rf"^({'|'.join(TEST_BED)})(\.\w+)*(:\w+)?$")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, and every string that names a test-bed
    module (what importlib.import_module, __import__ or an entry point would be handed)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, node.value)] if _BY_NAME.match(node.value) else []
    return sorted(found)


def test_the_product_never_imports_the_test_bed():
    assert violations_in(REPO, PRODUCT) == []


def test_the_rule_sees_every_way_in(tmp_path):
    """A negative control: each way of reaching the test bed is caught."""
    pkg = tmp_path / "ops"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import localpod.pod\n"
        "def f():\n    from bench import campaign\n"
        "import importlib\nimportlib.import_module('localpod.cli')\n"
        "x = 'benchmark'  # a word, not a module\n"
    )
    found = [v.split(": ", 1)[1] for v in violations_in(tmp_path, ("ops",))]
    assert found == ["localpod.pod", "bench", "localpod.cli"]


def violations_in(repo: Path, roots) -> list[str]:
    bad = []
    for root in roots:
        for path in sorted((repo / root).rglob("*.py")):
            for line, module in imports(path):
                if module.split(".")[0].split(":")[0] in TEST_BED:
                    bad.append(f"{path.relative_to(repo)}:{line}: {module}")
    return bad


PACKAGES = (*PRODUCT, *TEST_BED)
TPUPOD = (*PACKAGES, "tools")


def leaf_violations(repo: Path, leaf: str = "contract") -> list[str]:
    """Imports of any tpupod package from `leaf` (what every side imports must import none)."""
    return [f"{path.relative_to(repo)}:{line}: {module}"
            for path in sorted((repo / leaf).rglob("*.py"))
            for line, module in imports(path)
            if module.split(".")[0] in TPUPOD and module.split(".")[0] != leaf]  # fmt: skip


def test_contract_imports_nothing_of_tpupod():
    assert (REPO / "contract").is_dir()
    assert leaf_violations(REPO) == []


def test_the_leaf_rule_sees_an_import(tmp_path):
    """A negative control: a contract module importing infra (or ops, in a function) is caught."""
    (tmp_path / "contract").mkdir()
    (tmp_path / "contract" / "m.py").write_text(
        "import json\nfrom infra import catalog\ndef f():\n    import ops.cloud.tpu\n"
    )
    found = [v.split(": ", 1)[1] for v in leaf_violations(tmp_path)]
    assert found == ["infra", "ops.cloud.tpu"]


def module_graph(repo: Path, roots) -> dict[str, set[str]]:
    """module -> the project modules it imports (at any depth of the file, `from p import m` as
    p.m when m is a module)."""
    files = {}
    for root in roots:
        for path in (repo / root).rglob("*.py"):
            parts = path.relative_to(repo).with_suffix("").parts
            if {"out", "__pycache__"} & set(parts):  # bench/out: runs' copies of the bundle
                continue
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                edges |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                          else node.module for a in node.names}  # fmt: skip
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert circles(module_graph(REPO, PACKAGES)) == []


def test_a_circle_is_seen_even_through_a_function_level_import(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "a.py").write_text("from ops import b\n")
    (tmp_path / "ops" / "b.py").write_text("def f():\n    import ops.c\n")
    (tmp_path / "ops" / "c.py").write_text("from ops.a import x\n")
    assert circles(module_graph(tmp_path, ("ops",))) == [["ops.a", "ops.b", "ops.c"]]


# Who may not import whom (importer's room -> rooms it must not reach): the built-in job is a
# job (infra and ops never import trainer); the local cloud is Google's side of the wire
# (localpod never imports ops); inside ops the rooms only look down: cloud < fleet < watch <
# commands (docs/architecture.md).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "infra": ("trainer", "ops"),
    "ops": ("trainer",),
    "localpod": ("ops", "demo"),
    "ops/cloud": ("ops.fleet", "ops.watch", "ops.commands"),
    "ops/fleet": ("ops.watch", "ops.commands"),
    "ops/watch": ("ops.commands",),
}


def reaching(repo: Path, room: str, targets: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(repo)}:{line}: {module}"
            for path in sorted((repo / room).rglob("*.py"))
            for line, module in imports(path)
            if any(module == t or module.startswith(t + ".") for t in targets)]  # fmt: skip


def test_each_room_imports_only_downwards():
    bad = [v for room, targets in FORBIDDEN.items() for v in reaching(REPO, room, targets)]
    assert bad == []


def test_the_direction_rule_sees_a_wrong_arrow(tmp_path):
    """A negative control: infra importing the trainer (in a function), fleet importing watch."""
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "m.py").write_text("def f():\n    from trainer.config import PRESETS\n")
    (tmp_path / "ops" / "fleet").mkdir(parents=True)
    (tmp_path / "ops" / "fleet" / "m.py").write_text("import ops.watch.remote_state\n")
    assert reaching(tmp_path, "infra", FORBIDDEN["infra"]) == ["infra/m.py:2: trainer.config"]
    assert reaching(tmp_path, "ops/fleet", FORBIDDEN["ops/fleet"]) == [
        "ops/fleet/m.py:1: ops.watch.remote_state"
    ]
