"""Held-out evaluation: roll out a split once per item and average every reward component over ranks.

Evaluations decode greedily unless the stage samples (the policy GRPO optimises); each rank takes
every ``world``-th item and the means are synced through torchmetrics, so N processes report what
one would.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torchmetrics import MeanMetric

from agentcap.distributed import gather_objects, world
from agentcap.rollout import RolloutDriver


@torch.no_grad()
def evaluate_rollouts(
    driver: RolloutDriver,
    limit: int | None,
    chunk: int,
    greedy: bool,
    seed: int,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Means of the reward, each component and each numeric episode extra over the first ``limit`` items."""
    n = len(driver.scorer.unwrapped.items)
    indices = list(range(n if limit is None else min(n, limit)))
    rank, size = world()
    mine = indices[rank::size]
    metrics: dict[str, MeanMetric] = {}
    chunk = max(1, chunk)
    torch.manual_seed(seed + rank)
    for start in range(0, len(mine), chunk):
        batch = driver.run(mine[start : start + chunk], group_size=1, greedy=greedy, old_logprobs=False)
        for score in batch.scores:
            values: dict[str, Any] = {"reward": score.reward, **score.components}
            values.update({k: v for k, v in score.extras.items() if isinstance(v, (int, float))})
            for k, v in values.items():
                metrics.setdefault(k, MeanMetric().to(device)).update(float(v))
    # every rank must know every name before the synced compute
    names = sorted({k for part in gather_objects(sorted(metrics)) for k in part})
    result = {}
    for k in names:
        metric = metrics.setdefault(k, MeanMetric().to(device))
        result[k] = float(metric.compute()) if metric.update_called or size > 1 else float("nan")
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
