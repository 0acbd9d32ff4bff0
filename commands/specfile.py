"""Reading a job spec file (an edge: the planner validates documents and reads no files).

``load_spec`` parses YAML or JSON, validates it (planner.spec.spec_from_dict) and makes the paths in
it absolute against the file's folder, as a user reading the file expects: the spec then means the same in
this process and on a server, whose working directory is not the user's (workers.spec_files). Text data with
no tokenizer is refused here, before it is planned or submitted.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

import yaml

from errors import InvalidInput
from planner.spec import JobSpec, ModelRef, fit_defaults, spec_from_dict


def load_spec(path: str | Path) -> JobSpec:
    """Read a JobSpec from a YAML or JSON file; relative paths in it are relative to the file."""
    path = Path(path)
    if path.is_dir():
        raise InvalidInput(f"spec file {str(path)!r} is a directory", hint="give the path of a YAML or JSON job spec "
                           "file in it (see examples/)")
    if not path.is_file():
        raise InvalidInput(f"spec file {str(path)!r} does not exist", hint="give the path of a YAML or JSON job spec")
    text = _read_text(path)
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
    spec = _fit_to_model(size_from_prompts(rebase_paths(spec_from_dict(data), path.parent)))
    from workers.spec_files import check_text_data

    check_text_data(spec)
    return spec


# A text file's byte order mark and its encoding; longest first (UTF-32's little-endian mark starts as UTF-16's).
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _read_text(path: Path) -> str:
    """The file's text: UTF-8, or UTF-16/32 with a byte order mark (as some Windows editors save); else an error
    that says so, never a traceback."""
    raw = path.read_bytes()
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path} is not {encoding.upper()} text (byte 0x{raw[exc.start]:02x} at offset "
                           f"{exc.start})", hint="save the spec as UTF-8 text") from None


def _fit_to_model(spec: JobSpec) -> JobSpec:
    """The spec with the lengths it leaves to their defaults fitted to its model's context (planner.spec.
    fit_defaults), so a submitted spec carries them; a model that does not resolve is left for the plan to
    report with the spec's other problems."""
    from catalog.loader import load_catalog, resolve_model
    from errors import GpuplanError

    try:
        model = resolve_model(load_catalog(), spec.model.config if isinstance(spec.model, ModelRef) else spec.model)
    except GpuplanError:
        return spec
    return fit_defaults(spec, model)


def _rebase(path: str, base_dir: Path) -> str:
    if path.startswith("~"):
        return str(Path(path).expanduser())
    return path if Path(path).is_absolute() else str(base_dir.resolve() / path)


def rebase_paths(spec: JobSpec, base_dir: Path) -> JobSpec:
    """Relative paths in a spec file are relative to that file, as a user reading it expects; they come back
    absolute (``~`` expanded), so they mean the same to a server whose working directory is another."""
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


def size_from_prompts(spec: JobSpec) -> JobSpec:
    """A prompts file says how long its prompts are and how many there are: unless the spec sets them,
    ``infer.prompt_tokens`` is the longest prompt's token count (the workers' tokenizer: the spec's, the one
    saved beside the model's weights, else byte-level) and ``infer.requests`` the number of prompts, so the
    plan, its price and the context check are about the prompts that will run, not the defaults (1,024
    tokens, 1,000 requests). A missing or malformed file is left to the run, which says what to fix."""
    infer = spec.infer
    if spec.task != "infer" or infer is None or not infer.prompts:
        return spec
    unset = {"prompt_tokens", "requests"} - infer.model_fields_set
    path = Path(infer.prompts).expanduser()
    if not unset or not path.is_file():
        return spec
    # workers.infer.files, not workers.infer.generate: reading a spec must not import torch
    from workers.infer.files import ByteTokenizer, HfTokenizer, Tokenizer, infer_tokenizer_dir, prompt_lengths

    weights = Path(spec.model).expanduser() if isinstance(spec.model, str) else None
    folder = infer_tokenizer_dir(infer.tokenizer, weights if weights is not None and weights.is_dir() else None)
    tokenizer: Tokenizer = HfTokenizer(folder) if folder is not None else ByteTokenizer()
    lengths = prompt_lengths(path, tokenizer)
    sized = {"prompt_tokens": max(lengths), "requests": float(len(lengths))}
    return spec.model_copy(update={"infer": infer.model_copy(update={k: sized[k] for k in unset})})
