"""Callbacks: resumable checkpoints by schedule tick, and sample tables for the logger."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning as L


class TickCheckpoint(L.Callback):
    """Saves ``<run_dir>/checkpoints/last.ckpt`` every ``every`` ticks and at every stage boundary.

    The module's manual optimisation never advances Lightning's ``global_step``, so the schedule
    tick decides; the file is replaced atomically, so a kill at any moment leaves a usable one.
    """

    def __init__(self, every: int = 10):
        self.every = max(1, every)

    @staticmethod
    def path(run_dir: str) -> str:
        return os.path.join(run_dir, "checkpoints", "last.ckpt")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        tick = pl_module.tick
        index, step = pl_module.schedule.locate(tick - 1)
        stage_done = step == pl_module.schedule.stages[index].ticks() - 1
        if tick % self.every == 0 or stage_done:
            self.save(trainer, pl_module)

    def save(self, trainer: L.Trainer, pl_module: Any) -> None:
        path = self.path(pl_module.run_dir)
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        trainer.save_checkpoint(tmp, weights_only=False)  # full state: optimiser, loops, tick
        if trainer.is_global_zero:
            os.replace(tmp, path)
        trainer.strategy.barrier("agentcap-checkpoint")


class TickStep(L.Callback):
    """Keeps Lightning's ``global_step`` equal to the schedule tick.

    The module steps its own optimisers (one per stage), which Lightning does not count, so
    ``global_step`` would stay 0 and ``ModelCheckpoint`` would never save (it skips a step it has
    saved at). A resumed run continues at its tick, not at Lightning's reset counter.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.total.completed = pl_module.tick


class SampleTable(L.Callback):
    """Logs the module's latest sample trajectories: a W&B table, or JSONL for other loggers."""

    columns = ("tick", "stage", "agent", "kind", "prompt", "response", "utility", "advantage", "reward")

    def __init__(self):
        self._last_tick = -1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        samples = getattr(pl_module, "samples", [])
        if not samples or not trainer.is_global_zero or samples[0]["tick"] == self._last_tick:
            return
        self._last_tick = samples[0]["tick"]
        # the fixed columns, then what the rows add (the reference, each reward component)
        columns = [*self.columns, *dict.fromkeys(k for s in samples for k in s if k not in self.columns)]
        rows = [[s.get(c) for c in columns] for s in samples]
        for logger in trainer.loggers:
            if hasattr(logger, "log_table"):
                logger.log_table(key="samples", columns=columns, data=rows, step=pl_module.tick)
        os.makedirs(pl_module.run_dir, exist_ok=True)
        with open(os.path.join(pl_module.run_dir, "samples.jsonl"), "a", encoding="utf-8") as handle:
            for s in samples:
                handle.write(json.dumps(s) + "\n")
