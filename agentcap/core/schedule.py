"""The training schedule: an ordered list of stages, each training at most one agent.

A stage is SFT of one role, GRPO of one role (plain GRPO and LOOP-GRPO are the same update: the
environment's utilities carry the action kinds), or an evaluation of the held-out split. ACE-Cap's
Algorithm 1 is such a list: SFT of each role → Captioner GRPO → Instruct GRPO → Composer LOOP-GRPO
warm-up → N × (Instruct phase, Composer phase), with evaluations in between. Progress is one
integer, the tick, so a run resumes in the middle of any stage from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentcap.core.settings import ConfigError, check


@dataclass
class Stage:
    """One stage of the schedule.

    Args:
        name: label used in logs and in ``summary.json`` (e.g. ``S1``, ``after_grpo``).
        kind: ``sft`` (supervised on the environment's demonstrations), ``grpo`` (rollout → utilities
            → group-normalised advantages → clipped updates), ``evaluate`` (greedy rollouts on a
            held-out split, means of every reward component).
        agent: the role that trains in this stage (none for ``evaluate``).
        steps: optimiser steps (one rollout batch each for ``grpo``); ``evaluate`` takes one tick.
        split: the split an ``evaluate`` stage reads.
        greedy: an ``evaluate`` stage decodes greedily (default) or samples at the agents'
            temperatures with a seeded generator (the policy GRPO optimises).
        env: keyword overrides for the environment in this stage (reward weights, modes…).
        lr: learning rate; defaults to the agent's.
        warmup_steps: stage steps of linear warm-up to ``lr``.
        lr_schedule: after warm-up, ``constant``, ``linear`` decay to 0 or ``cosine`` decay.
        harvest: environment overrides of a harvest rollout run when the stage begins (all agents
            frozen); the environment's ``harvest`` turns its episodes into this stage's items
            (ACE-Cap's Instruct phase replays states harvested from Composer rollouts, Eq. 23).
        harvest_items: training items rolled out by that harvest.
        max_duration: train only on items at most this long (seconds): AudioMap's duration
            curriculum is a short-clip stage followed by a full-range one.
        sample_frozen: frozen roles that sample at their temperatures in this ``grpo`` stage's
            rollouts. By default a frozen role decodes greedily, so it answers a state the same way
            in every rollout of a group; ACE-Cap's Composer asking one question form then hears one
            answer, and its question spans have no spread for LOOP to credit.
    """

    name: str
    kind: Literal["sft", "grpo", "evaluate"]
    agent: str | None = None
    steps: int = 1
    split: Literal["train", "val", "test"] = "val"
    greedy: bool = True
    env: dict[str, Any] = field(default_factory=dict)
    lr: float | None = None
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    max_duration: float | None = None
    harvest: dict[str, Any] | None = None
    harvest_items: int = 16
    sample_frozen: list[str] = field(default_factory=list)

    def ticks(self) -> int:
        return 1 if self.kind == "evaluate" else self.steps

    def check(self, index: int) -> None:
        """Refuse a numeric field outside its range (``ConfigError`` naming ``--model.stages[i].field``)."""
        key, named = f"--model.stages[{index}]", f" (stage {self.name!r})"
        if self.kind != "evaluate":
            check(f"{key}.steps", self.steps, "≥ 1", named)
            check(f"{key}.warmup_steps", self.warmup_steps, "≥ 0", named)
            if self.warmup_steps > self.steps:
                raise ConfigError(f"{key}.warmup_steps must be ≤ steps ({self.steps}), got {self.warmup_steps}{named}")
        check(f"{key}.lr", self.lr, "> 0", named)
        check(f"{key}.max_duration", self.max_duration, "> 0", named + "; None trains on every item")
        check(f"{key}.harvest_items", self.harvest_items, "≥ 1", named)


class Schedule:
    """Maps a global tick to (stage index, step inside the stage)."""

    def __init__(self, stages: Sequence[Stage], agents: Sequence[str]):
        if not stages:
            raise ConfigError("--model.stages: give at least one stage")
        seen: set[str] = set()
        for i, stage in enumerate(stages):
            where = f"--model.stages[{i}] ({stage.name!r})"
            if stage.name in seen:
                raise ConfigError(f"{where}: stage names must be unique")
            seen.add(stage.name)
            if stage.kind in ("sft", "grpo"):
                if stage.agent not in agents:
                    raise ConfigError(f"{where}: agent {stage.agent!r} is not one of the configured agents {sorted(agents)}")
            elif stage.agent is not None:
                raise ConfigError(f"{where}: an evaluate stage trains no agent (got agent={stage.agent!r})")
            unknown = [name for name in stage.sample_frozen if name not in agents]
            if unknown:
                raise ConfigError(f"{where}: sample_frozen names {unknown}, not configured agents {sorted(agents)}")
            if stage.sample_frozen and stage.kind != "grpo":
                raise ConfigError(f"{where}: sample_frozen applies to grpo rollouts, not to a {stage.kind} stage "
                                  "(an evaluate stage samples every role with greedy: false)")
            stage.check(i)
        self.stages = list(stages)
        self.starts: list[int] = []
        total = 0
        for stage in self.stages:
            self.starts.append(total)
            total += stage.ticks()
        self.total = total

    def locate(self, tick: int) -> tuple[int, int]:
        if not 0 <= tick < self.total:
            raise IndexError(f"tick {tick} outside the schedule (0..{self.total - 1})")
        index = max(i for i, start in enumerate(self.starts) if start <= tick)
        return index, tick - self.starts[index]

    def check_resumable(self, names: Sequence[str] | None, run_dir: str) -> None:
        """A checkpoint's stage names must be this schedule's: ticks mean nothing in another one."""
        ours = [stage.name for stage in self.stages]
        if names is not None and list(names) != ours:
            raise ValueError(
                f"the checkpoint in {run_dir} was written by another schedule (stages {list(names)}, "
                f"now {ours}); resume with the same stages, or start a new --model.run_dir"
            )
