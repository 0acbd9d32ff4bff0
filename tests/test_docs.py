"""The docs hold to the tree: every folder docs/ARCHITECTURE.md draws exists, every relative link in the README and
docs/ lands on a file (and on a heading, where it names one), and every docs/ or bench/ file the repository names
is there. Read from the files themselves, so a move that forgets a reference fails here, not in a reader's hands."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Records of the measurements' raw output and frozen test inputs name paths as they were when written.
NOT_READ = ("bench/results/", "tests/planner/data/golden/", "docs/lab-notes/test-suite-runs/")
# Scripts a lab-notes entry ran and names, since removed (their code is in git history, as the entry says).
REMOVED_SINCE = {"bench/spot_phases_probe.py"}
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".jsonl", ".txt", ".png", ".toml", ".html", ".patch")
FENCE = re.compile(r"^\s*```")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
NAMED = re.compile(r"(?<![\w/.-])((?:docs|bench)/[\w./*-]*[\w*/])")


def drawing() -> list[str]:
    """The paths ARCHITECTURE.md's drawing names (the first ```text block after "## The drawing"), each from the
    repository root: a line's depth is where its name starts, in steps of four columns."""
    text = (DOCS / "ARCHITECTURE.md").read_text()
    block = text.split("## The drawing", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    assert lines[0].strip() == "gpuplan/", "the drawing starts at the repository root"
    stack: list[str] = []
    paths = []
    for line in lines[1:]:
        name_at = re.search(r"[^\s│├└─]", line)
        assert name_at, line
        depth = name_at.start() // 4 - 1
        name = line[name_at.start():].split()[0]
        stack[depth:] = [name]
        paths.append("".join(stack))
    return paths


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "test-suite-runs" not in p.parent.name)]


def outside_fences(path: Path) -> Iterator[tuple[int, str]]:
    """A Markdown file's numbered lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown file's headings; a repeated heading's anchor gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    for _, line in outside_fences(path):
        match = re.match(r"#+\s+(.*)", line)
        if match:
            base = slug(match.group(1))
            seen[base if base not in seen else f"{base}-{seen[base]}"] = 0
            seen[base] = seen.get(base, 0) + 1
    return frozenset(seen)


def test_the_drawing_is_read_as_nested_paths() -> None:
    paths = drawing()
    assert "scheduler/api/routers/" in paths and "bench/accuracy/" in paths and "errors.py" in paths
    assert len(paths) == len(set(paths))


@pytest.mark.parametrize("path", drawing())
def test_every_path_the_architecture_drawing_names_exists(path: str) -> None:
    assert (ROOT / path).exists(), f"docs/ARCHITECTURE.md draws {path}, which the tree lacks"


def test_every_relative_link_in_the_docs_lands() -> None:
    broken = []
    for md in markdown_files():
        for number, line in outside_fences(md):
            for target in LINK.findall(re.sub(r"`[^`]*`", "``", line)):  # a link in a code span is no link
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = (md.parent / file).resolve() if file else md
                where = f"{md.relative_to(ROOT)}:{number}: {target}"
                if not dest.exists():
                    broken.append(where)
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "links that land nowhere:\n" + "\n".join(broken)


def test_the_lab_notes_index_lists_every_entry() -> None:
    index = (DOCS / "lab-notes" / "README.md").read_text()
    listed = set(re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", index))
    entries = {p.name for p in (DOCS / "lab-notes").glob("*.md")} - {"README.md"}
    assert entries <= listed, f"entries the index lacks: {sorted(entries - listed)}"


def tracked_text_files() -> Iterator[Path]:
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        path = ROOT / name
        if name.startswith(NOT_READ) or path.suffix in {".png", ".json", ".csv", ".patch", ".jsonl"}:
            continue
        if path.is_file():
            yield path


def test_every_docs_and_bench_file_the_repository_names_exists() -> None:
    missing = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for match in NAMED.finditer(text):
            named = match.group(1).rstrip(".")
            # a file (it has a file's suffix) or a folder (named with its slash); not "bench/docs" in prose, nor a
            # function named by its module's path ("bench/accuracy/fsdp_run.planned")
            if not (named.endswith("/") or named.endswith(SUFFIXES)) or named in REMOVED_SINCE:
                continue
            found = list(ROOT.glob(named)) if "*" in named else [ROOT / named] if (ROOT / named).exists() else []
            if not found:
                line = text.count("\n", 0, match.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: {named}")
    assert not missing, "names of docs/ and bench/ files the tree lacks:\n" + "\n".join(missing)
