"""Checkpoints by schedule tick: written atomically, rotated, and found again after a kill.

The module steps its own optimisers, so the tick (not Lightning's ``global_step``) decides when to
save; a truncated or corrupt file is reported by path and the previous checkpoint is used.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import Any

import lightning as L
import torch


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
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated zip, garbage bytes, a pickle torch refuses
        return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not isinstance(state, dict) or "state_dict" not in state:
        return "not a Lightning checkpoint (no 'state_dict')"
    return None


