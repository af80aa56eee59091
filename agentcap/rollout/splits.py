"""The environment of each data split, the rollout drivers built on it, and which items a step draws.

A driver owns a pool of environments; building one reads the manifest, so drivers are cached per
(split, stage overrides). A stage may replace the training items (ACE-Cap's Instruct phase replays
harvested states): :meth:`Splits.use_items` installs them and drops the drivers built on older ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from agentcap.agents.agent import Agent
from agentcap.core import unusable
from agentcap.core.registry import check_env_id, check_env_kwargs, make_env
from agentcap.core.schedule import Stage
from agentcap.parallel.distributed import world
from agentcap.rollout.driver import RolloutDriver


@dataclass
class EnvConfig:
    """Which registered environment to train on, and its keyword arguments per split (``model.env``).

    Not Gymnasium's ``EnvSpec`` (a registry entry): this is the run's choice of one, per split.

    Args:
        id: a registered id (``agentcap envs`` lists them); ``module:Id`` imports ``module`` first.
        kwargs: keyword arguments common to every split.
        train: keyword arguments of the training split (typically ``manifest``).
        val: keyword arguments of the validation split.
        test: keyword arguments of the test split.
    """

    id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    val: dict[str, Any] = field(default_factory=dict)
    test: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_env_id(self.id)  # a typo is refused with the config, before any model loads
        for split in ("train", "val", "test"):  # and keyword arguments meant for another environment
            check_env_kwargs(self.id, {**self.kwargs, **getattr(self, split)})

    def make(self, split: str, overrides: dict[str, Any] | None = None, **extra) -> gym.Env:
        kwargs = {**self.kwargs, **getattr(self, split), **(overrides or {}), **extra}
        return make_env(self.id, kwargs)

    def texts(self) -> list[str]:
        """Every prompt and demonstration of every split: the vocabulary of a word-level tokenizer."""
        texts: list[str] = []
        for split in ("train", "val", "test"):
            if not getattr(self, split):
                continue
            env = self.make(split).unwrapped
            for item in env.items:
                for observation, action in env.demonstrations(item):
                    texts.extend(m["content"] for m in observation["messages"])
                    texts.append(action)
        return texts


class Splits:
    """Cached rollout drivers per split and stage, and the seeded item order of every step."""

    def __init__(self, spec: EnvConfig, agents: Mapping[str, Agent], generation_batch_size: int, seed: int):
        self.spec, self.agents = spec, agents
        self.generation_batch_size, self.seed = generation_batch_size, seed
        #: Per split, the rows refused at load and the manifest (rows found unusable at use are added
        #: by ``skipped_rows``).
        self._refused: dict[str, tuple[int, str | None]] = {}
        self._drivers: dict[tuple, RolloutDriver] = {}
        self._items: dict[str, list[dict[str, Any]]] = {}

    def driver(self, split: str, stage: Stage) -> RolloutDriver:
        items = self._items.get(stage.name) if split == "train" else None
        key = (stage.name if items else split, json.dumps(stage.env, sort_keys=True, default=str))
        if key not in self._drivers:
            overrides = dict(stage.env)
            if items:
                overrides.update(manifest=None, items=items)
            self._drivers[key] = driver = RolloutDriver(
                lambda: self.spec.make(split, overrides, defer_scoring=True),
                self.agents,
                generation_batch_size=self.generation_batch_size,
            )
            skipped = driver.scorer.unwrapped.skipped.skipped
            if skipped and world()[0] == 0:
                rank_zero_warn(f"{split}: skipped {len(skipped)} unusable rows:\n  " + "\n  ".join(skipped[:10]))
            self._refused[split] = (len(skipped), driver.scorer.unwrapped.manifest)
        return self._drivers[key]

    @property
    def skipped_rows(self) -> dict[str, int]:
        """Per split, the rows skipped so far: refused at load, and found unusable when used
        (``agentcap.core.unusable``, ``on_error: skip``), which grows as training draws rows."""
        return {split: n + len(unusable.found(manifest)) for split, (n, manifest) in self._refused.items()}

    def use_items(self, stage: Stage, items: list[dict[str, Any]]) -> None:
        """The stage's training items from now on; its cached driver (built on older items) is dropped."""
        self._items[stage.name] = items
        self._drivers = {k: v for k, v in self._drivers.items() if k[0] != stage.name}

    def eligible_items(self, stage: Stage) -> list[int]:
        """Indices of the training items this stage may draw (duration curriculum)."""
        items = self.driver("train", stage).scorer.unwrapped.items
        if stage.max_duration is None:
            return list(range(len(items)))
        chosen = [i for i, item in enumerate(items) if float(item.get("duration", 0.0)) <= stage.max_duration]
        if not chosen:
            raise ValueError(f"stage {stage.name!r}: no training item is at most max_duration={stage.max_duration}s")
        return chosen

    def item_indices(self, stage: Stage, stage_index: int, step: int, per_step: int) -> list[int]:
        """The global batch of items for ``step`` (seeded, epoch-wise shuffle); ranks take a ``share``."""
        pool = self.eligible_items(stage)
        n = len(pool)
        start = step * per_step
        order: list[int] = []
        epoch = start // n
        while len(order) < (start % n) + per_step:
            rng = np.random.default_rng([self.seed, stage_index, epoch])
            order.extend(pool[i] for i in rng.permutation(n).tolist())
            epoch += 1
        return order[start % n : start % n + per_step]
