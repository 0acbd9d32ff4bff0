"""`gpuplan run`'s progress line: the job, a bar, and its numbers, fitted to the terminal. Numbers are never
cut: as the terminal narrows the bar shrinks, then the least useful words go (cost, loss, tok/s), then the
bar shrinks to a cell and the words wrap between them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Column

BAR_MAX = 40
BAR_MIN = 8  # the bar shrinks to this before a word goes


def _eta(seconds: float | None) -> str:
    return "-:--:--" if seconds is None else str(timedelta(seconds=round(seconds)))


def progress_parts(*, infer: bool, state: str, step: int, total: int | None, loss: float | None,
                   rate: float | None, eta_s: float | None) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The words before the bar and after it, each with the priority it is dropped at (0: never; the highest
    goes first): the step count never goes; the state, the ETA and tok/s go last."""
    done = f"{step:,}/{total:,}" if total else f"{step:,}"
    head = [(state, 1)]
    if infer:
        return head, [(f"{done} prompts", 0), (f"ETA {_eta(eta_s)}", 2), ("cost $0.00 (local)", 5)]
    return head, [(done, 0), (f"loss {loss:.4f}" if loss is not None else "loss -", 4),
                  (f"{rate:,.0f} tok/s" if rate else "- tok/s", 3), (f"ETA {_eta(eta_s)}", 2),
                  ("cost $0.00 (local)", 5)]


def fit_progress(width: int, name: str, head: list[tuple[str, int]],
                 tail: list[tuple[str, int]]) -> tuple[str, int, str]:
    """(the words before the bar, its width, the words after it) that fit ``width`` on one line: the bar
    shrinks to BAR_MIN before any word goes; words are kept lowest priority first while they fit; none is
    ever shortened."""
    parts = head + tail

    def line(kept: set[int]) -> tuple[str, int, str]:
        words = [parts[i][0] for i in range(len(head)) if i in kept]
        before = " ".join([f"{name}:", *words]) if words else name
        after = " ".join(parts[i][0] for i in range(len(head), len(parts)) if i in kept)
        return before, width - cell_len(before) - cell_len(after) - 2, after  # a space either side of the bar

    kept = {i for i, (_, drop) in enumerate(parts) if not drop}
    for i in sorted((i for i, (_, drop) in enumerate(parts) if drop), key=lambda i: parts[i][1]):
        if line(kept | {i})[1] >= BAR_MIN:
            kept.add(i)
    before, room, after = line(kept)
    return before, max(1, min(BAR_MAX, room)), after


def progress_bar(console: Console, name: str, *, infer: bool) -> tuple[Progress, Callable[[Any], None]]:
    """The live progress display on ``console`` and the function that shows a worker's RunStatus on it."""
    bar = BarColumn(bar_width=BAR_MAX)
    progress = Progress(TextColumn("{task.description}", style="bold", table_column=Column(no_wrap=True)), bar,
                        # the last resort: the words wrap between them (never inside a number)
                        TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")),
                        console=console, transient=False)
    task = progress.add_task(f"{name}: starting", total=None, info="")

    def show(status: Any) -> None:
        p = status.progress
        progress.update(task, completed=p.step, total=p.total_steps or None)
        head, tail = progress_parts(infer=infer, state=status.state.value, step=p.step,
                                    total=p.total_steps or None, loss=p.loss, rate=p.tokens_per_s,
                                    eta_s=progress.tasks[0].time_remaining)
        description, bar.bar_width, info = fit_progress(console.width, name, head, tail)
        progress.update(task, description=description, info=info)

    return progress, show
