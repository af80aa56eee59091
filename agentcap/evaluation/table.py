"""The results table printed at the end of every command that evaluates: stages × metrics."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from agentcap.evaluation.captioning import CAPTION_METRICS

#: The papers' metrics, in the order they appear in the table (after the reward and its components).
PAPER_METRICS = (*CAPTION_METRICS, "recall@5/16", "recall@1/5", "logp", "masked_logp", "ppl",
                 "cloze_accuracy", "esr", "mcq_accuracy", "g2p", "tiou")


def _order(name: str) -> tuple:
    if name in PAPER_METRICS:
        return (1, PAPER_METRICS.index(name), name)
    return (0, name != "reward", name)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)


def results_table(
    summary: Mapping[str, Mapping[str, float]], title: str = "held-out results", order: Sequence[str] = ()
) -> str:
    """One row per metric, one column per evaluated stage, as plain text; stages named in ``order``
    (the schedule's) come first, in that order, then the rest as given."""
    stages = [s for s in order if s in summary] + [s for s in summary if s not in order]
    metrics = sorted({k for values in summary.values() for k in values}, key=_order)
    if not stages or not metrics:
        return f"{title}: nothing evaluated"
    rows = [["metric", *stages]] + [[m, *(_cell(summary[s].get(m)) for s in stages)] for m in metrics]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [" | ".join(cell.rjust(w) if c else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([title, lines[0], rule, *lines[1:]])
