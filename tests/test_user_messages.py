"""What users read points at what users have: the README, docs/ and --help, never DESIGN.md
(a contributors' file that does not ship). Messages are string literals in the code (docstrings
aside; the API models' docstrings are checked through the OpenAPI schema they end up in)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from catalog.loader import load_catalog
from errors import InvalidInput
from planner.spec import spec_from_dict
from scheduler.api import create_app
from scheduler.service import SchedulerService
from scheduler.store.database import Store
from tests.scheduler.conftest import toy_plan

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["cli.py", "commands", "catalog", "planner", "scheduler", "workers", "bench", "examples", "docs", "README.md"]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]


def _shipped(suffixes: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for name in SHIPPED:
        path = ROOT / name
        files.extend([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in suffixes))
    return [p for p in files if p.suffix in suffixes and "migrations" not in p.parts]


def test_no_message_in_the_code_points_at_design_md() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}" for path in _shipped((".py",))
             for line, text in _literals(path) if "DESIGN" in text]
    assert found == []


def test_no_doc_users_read_points_at_design_md() -> None:
    # The README's last line tells contributors where the design lives; nothing else may.
    found = [f"{path.relative_to(ROOT)}:{n}" for path in _shipped((".md", ".yaml", ".html"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "DESIGN" in line and "architecture and contracts" not in line]
    assert found == []


def test_an_unknown_spec_field_points_at_the_readme() -> None:
    with pytest.raises(InvalidInput) as info:
        spec_from_dict({"task": "train", "model": "gpt2", "train": {"tokens": 1e6, "tokenz": 1}})
    assert "README's 'Job spec'" in str(info.value) and "DESIGN" not in str(info.value)
    readme = (ROOT / "README.md").read_text()
    assert "## Job spec" in readme


def test_the_api_schema_points_at_the_readme(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        service = SchedulerService(store, toy_plan, checkpoint_root=str(tmp_path))
        schema = json.dumps(create_app(service, load_catalog()).openapi())
    finally:
        store.dispose()
    assert "DESIGN" not in schema and "README's 'Job spec'" in schema
