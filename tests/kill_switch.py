"""A callback that kills its own process (SIGKILL: no cleanup, as a preempted node) at a given
schedule tick, so a resume test stops at a known place instead of racing a timer."""

from __future__ import annotations

import os
import signal

import lightning as L


class KillAtTick(L.Callback):
    """``rank``: only that process dies (a lost DDP peer); every process by default."""

    def __init__(self, tick: int, rank: int | None = None):
        self.tick, self.rank = tick, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.tick >= self.tick and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAtTick(L.Callback):
    """Sends its own process ``signum`` (a scheduler's SIGTERM / SIGUSR1) at a given schedule tick."""

    def __init__(self, tick: int, signum: int = int(signal.SIGTERM)):
        self.tick, self.signum = tick, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.tick == self.tick:
            os.kill(os.getpid(), self.signum)
