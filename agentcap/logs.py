"""What a run logs: each tick's metrics, sent once to every logger, and the sample trajectories.

Not Lightning's ``self.log``: it keeps a key's last value until the epoch ends, and a whole schedule
is one epoch, so an earlier stage's metrics (the Captioner's SFT loss, the Composer's generate
calls) would be logged again at every later step. Metric names are listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agentcap.distributed import global_sums, world
from agentcap.rollout import RolloutBatch, Span


def emit(loggers: Iterable[Any], metrics: dict[str, float], step: int, mean_over_ranks: Sequence[str] = ()) -> None:
    """Send ``metrics`` to every logger at ``step`` (rank 0); keys in ``mean_over_ranks`` are
    averaged over processes first (every rank must pass the same keys)."""
    metrics = dict(metrics)
    rank, size = world()
    if size > 1 and mean_over_ranks:
        keys = sorted(mean_over_ranks)
        metrics.update((k, total / size) for k, total in zip(keys, global_sums([metrics[k] for k in keys])))
    if rank == 0:
        for logger in loggers:
            logger.log_metrics(metrics, step=step)


def log_captions(loggers: Iterable[Any], run_dir: str, stage: str, rows: Sequence[dict[str, Any]], step: int) -> None:
    """An evaluation's captions (reference, reward and its components; ACE-Cap: the evidence trace):
    a table for loggers that take one (W&B), and ``<run_dir>/captions/<stage>.jsonl`` always."""
    if not rows:
        return
    columns = list(dict.fromkeys(k for row in rows for k in row))
    data = [[_cell(row.get(c)) for c in columns] for row in rows]
    for logger in loggers:
        if hasattr(logger, "log_table"):
            logger.log_table(key=f"eval/{stage}/captions", columns=columns, data=data, step=step)
    folder = os.path.join(run_dir, "captions")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{stage}.jsonl"), "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def _cell(value: Any) -> Any:
    return " | ".join(value) if isinstance(value, list) else value


def rollout_metrics(batch: RolloutBatch, spans: Sequence[Span], stats: dict[str, float], agent: str) -> dict[str, float]:
    """Rewards and their components, episode extras, the update's statistics, response lengths,
    turns, generate calls and the raw utilities per action kind of one GRPO step."""
    components: dict[str, list[float]] = defaultdict(list)
    extras: dict[str, list[float]] = defaultdict(list)
    for score in batch.scores:
        components["total"].append(score.reward)
        for k, v in score.components.items():
            components[k].append(v)
        for k, v in score.extras.items():
            if isinstance(v, (int, float)):
                extras[k].append(float(v))
    metrics = {f"reward/{k}": float(np.mean(values)) for k, values in components.items()}
    for k, values in extras.items():  # e.g. questions per episode, forced-finalisation rate
        metrics[f"episode/{k}"] = float(np.nanmean(values))
    for k, v in stats.items():
        metrics[f"loss/{agent}/{k}"] = float(v)
    if spans:
        metrics[f"rollout/{agent}/response_length"] = float(np.mean([s.completion_ids.numel() for s in spans]))
    metrics["rollout/turns"] = float(np.mean(batch.turns))
    for name, calls in batch.generate_calls.items():
        metrics[f"rollout/{name}/generate_calls"] = float(calls)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        by_kind[s.kind].append(float(s.utility))
    for kind, values in by_kind.items():
        metrics[f"utility/{kind}/mean"] = float(np.mean(values))
        metrics[f"utility/{kind}/std"] = float(np.std(values))
    return metrics


def sample_rows(batch: RolloutBatch, stage: str, tick: int, group_size: int) -> list[dict[str, Any]]:
    """The first group's whole trajectories, every span, for the sample table."""
    return [
        {
            "tick": tick,
            "stage": stage,
            "agent": s.agent,
            "kind": s.kind,
            "prompt": s.observation["messages"][-1]["content"][-400:],
            "response": s.text,
            "utility": float(s.utility) if s.utility is not None else math.nan,
            "advantage": float(s.advantage),
            "reward": float(batch.scores[s.trajectory].reward),
        }
        for s in batch.spans
        if s.trajectory < group_size
    ]
