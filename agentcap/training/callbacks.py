"""Callbacks of a training run: Lightning's step counter kept at the schedule tick, and sample tables
for the logger (checkpoints: ``agentcap.resume.checkpoints``)."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning as L


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

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """A resumed run logs again from its checkpoint's tick: drop the rows it will write anew."""
        path = os.path.join(pl_module.run_dir, "samples.jsonl")
        if not trainer.is_global_zero or not os.path.isfile(path):
            return
        with open(path, encoding="utf-8") as handle:
            kept = [line for line in handle if line.strip() and json.loads(line).get("tick", -1) < pl_module.tick]
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.writelines(kept)
        os.replace(path + ".tmp", path)

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
