"""Reading a job spec file (an edge: the planner validates documents and reads no files).

``load_spec`` parses YAML or JSON, validates it (planner.spec.spec_from_dict) and makes the paths in
it relative to the file, as a user reading the file expects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from catalog.errors import InvalidInput
from planner.spec import JobSpec, ModelRef, spec_from_dict


def load_spec(path: str | Path) -> JobSpec:
    """Read a JobSpec from a YAML or JSON file; relative paths in it are relative to the file."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"spec file {str(path)!r} does not exist", hint="give the path of a YAML or JSON job spec")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                           hint="fix the file; see examples/ for well-formed specs") from None
    except yaml.YAMLError as exc:
        # str(exc) spans several lines with a source excerpt; the error must stay one line.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InvalidInput(f"{path} is not valid YAML: {problem}{where}",
                           hint="fix the file; see examples/ for well-formed specs") from None
    return rebase_paths(spec_from_dict(data), path.parent)


def _rebase(path: str, base_dir: Path) -> str:
    return path if Path(path).expanduser().is_absolute() or path.startswith("~") else str(base_dir / path)


def rebase_paths(spec: JobSpec, base_dir: Path) -> JobSpec:
    """Relative paths in a spec file are relative to that file, as a user reading it expects."""
    update: dict[str, Any] = {}
    if isinstance(spec.model, ModelRef):
        update["model"] = ModelRef(config=_rebase(spec.model.config, base_dir))
    elif "/" in spec.model and (base_dir / spec.model).exists():  # a weights folder; preset ids have no '/'
        update["model"] = _rebase(spec.model, base_dir)
    for section, fields in (("train", ("data", "tokenizer")), ("infer", ("prompts", "tokenizer"))):
        value = getattr(spec, section)
        changed = {f: _rebase(getattr(value, f), base_dir) for f in fields
                   if value is not None and getattr(value, f)}
        if changed:
            update[section] = value.model_copy(update=changed)
    return spec.model_copy(update=update) if update else spec
