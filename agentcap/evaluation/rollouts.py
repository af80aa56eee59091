"""Held-out evaluation: roll out a split once per item and average every reward component.

Evaluations decode greedily unless the stage samples (the policy GRPO optimises), each trajectory
from its own seed, which follows the item's place in the split. Each rank takes every
``world``-th item (no padding, so no item counts twice); the per-item rows of every rank are
gathered and put back in item order, and the means are taken over those rows, so N processes report
what one does, row for row and in the same order. With a
:class:`~agentcap.evaluation.captioning.CaptionMetrics`, rank 0 adds the papers' metrics
(:mod:`agentcap.evaluation.tasks`), which every rank then receives.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import torch

from agentcap.evaluation.tasks import item_row, task_metrics
from agentcap.evaluation.wer import speech_metrics
from agentcap.parallel.distributed import gather_objects, most, share, world
from agentcap.rollout.driver import RolloutDriver


@torch.no_grad()
def evaluate_rollouts(
    driver: RolloutDriver,
    limit: int | None,
    chunk: int,
    greedy: bool,
    seed: int,
    captioning: Any = None,
    rows: list[dict[str, Any]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """Means of the reward, each component and each numeric episode extra over the first ``limit``
    items (an item lacking a value, or whose value is NaN, does not count towards that mean); with
    ``captioning``, also the papers' metrics. ``rows`` (a list), on every rank, receives one row per
    evaluated item in item order (:func:`agentcap.evaluation.tasks.item_row`): what
    ``<run_dir>/eval/<stage>.jsonl`` holds. ``progress(done, total)`` hears this rank's items as they
    finish (the console's evaluation bar)."""
    env = driver.scorer.unwrapped
    n = len(env.items)
    indices = list(range(n if limit is None else min(n, limit)))
    mine, positions = share(indices, "evaluation items")
    local: list[tuple[int, dict[str, Any]]] = []
    chunk = max(1, chunk)
    calls = most(-(-len(mine) // chunk))  # as many rollout calls on every rank (sharded agents step together)
    if progress is not None:
        progress(0, len(mine))
    for start in range(0, calls * chunk, chunk):
        part = mine[start : start + chunk]
        batch = driver.run(
            part, group_size=1, greedy=greedy, seed=seed, positions=positions[start : start + chunk], old_logprobs=False
        )
        for index, episode, score in zip(part, batch.episodes, batch.scores):
            if episode.item.get("_where") != env.items[index].get("_where"):  # the row was unusable when used
                continue  # (on_error: skip, agentcap.core.unusable): left out, not counted as the row used instead
            local.append((index, item_row(env, index, episode, score)))
        if progress is not None and part:
            progress(len(local), len(mine))
    every = sorted((pair for part in gather_objects(local) for pair in part), key=lambda pair: pair[0])
    ordered = [row for _, row in every]
    result = means(ordered)
    if captioning is not None:
        papers = task_metrics(env, [env.items[i] for i, _ in every], ordered, captioning) if world()[0] == 0 else None
        result.update(gather_objects(papers)[0])
    # real-speech worlds: the WER of the quoted speech (every rank holds the gathered rows)
    result.update(speech_metrics([env.items[i] for i, _ in every], [str(r.get("caption") or "") for r in ordered]))
    if rows is not None:
        rows.extend(ordered)
    return result


def means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of every numeric field over the rows that carry it (NaN values left out; NaN when
    none is left), summed in row order, so the figure does not depend on how items were split."""
    values: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float):  # item_row stores every averaged value as a float
                values.setdefault(k, []).append(v)
    result = {}
    for k in sorted(values):
        kept = [v for v in values[k] if not math.isnan(v)]
        result[k] = sum(kept) / len(kept) if kept else float("nan")
    return result


def write_summary(run_dir: str, summary: dict[str, dict[str, float]], merge: bool = False) -> str:
    """``<run_dir>/summary.json``, replaced atomically; its path. ``merge`` keeps the file's other
    entries (``validate`` / ``test`` and ``agentcap evaluate`` add theirs to a training run's file)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "summary.json")
    summary = dict(summary)
    if merge and os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            summary = {**json.load(handle), **summary}
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
    return path
