"""What a run logs: each tick's metrics, sent once to every logger, and the sample trajectories.

Not Lightning's ``self.log``: it keeps a key's last value until the epoch ends, and a whole schedule
is one epoch, so an earlier stage's metrics (the Captioner's SFT loss, the Composer's generate
calls) would be logged again at every later step. Metric names are listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agentcap.parallel.distributed import global_sums, world
from agentcap.rollout.driver import RolloutBatch, Span


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


def log_captions(loggers: Iterable[Any], stage: str, rows: Sequence[dict[str, Any]], step: int) -> None:
    """An evaluation's per-item rows (caption, reference, reward and its components; ACE-Cap: the
    evidence trace) as a table, for loggers that take one (W&B); the same rows are in
    ``<run_dir>/eval/<stage>.jsonl``."""
    if not rows:
        return
    columns = list(dict.fromkeys(k for row in rows for k in row))
    data = [[_cell(row.get(c)) for c in columns] for row in rows]
    for logger in loggers:
        if hasattr(logger, "log_table"):
            logger.log_table(key=f"eval/{stage}/captions", columns=columns, data=data, step=step)


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
    by_group: dict[tuple[str, int], list[float]] = defaultdict(list)
    for s in spans:
        by_kind[s.kind].append(float(s.utility))
        by_group[(s.kind, s.group)].append(float(s.utility))
    for kind, values in by_kind.items():
        metrics[f"utility/{kind}/mean"] = float(np.mean(values))
        metrics[f"utility/{kind}/std"] = float(np.std(values))
        # GRPO learns only from spread inside a group: a group whose utilities are all equal gets
        # zero advantages (the usual reason a GRPO stage stops moving)
        groups = [v for (k, _), v in by_group.items() if k == kind]
        metrics[f"utility/{kind}/group_std"] = float(np.mean([np.std(v) for v in groups]))
        metrics[f"utility/{kind}/zero_spread"] = float(np.mean([np.ptp(v) == 0 for v in groups]))
    return metrics


class StepClock:
    """Wall time of a step's rollout and update, generated tokens per second and peak memory.

    Peak memory is the accelerator's peak allocation during the step (CUDA), else the process's
    peak resident memory so far (what the OS reports on CPU).
    """

    def __init__(self, device: Any):
        import time

        import torch

        self.device, self._now, self.marks = torch.device(device), time.perf_counter, {}
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._last = self._now()

    def mark(self, name: str) -> None:
        now = self._now()
        self.marks[name], self._last = now - self._last, now

    def metrics(self, generated_tokens: int) -> dict[str, float]:
        import torch

        out = {f"time/{k}_s": v for k, v in self.marks.items()}
        if self.marks.get("rollout"):
            out["throughput/generated_tokens_per_s"] = generated_tokens / self.marks["rollout"]
        if self.device.type == "cuda":
            out["memory/peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        else:
            import resource

            out["memory/peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        return out


def sample_rows(
    batch: RolloutBatch, stage: str, tick: int, group_size: int, reference_field: str = "caption"
) -> list[dict[str, Any]]:
    """The first group's whole trajectories, every span, for the sample table: with the item's
    reference caption, the trajectory's reward and each of its components."""
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
            "reference": batch.episodes[s.trajectory].item.get(reference_field),
            "reward": float(batch.scores[s.trajectory].reward),
            **{f"reward/{k}": float(v) for k, v in batch.scores[s.trajectory].components.items()},
        }
        for s in batch.spans
        if s.trajectory < group_size
    ]
