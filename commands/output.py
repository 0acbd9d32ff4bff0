"""How every command prints: one console pair, width-fitted tables, JSON, the error decorator, and the
money / GiB formats. Command modules print through ``output.console`` / ``output.err_console`` (looked up
at call time, so a test can swap them for a console of a given width)."""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import typer
from pydantic import BaseModel
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from errors import GpuplanError

P = ParamSpec("P")
R = TypeVar("R")

def make_console(*, stderr: bool = False, width: int | None = None) -> Console:
    """The one way the CLI prints. Markup is off: text from a message, a spec or a table cell prints as
    written ('[aws]' stays), and styling is given as Text / style=, never as markup inside a string."""
    return Console(stderr=stderr, width=width, markup=False)


console = make_console()
err_console = make_console(stderr=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and (text, style) pairs; nothing in them is parsed as markup."""
    return Text.assemble(*parts)


@dataclass(frozen=True)
class Col:
    """A table column. ``drop``: 0 never; otherwise the columns kept are chosen lowest ``drop`` first while
    they fit the terminal, and the caption names the rest. ``wrap``: free text that may wrap between words
    (and fold a word longer than its column); every other cell (ids, names users copy, numbers, states) is
    never wrapped nor shortened."""

    header: str
    right: bool = False
    drop: int = 0
    wrap: bool = False


_TABLE_EDGE = 1  # the left border; each column adds 2 of padding and 1 of border on its right
_FOLD_WORD = 16  # free text narrower than its longest word folds that word; below this it reads badly


def _widths(col: Col, cells: list[str]) -> tuple[int, int]:
    """(narrowest, natural) width: ids and numbers never shrink; text and headers wrap between words only."""
    header_word = max([0, *(cell_len(w) for w in col.header.split())])
    if not col.wrap:
        fixed = max([header_word, *(cell_len(c) for c in cells)])
        return fixed, max(fixed, cell_len(col.header))
    longest = max([0, *(cell_len(w) for c in cells for w in c.split())])
    narrowest = max(header_word, min(longest, _FOLD_WORD))
    return narrowest, max([narrowest, cell_len(col.header), *(cell_len(c) for c in cells)])


def _column_widths(spans: list[tuple[int, int]], wrap: list[bool], width: int) -> list[int] | None:
    """Widths that fit ``width`` (None if even the narrowest do not): numbers at their full width, the
    space left shared by the text columns in proportion to how much they would use."""
    room = width - _TABLE_EDGE - 3 * len(spans)
    widths = [lo for lo, _ in spans]
    if sum(widths) > room:
        return None
    spare = room - sum(widths)
    for i, (lo, hi) in enumerate(spans):  # fixed columns first take their natural width (whole headers)
        if not wrap[i]:
            extra = min(hi - lo, spare)
            widths[i] += extra
            spare -= extra
    want = [hi - lo if wrap[i] else 0 for i, (lo, hi) in enumerate(spans)]
    total = sum(want)
    for i, w in enumerate(want):
        if w:
            widths[i] += w if spare >= total else spare * w // total
    return widths


def _fits(cols: list[Col], plain: list[list[str]], keep: list[int], width: int) -> list[int] | None:
    spans = [_widths(cols[i], [r[i] for r in plain]) for i in keep]
    return _column_widths(spans, [cols[i].wrap for i in keep], width)


def fit_table(title: str, cols: list[Col], rows: list[list[str | Text]], width: int) -> tuple[Table | None, list[str]]:
    """A table that fits ``width`` without cutting an id, a name or a number: the columns that never drop,
    then the others lowest ``drop`` first while they still fit. Returns the table and the headers left out;
    the table is None when even the columns that never drop are too wide (print_table then prints a record
    per row instead). Headers and text wrap between words only."""
    plain = [[c.plain if isinstance(c, Text) else c for c in row] for row in rows]
    keep = [i for i, c in enumerate(cols) if not c.drop]
    if _fits(cols, plain, keep, width) is None:
        return None, []
    for i in sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: (cols[i].drop, i)):
        if _fits(cols, plain, sorted([*keep, i]), width) is not None:
            keep = sorted([*keep, i])
    widths = _fits(cols, plain, keep, width)
    assert widths is not None
    table = Table(title=title, title_justify="left")
    for n, i in enumerate(keep):
        col = cols[i]
        table.add_column(Text(col.header, no_wrap=False, overflow="fold"), justify="right" if col.right else "left",
                         no_wrap=not col.wrap, overflow="fold", width=widths[n])
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table, [c.header for i, c in enumerate(cols) if i not in keep]


def print_fields(title: str, fields: list[tuple[str, str]]) -> None:
    """A title, then one 'name: value' line per field: words wrap at the terminal's width, nothing is cut."""
    console.print(title, style="italic", highlight=False)
    for name, value in fields:
        console.print(Text.assemble((f"{name}:", "bold"), f" {value}"), highlight=False)


def _print_records(title: str, cols: list[Col], rows: list[list[str | Text]]) -> None:
    """Rows as 'header: value' lines, for a terminal too narrow for even the columns that never drop."""
    console.print(f"(too narrow for this table at {console.width} columns: one line per field; widen the "
                  "terminal or use --json)", style="dim", highlight=False)
    for n, row in enumerate(rows):
        print_fields(title if n == 0 else "", [(c.header, cell.plain if isinstance(cell, Text) else cell)
                                              for c, cell in zip(cols, row, strict=True)])


def print_table(title: str, cols: list[Col], rows: list[list[str | Text]]) -> None:
    """Print a width-fitted table; name the columns a narrow terminal hid (--json has them all)."""
    table, dropped = fit_table(title, cols, rows, console.width)
    if table is None:
        _print_records(title, cols, rows)
        return
    console.print(table)
    if dropped:
        console.print(f"({', '.join(dropped)} hidden at {console.width} columns; widen the terminal or use --json)",
                      style="dim", highlight=False)


def escape_help(group: typer.Typer) -> None:
    """Help texts are rich markup to typer: escape every command's and option's help once, so '[default: ...]'
    and other bracketed text in them print as written."""
    if group.info.help and isinstance(group.info.help, str):
        group.info.help = escape(group.info.help)
    for command in group.registered_commands:
        callback = command.callback
        if callback is None:
            continue
        if command.help:
            command.help = escape(command.help)
        if callback.__doc__:
            callback.__doc__ = escape(callback.__doc__)
        for param in inspect.signature(callback).parameters.values():
            info = param.default
            if isinstance(info, typer.models.ParameterInfo) and info.help:
                info.help = escape(info.help)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            escape_help(sub.typer_instance)


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
                # One line however long; the consoles read no markup, so a quoted input prints as written.
                err_console.print(styled(("error:", "bold red"), f" {exc}"), highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")


def warn(text: str) -> None:
    """One warning line on stderr (never on stdout, so --json stays clean)."""
    err_console.print(styled(("warning:", "yellow"), f" {text}"), highlight=False)


def money(value: float | None) -> str:
    """A catalog price: cents above $10, a tenth of a cent below."""
    return "-" if value is None else f"{value:,.2f}" if value >= 10 else f"{value:.3f}"


def usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f}"
