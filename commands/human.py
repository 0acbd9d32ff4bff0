"""Durations and amounts in the units a person reads: a 40-second job is "40 s" and "0.3¢", not "0.0 h, $0"."""

from __future__ import annotations


def duration(hours: float) -> str:
    """Seconds under a minute, minutes under an hour, then hours (one decimal under 100 h)."""
    seconds = hours * 3600
    if seconds < 59.5:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.2g} s"
    if seconds < 3570:
        return f"{seconds / 60:.0f} min"
    return f"{hours:,.1f} h" if hours < 100 else f"{hours:,.0f} h"


def money(usd: float) -> str:
    """Cents under a dollar (two significant digits under a cent), dollars and cents under $100, then dollars."""
    if usd == 0:
        return "$0"
    if usd < 0.995:
        cents = usd * 100
        return f"{cents:.2g}¢" if cents < 1 else f"{cents:.0f}¢"
    return f"${usd:,.2f}" if usd < 100 else f"${usd:,.0f}"


def progress(p: object) -> str:
    """A running job's progress (scheduler.store.models.JobProgress) in one line: step, %, tokens/s, loss, ETA."""
    step, total = getattr(p, "step", 0), getattr(p, "total_steps", 0)
    percent, rate = getattr(p, "percent", None), getattr(p, "tokens_per_s", None)
    loss, eta = getattr(p, "loss", None), getattr(p, "eta_s", None)
    parts = [f"step {step}/{total}" + (f" ({percent:.0f}%)" if percent is not None else "")]
    if rate:
        parts.append(f"{rate:,.0f} tokens/s")
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if eta is not None:
        parts.append(f"ETA {duration(eta / 3600)}")
    return ", ".join(parts)
