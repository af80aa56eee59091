"""The results table printed at the end of every command that evaluates: stages × metrics."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

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
    """One row per metric, one column per evaluated stage, as plain text (rich's ASCII table without
    its frame, so logs and ``grep`` read it); stages named in ``order`` (the schedule's) come first,
    in that order, then the rest as given."""
    stages = [s for s in order if s in summary] + [s for s in summary if s not in order]
    # keys starting with "_" annotate a stage (``_limit``: evaluated on part of the split) in its header
    metrics = sorted({k for values in summary.values() for k in values if not k.startswith("_")}, key=_order)
    if not stages or not metrics:
        return f"{title}: nothing evaluated"
    table = Table(box=box.ASCII, show_edge=False, pad_edge=False, header_style="")
    table.add_column("metric", no_wrap=True)
    for stage in stages:
        limit = summary[stage].get("_limit")
        table.add_column(f"{stage} ({limit})" if limit else stage, justify="right", no_wrap=True)
    for m in metrics:
        table.add_row(m, *(_cell(summary[s].get(m)) for s in stages))
    console = Console(file=io.StringIO(), width=100_000, color_system=None, highlight=False)
    with console.capture() as captured:
        console.print(table)
    # the title on a line of its own: rich would wrap it to the table's width
    return "\n".join([title, *(line.rstrip() for line in captured.get().splitlines() if line.strip())])
