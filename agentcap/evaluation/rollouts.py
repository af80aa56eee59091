"""Held-out evaluation: roll out a split once per item and average every reward component over ranks.

Evaluations decode greedily unless the stage samples (the policy GRPO optimises), each trajectory
from its own seed; each rank takes every ``world``-th item and the means are synced through
torchmetrics, so N processes report what one would. With a
:class:`~agentcap.evaluation.captioning.CaptionMetrics`, the captions of every rank are gathered
and rank 0 adds the papers' metrics (:mod:`agentcap.evaluation.tasks`), which every rank then
receives.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torchmetrics import MeanMetric

from agentcap.distributed import gather_objects, most, share, world
from agentcap.rollout import RolloutDriver


@torch.no_grad()
def evaluate_rollouts(
    driver: RolloutDriver,
    limit: int | None,
    chunk: int,
    greedy: bool,
    seed: int,
    device: torch.device | str = "cpu",
    captioning: Any = None,
    captions: list[dict[str, Any]] | None = None,
    items: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """Means of the reward, each component and each numeric episode extra over the first ``limit``
    items; with ``captioning``, also the papers' metrics. ``captions`` (a list) receives one row per
    evaluated item (rank 0: every rank's): id, caption, reference, reward, components, trace.
    ``items``, when given, receives this rank's per-item values (``id`` plus every averaged value),
    for paired intervals and correlations over items (:mod:`agentcap.evaluation.items`)."""
    from agentcap.evaluation.tasks import caption_row

    env = driver.scorer.unwrapped
    rows: list[dict[str, Any]] = []
    n = len(driver.scorer.unwrapped.items)
    indices = list(range(n if limit is None else min(n, limit)))
    rank, size = world()
    mine, positions = share(indices, "evaluation items")
    metrics: dict[str, MeanMetric] = {}
    chunk = max(1, chunk)
    calls = most(-(-len(mine) // chunk))  # as many rollout calls on every rank (sharded agents step together)
    for start in range(0, calls * chunk, chunk):
        part = mine[start : start + chunk]
        batch = driver.run(
            part, group_size=1, greedy=greedy, seed=seed, positions=positions[start : start + chunk], old_logprobs=False
        )
        for index, episode, score in zip(part, batch.episodes, batch.scores):
            if captioning is not None or captions is not None:
                rows.append(caption_row(env, episode, score))
            values: dict[str, Any] = {"reward": score.reward, **score.components}
            values.update({k: v for k, v in score.extras.items() if isinstance(v, (int, float))})
            for k, v in values.items():
                metrics.setdefault(k, MeanMetric().to(device)).update(float(v))
            if items is not None:
                items.append({"id": str(env.items[index].get("id", index)), **values})
    # every rank must know every name before the synced compute
    names = sorted({k for part in gather_objects(sorted(metrics)) for k in part})
    result = {}
    for k in names:
        metric = metrics.setdefault(k, MeanMetric().to(device))
        result[k] = float(metric.compute()) if metric.update_called or size > 1 else float("nan")
    if captioning is not None or captions is not None:
        every = [row for part in gather_objects(rows) for row in part]
        if captions is not None and rank == 0:
            captions.extend(every)
        if captioning is not None:
            from agentcap.evaluation.tasks import task_metrics

            by_id = {str(item["id"]): item for item in env.items}
            papers = task_metrics(env, [by_id[r["id"]] for r in every], every, captioning) if rank == 0 else None
            result.update(gather_objects(papers)[0])
    return result


def write_summary(run_dir: str, summary: dict[str, dict[str, float]], merge: bool = False) -> str:
    """``<run_dir>/summary.json``, replaced atomically; ``merge`` keeps the file's other entries
    (``validate`` / ``test`` add theirs to a training run's file)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "summary.json")
    summary = dict(summary)
    if merge and os.path.isfile(path):
        with open(path) as handle:
            summary = {**json.load(handle), **summary}
    with open(path + ".tmp", "w") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
    return path
