"""Replayed training items: ACE-Cap's Instruct phase trains on states harvested from Composer rollouts.

A stage with ``harvest`` first rolls out the harvest environment with every agent frozen; the
environment's ``harvest`` turns those episodes into the stage's items (x, h_t, q_t of Eq. 23), and
the stage's GRPO steps replay them. The harvest is part of the checkpoint: a resumed stage must
replay the same prompts, since harvesting again would roll out a partly trained Instruct at another
tick and give other histories.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch

from agentcap.core.schedule import Stage
from agentcap.parallel.distributed import gather_objects, share, world
from agentcap.rollout.splits import Splits


class Replay:
    """Harvests, restores and checkpoints each harvest stage's items."""

    def __init__(self, splits: Splits, seed: int):
        self.splits, self.seed = splits, seed
        self.items: dict[str, list[dict[str, Any]]] = {}

    def begin(self, stage: Stage, stage_index: int, tick: int, saved: str | None) -> int | None:
        """Restore the checkpointed items (JSON of the global list) or harvest anew.

        Returns the number of items harvested, None when they were restored.
        """
        if saved:
            self._restore(stage, json.loads(saved))
            return None
        return self._harvest(stage, stage_index, tick)

    @torch.no_grad()
    def _harvest(self, stage: Stage, stage_index: int, tick: int) -> int:
        source = Stage(name=f"{stage.name}/harvest", kind="evaluate", env=dict(stage.harvest or {}))
        driver = self.splits.driver("train", source)
        n = len(driver.scorer.unwrapped.items)
        rng = np.random.default_rng([self.seed, stage_index])
        chosen, positions = share(rng.permutation(n)[: stage.harvest_items].tolist(), "harvest items")
        batch = driver.run(chosen, group_size=1, seed=self.seed + tick, positions=positions, old_logprobs=False)
        env = driver.scorer.unwrapped
        # every rank holds the global list in global order, so the items split as a dataset's do
        mine = [(p, env.harvest([episode])) for p, episode in zip(positions, batch.episodes)]
        pairs = sorted((pair for part in gather_objects(mine) for pair in part), key=lambda pair: pair[0])
        items = [item for _, got in pairs for item in got]
        if not items:
            raise RuntimeError(f"stage {stage.name!r}: the harvest produced no items (no questions asked?)")
        self._use(stage, items)
        return len(items)

    def _restore(self, stage: Stage, ranks: list[list[dict[str, Any]]]) -> None:
        """A checkpointed harvest: the global list, whatever the number of processes that wrote it."""
        rank, _ = world()
        self._use(stage, [item for part in ranks for item in part])
        if rank == 0:
            total = sum(len(r) for r in ranks)
            print(f"agentcap: {stage.name}: replaying the {total} Instruct items harvested before the checkpoint",
                  file=sys.stderr)

    def _use(self, stage: Stage, items: list[dict[str, Any]]) -> None:
        self.items[stage.name] = items
        self.splits.use_items(stage, items)

    def state(self, stage: Stage | None) -> str | None:
        """The stage's items (the global list every rank holds) as JSON for the checkpoint."""
        items = None if stage is None else self.items.get(stage.name)
        if items is None:
            return None
        return json.dumps([[{k: v for k, v in item.items() if not k.startswith("_questions")} for item in items]])
