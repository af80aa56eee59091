"""What a run logs: each tick's metrics, sent once to every logger, and the sample trajectories.

Not Lightning's ``self.log``: it keeps a key's last value until the epoch ends, and a whole schedule
is one epoch, so an earlier stage's metrics (the Captioner's SFT loss, the Composer's generate
calls) would be logged again at every later step. Metric names are listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import math
import resource
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from agentcap.parallel.distributed import gather_objects, world
from agentcap.rewards.metric import RewardMetric
from agentcap.rollout.driver import RolloutBatch, Span


def emit(loggers: Iterable[Any], metrics: dict[str, float], step: int) -> None:
    """Send ``metrics`` (already global: every rank holds the same values) to every logger at ``step``, from rank 0."""
    if world()[0] == 0:
        for logger in loggers:
            logger.log_metrics(dict(metrics), step=step)


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


def rollout_metrics(
    batch: RolloutBatch, spans: Sequence[Span], agent: str, group_size: int, agents: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Rewards and their components (mean and std), episode extras, response lengths, the share of
    completions cut at ``max_new_tokens`` per agent (with ``agents``), turns, generate calls and the
    raw utilities per action kind of one GRPO step, over every process's trajectories.

    Reward keys name the trained agent (``reward/<agent>/total``): the stages of a schedule that
    train different agents (ACE-Cap's Captioner, Instruct, Composer) are separate curves.

    Each rank's trajectories and trained spans are gathered and ordered by their global position, so
    every figure is computed from the same numbers in the same order as one process would (N
    processes log what one logs). A group is ``global trajectory id // group_size``.
    """
    ids = batch.trajectory_ids or list(range(len(batch.scores)))
    trajectories = [
        (ids[t], score.reward, dict(score.components),
         {k: float(v) for k, v in score.extras.items() if isinstance(v, (int, float))}, batch.turns[t])
        for t, score in enumerate(batch.scores)
    ]
    trained = [(ids[s.trajectory], s.action_index, s.kind, float(s.utility), s.completion_ids.numel()) for s in spans]
    cut = [(s.agent, clipped(s, agents[s.agent])) for s in batch.spans if s.agent in agents] if agents else []
    credit = [_against(s) for s in spans if getattr(s, "token_advantages", None) is not None]
    parts = gather_objects((trajectories, trained, dict(batch.generate_calls), cut, credit))
    trajectories = sorted(t for part in parts for t in part[0])
    trained = sorted(s for part in parts for s in part[1])

    # the reward and each component: the synced means of the rewards' Metric (torchmetrics), and their spread
    names = sorted({k for _, _, components, _, _ in trajectories for k in components})
    rewards = RewardMetric(names)
    rewards.update(batch.scores)
    metrics = {f"reward/{agent}/{k}": v for k, v in rewards.compute().items() if trajectories}
    for name in ["total", *names] if trajectories else []:
        values = [reward if name == "total" else components.get(name) for _, reward, components, _, _ in trajectories]
        metrics[f"reward_std/{agent}/{name}"] = float(np.std([float(v) for v in values if v is not None]))
    clip: dict[str, list[bool]] = defaultdict(list)
    for part in parts:
        for name, was_cut in part[3]:
            clip[name].append(was_cut)
    for name, flags in sorted(clip.items()):  # completions that hit max_new_tokens before their EOS
        metrics[f"rollout/{name}/clipped"] = float(np.mean(flags))
    extras: dict[str, list[float]] = defaultdict(list)
    for *_, episode_extras, _ in trajectories:
        for k, v in episode_extras.items():
            extras[k].append(v)
    for k, values in extras.items():  # e.g. questions per episode, forced-finalisation rate
        metrics[f"episode/{k}"] = float(np.nanmean(values))
    if trained:
        metrics[f"rollout/{agent}/response_length"] = float(np.mean([length for *_, length in trained]))
    if trajectories:
        metrics["rollout/turns"] = float(np.mean([turns for *_, turns in trajectories]))
    for name in sorted({name for part in parts for name in part[2]}):  # per process: the most of any rank
        metrics[f"rollout/{name}/generate_calls"] = float(max(part[2].get(name, 0) for part in parts))
    by_kind: dict[str, list[float]] = defaultdict(list)
    by_group: dict[tuple[str, int], list[float]] = defaultdict(list)
    for trajectory, _, kind, utility, _ in trained:
        by_kind[kind].append(utility)
        by_group[(kind, trajectory // group_size)].append(utility)
    credit = [c for part in parts for c in part[4]]
    if credit:  # per-piece credit (Score.text_credit): pieces per action, tokens pushed against the action's sign
        metrics[f"credit/{agent}/pieces"] = float(np.mean([pieces for pieces, _, _ in credit]))
        metrics[f"credit/{agent}/against_action"] = sum(a for _, a, _ in credit) / max(sum(n for *_, n in credit), 1)
    for kind, values in by_kind.items():
        metrics[f"utility/{kind}/mean"] = float(np.mean(values))
        metrics[f"utility/{kind}/std"] = float(np.std(values))
        # GRPO learns only from spread inside a group: a group whose utilities are all equal gets
        # zero advantages (the usual reason a GRPO stage stops moving)
        groups = [v for (k, _), v in by_group.items() if k == kind]
        metrics[f"utility/{kind}/group_std"] = float(np.mean([np.std(v) for v in groups]))
        metrics[f"utility/{kind}/zero_spread"] = float(np.mean([np.ptp(v) == 0 for v in groups]))
    return metrics


def _against(span: Span) -> tuple[int, int, int]:
    """A credited span's pieces, its tokens whose advantage has the other sign than the span's own
    (nonzero both), and its tokens."""
    own = np.sign(span.advantage)
    against = sum(1 for a in span.token_advantages if own and np.sign(a) == -own)
    return len(span.piece_utilities or ()), against, len(span.token_advantages)


def clipped(span: Span, agent: Any) -> bool:
    """Whether the completion was cut at the agent's ``max_new_tokens`` (it does not end in an EOS)."""
    ids = span.completion_ids
    return ids.numel() >= agent.max_new_tokens and (ids.numel() == 0 or int(ids[-1]) not in agent.eos_ids)


#: Update statistics that are each rank's share of a globally weighted mean (the loss weights are
#: normalised by the global token or sequence count), so their sum over ranks is the global value.
SHARED_STATS = ("loss", "pg_loss", "kl", "number_kl", "clipfrac", "ratio", "entropy", "sampler_gap_mean")


def update_metrics(stats: dict[str, float], agent: str) -> dict[str, float]:
    """``loss/<agent>/*`` of one update over every process: the shares of :data:`SHARED_STATS` summed,
    the largest sampler gap the most of any rank, ``grad_norm`` as it is (global already: taken after
    the gradients were summed). A rank without rows in any minibatch reports no terms."""
    every = gather_objects(dict(stats))
    metrics: dict[str, float] = {}
    for key in sorted({k for part in every for k in part}):
        values = [part[key] for part in every if key in part]
        value = max(values) if key in ("sampler_gap_max", "grad_norm") else sum(values)
        metrics[f"loss/{agent}/{key}"] = float(value)
    return metrics


class StepClock:
    """Wall time of a step's rollout and update, generated tokens per second and peak memory.

    Peak memory is the accelerator's peak allocation during the step (CUDA), else the process's
    peak resident memory so far (what the OS reports on CPU).
    """

    def __init__(self, device: Any):
        self.device, self._now, self.marks = torch.device(device), time.perf_counter, {}
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._last = self._now()

    def mark(self, name: str) -> None:
        now = self._now()
        self.marks[name], self._last = now - self._last, now

    def metrics(self, generated_tokens: int) -> dict[str, float]:
        """Over every process: the slowest rank's times, the largest peak memory, and all generated
        tokens over the slowest rollout."""
        if self.device.type == "cuda":
            memory = {"memory/peak_gib": torch.cuda.max_memory_allocated(self.device) / 2**30}
        else:
            memory = {"memory/peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # KiB on Linux
        every = gather_objects((self.marks, generated_tokens, memory))
        out = {f"time/{k}_s": max(part[0][k] for part in every) for k in self.marks}
        if out.get("time/rollout_s"):
            out["throughput/generated_tokens_per_s"] = sum(part[1] for part in every) / out["time/rollout_s"]
        out.update({k: max(part[2][k] for part in every) for k in memory})
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
