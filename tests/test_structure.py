"""The shape of the code: imports flow one way (cli -> commands -> scheduler -> workers -> planner ->
catalog) with no cycle between gpuplan modules, and the planner's core reads no files.

Read from the source with ast, so a function-level (lazy) import counts like a top-level one: deferring
an import hides a cycle from Python, not from the reader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("cli", "commands", "scheduler", "workers", "planner", "catalog", "errors")  # each imports only those after it
PACKAGES = LAYERS[1:-1]
PURE_PLANNER_EXEMPT = {"planner.calibration"}  # the calibration's types and its loader, which edges call
FILE_ACCESS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "getenv", "environ",
               "load_calibration", "load_user_calibration", "load_catalog", "load_spec"}


def _modules() -> dict[str, Path]:
    found = {"cli": ROOT / "cli.py", "errors": ROOT / "errors.py"}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The gpuplan module ``name`` lives in (an attribute's module), or None outside gpuplan."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(tree: ast.Module) -> Iterator[str]:
    """Every gpuplan module an import statement anywhere in ``tree`` names; ``from a import b`` names
    the submodule a.b when there is one, else a itself."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield sub if sub in MODULES else node.module


@cache
def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {_owner(t) for t in _imported(ast.parse(path.read_text(), str(path)))}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
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


def test_cycles_are_found_where_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_gpuplan_modules() -> None:
    found = cycles(import_graph())
    assert not found, "modules that import each other (directly or round a loop): " + "; ".join(
        " <-> ".join(c) for c in found)


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_flow_down_the_layers(layer: str) -> None:
    above = set(LAYERS[: LAYERS.index(layer)])
    upward = sorted(f"{src} imports {dst}" for src, targets in import_graph().items()
                    if src.split(".")[0] == layer for dst in targets if dst.split(".")[0] in above)
    assert not upward, f"{layer} may import only {LAYERS[LAYERS.index(layer) + 1:]}: " + "; ".join(upward)


def test_the_planner_core_reads_no_files_and_no_environment() -> None:
    touching = []
    for name, path in MODULES.items():
        if name.split(".")[0] != "planner" or name in PURE_PLANNER_EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            called = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
            if called in FILE_ACCESS:
                touching.append(f"{name}:{node.lineno} {called}")  # type: ignore[attr-defined]
    assert not touching, "the planner takes values; read files and the environment at the edge: " + ", ".join(
        touching)


def _layout_rows() -> dict[str, str]:
    """The README's Layout table: path -> what it says about it."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_the_readme_layout_names_every_top_level_part_and_only_files_that_exist() -> None:
    rows = _layout_rows()
    top = {f"{p.name}/" for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    top |= {"cli.py", "errors.py"}
    top |= {"bench/", "docs/", "examples/"}
    assert top <= rows.keys(), f"the README's Layout table lacks {sorted(top - rows.keys())}"
    missing = []
    for path, what in rows.items():
        if not (ROOT / path).exists():
            missing.append(path)
        for named in what.split("`")[1::2]:
            if named.endswith((".py", ".json", "/")) and not any(
                    (base / named).exists() for base in (ROOT / path, ROOT, ROOT / path / "..")):
                missing.append(f"{named} (in the {path} row)")
    assert not missing, "the README's Layout table names what the tree lacks: " + ", ".join(missing)


def test_no_class_name_is_defined_in_two_modules_and_no_module_name_twice_in_a_floor() -> None:
    """A reader who meets ``Placement`` or ``placement.py`` should find one of each, not three."""
    homes: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(name)
    twice = {cls: where for cls, where in homes.items() if len(where) > 1}
    assert not twice, f"class names defined in more than one module: {twice}"
    leaves: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            leaves.setdefault(path.name, []).append(name)
    assert len(leaves.get("placement.py", [])) <= 1, leaves["placement.py"]


def test_no_module_over_450_lines_and_no_function_over_70() -> None:
    """Small modules with one job each (bench/ and migrations are exempt: MODULES leaves them out)."""
    too_long = [f"{name} ({n} lines)" for name, path in MODULES.items()
                if (n := len(path.read_text().splitlines())) > 450]
    assert not too_long, "modules over 450 lines: " + ", ".join(too_long)
    functions = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and node.end_lineno is not None and (n := node.end_lineno - node.lineno + 1) > 70:
                functions.append(f"{name}.{node.name} ({n} lines)")
    assert not functions, "functions over 70 lines: " + ", ".join(functions)
