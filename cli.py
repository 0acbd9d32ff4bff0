"""The `gpuplan` command line. Thin: parse, call a package, render (rich table or --json).

Each command group lives in its own section below; keep rendering here and logic in the packages.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console

from catalog.errors import GpuplanError

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="gpuplan",
    help="Cost-aware GPU job planner and scheduler.\n\nExamples:\n\n"
    "  gpuplan plan examples/llama3-8b-sft.yaml\n\n"
    "  gpuplan estimate examples/llama3-8b-sft.yaml --gpu H200 --count 1 --json\n\n"
    "  gpuplan catalog offers --gpu H100 --spot\n\n"
    "  gpuplan run examples/tiny-train.yaml",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, default=str) + "\n")


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Print a GpuplanError as one actionable line and exit with its code (no traceback)."""

    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except GpuplanError as exc:
            if kwargs.get("as_json"):
                print_json({"error": exc.to_dict()})
            else:
                err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")

# ---------------------------------------------------------------- catalog (issue 2: catalog)

# ---------------------------------------------------------------- plan / estimate (issue 2: planner)

# ---------------------------------------------------------------- run (issue 3: workers)

# ---------------------------------------------------------------- scheduler (issue 4)

# ---------------------------------------------------------------- spot economics (issue 5)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
