"""Prometheus text exposition of the scheduler's state (no client library needed for two gauges)."""

from __future__ import annotations


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_prometheus(jobs: dict[tuple[str, str], int], spend: dict[tuple[str, str], float]) -> str:
    lines = ["# HELP gpuplan_jobs Jobs by team and state.", "# TYPE gpuplan_jobs gauge"]
    for (team, state), n in sorted(jobs.items()):
        lines.append(f'gpuplan_jobs{{team="{_label(team)}",state="{_label(state)}"}} {n}')
    lines += ["# HELP gpuplan_spend_usd_total Recorded spend (price at launch x hours) by team and market.",
              "# TYPE gpuplan_spend_usd_total counter"]
    for (team, market), usd in sorted(spend.items()):
        lines.append(f'gpuplan_spend_usd_total{{team="{_label(team)}",market="{_label(market)}"}} {usd:.6f}')
    return "\n".join(lines) + "\n"
