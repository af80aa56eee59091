"""Callbacks: resumable checkpoints by schedule tick, and sample tables for the logger."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from typing import Any

import lightning as L


class TickCheckpoint(L.Callback):
    """Saves ``<run_dir>/checkpoints/tick-NNNNNN.ckpt`` every ``every`` ticks and at every stage
    boundary, keeps the newest ``keep``, and points ``last.ckpt`` at the newest.

    The module's manual optimisation never advances Lightning's ``global_step``, so the schedule
    tick decides. Each file is written under a temporary name and renamed, so a kill at any moment
    leaves usable ones; ``last.ckpt`` is a hard link (a copy where links are not supported).
    """

    def __init__(self, every: int = 10, keep: int = 3):
        self.every = max(1, every)
        if keep < 1:
            raise ValueError(f"--checkpoint_keep ({keep}) must be ≥ 1")
        self.keep = keep

    @staticmethod
    def path(run_dir: str) -> str:
        return os.path.join(run_dir, "checkpoints", "last.ckpt")

    @staticmethod
    def tick_path(run_dir: str, tick: int) -> str:
        return os.path.join(run_dir, "checkpoints", f"tick-{tick:06d}.ckpt")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        tick = pl_module.tick
        index, step = pl_module.schedule.locate(tick - 1)
        stage_done = step == pl_module.schedule.stages[index].ticks() - 1
        if tick % self.every == 0 or stage_done:
            self.save(trainer, pl_module)

    def save(self, trainer: L.Trainer, pl_module: Any) -> None:
        path = self.tick_path(pl_module.run_dir, pl_module.tick)
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        trainer.save_checkpoint(tmp, weights_only=False)  # full state: optimiser, loops, tick
        if trainer.is_global_zero:
            os.replace(tmp, path)
            last = self.path(pl_module.run_dir)
            try:
                os.link(path, last + ".tmp")
            except OSError:
                shutil.copyfile(path, last + ".tmp")
            os.replace(last + ".tmp", last)
            for old in checkpoints(pl_module.run_dir)[self.keep :]:
                os.remove(old)
        trainer.strategy.barrier("agentcap-checkpoint")


class TickStep(L.Callback):
    """Keeps Lightning's ``global_step`` equal to the schedule tick.

    The module steps its own optimisers (one per stage), which Lightning does not count, so
    ``global_step`` would stay 0 and ``ModelCheckpoint`` would never save (it skips a step it has
    saved at). A resumed run continues at its tick, not at Lightning's reset counter.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.total.completed = pl_module.tick
def checkpoints(run_dir: str) -> list[str]:
    """The run's tick checkpoints, newest first."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    names = sorted((n for n in os.listdir(folder) if re.fullmatch(r"tick-\d+\.ckpt", n)), reverse=True)
    return [os.path.join(folder, n) for n in names]


def latest_checkpoint(run_dir: str, report=None) -> str | None:
    """The newest checkpoint of ``run_dir`` that loads; an unreadable one is reported by path and skipped.

    ``last.ckpt`` first (it may also be a file the user put there), then the tick checkpoints.
    """
    report = report or (lambda message: print(message, file=sys.stderr))
    candidates = [TickCheckpoint.path(run_dir)] + checkpoints(run_dir)
    bad: list[str] = []
    for path in candidates:
        if not os.path.isfile(path):
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            if bad:
                report(f"agentcap: using the previous checkpoint {path}")
            return path
        bad.append(path)
        report(f"agentcap: checkpoint {path} is unreadable ({problem}); skipping it")
    return None


def checkpoint_problem(path: str) -> str | None:
    """Why ``path`` is not a loadable checkpoint, or None. Memory-mapped: tensors are not read."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated zip, garbage bytes, a pickle torch refuses
        return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not isinstance(state, dict) or "state_dict" not in state:
        return "not a Lightning checkpoint (no 'state_dict')"
    return None


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
