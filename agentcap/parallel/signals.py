"""Stop signals: SIGTERM, SIGUSR1 and SIGINT (Ctrl-C) end a run promptly, save what they can, and exit 128 + the signal.

A scheduler preempts a job with SIGTERM (SLURM: also SIGUSR1 shortly before, with ``--signal``).
Lightning alone stops a fit at the next batch with status 0, which the scheduler reads as success,
and nothing interrupts a step that waits on a judge. Here:

* between ticks (Lightning's own SIGTERM check, or :class:`StopOnSignal` at the next batch) the
  run saves a tick checkpoint of the finished ticks, then exits 143 (SIGTERM), 138 (SIGUSR1) or 130 (SIGINT);
* during a step, a wait on a served judge ends within a tenth of a second (:func:`check`); the
  step's half-done state is not saved, the newest checkpoint stays the last intact one;
* outside a trainer's run (building models, printing results), or on a second signal, the
  process stops at once.

Under SLURM with auto-requeue Lightning keeps its requeue signal (save ``hpc_ckpt_*.ckpt``,
``scontrol requeue``); SIGTERM then still exits non-zero.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import lightning as L

#: the signals that stop a run (SIGUSR1 where the platform has it); SIGINT (Ctrl-C) as SIGTERM: saved
#: between ticks, exit 130 (Python's KeyboardInterrupt reached Lightning mid-step: exit 1, nothing saved)
STOP_SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGUSR1", None), signal.SIGINT) if s is not None)

_received: int | None = None  # the first stop signal this process got
_trainer: Any = None  # the trainer whose loop is running: the signal waits for its next batch


class Stopped(SystemExit):
    """The run stopped on a signal; the process exits with 128 + its number (SIGTERM: 143)."""

    def __init__(self, signum: int, between_ticks: bool = False):
        super().__init__(128 + signum)
        self.signum = signum
        self.between_ticks = between_ticks  # True: the module's state is whole, worth a checkpoint

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


def received() -> int | None:
    """The stop signal this process got, or None."""
    return _received


def check() -> None:
    """Raise :class:`Stopped` once a stop signal has arrived (long waits call this as they wait)."""
    if _received is not None:
        raise Stopped(_received)


def _handle(signum: int, frame: Any) -> None:
    global _received
    again = _received is not None
    if not again:
        _received = signum
    if _trainer is None or again:  # nothing is mid-step, or a second signal: stop here
        raise Stopped(signum)


def install() -> None:
    """Handle the stop signals in this process (main thread only; elsewhere signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not _handle:
            signal.signal(signum, _handle)


def reset() -> None:
    """Forget a received signal and the running trainer (tests; a new run in the same process)."""
    global _received, _trainer
    _received, _trainer = None, None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Run a command with the stop signals handled; after one, exit 128 + its number.

    Lightning ends a fit it stopped on SIGTERM with ``SystemExit`` of status 0; a run that
    received a stop signal never exits 0, even when its last tick finished anyway."""
    install()
    try:
        yield
    except SystemExit as exit:
        if _received is not None:
            gc.freeze()  # the interpreter's last full collection costs ~10 s in a process that held models
        if _received is not None and not exit.code:
            raise Stopped(_received) from None
        raise
    if _received is not None:
        gc.freeze()
        raise Stopped(_received)


class StopOnSignal(L.Callback):
    """Defers a stop signal to the next batch boundary, then saves a tick checkpoint there."""

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        global _trainer
        install()  # a spawned rank runs no `main`
        _trainer = trainer
        environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        from lightning.fabric.plugins.environments import SLURMEnvironment

        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            requeue = environment.requeue_signal
            if requeue is not None and signal.getsignal(requeue) is _handle:
                signal.signal(requeue, signal.SIG_DFL)  # Lightning installs its requeue handler only over the default

    def teardown(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        global _trainer
        _trainer = None

    def _between_batches(self, *args: Any) -> None:
        """A signal Lightning does not watch (SIGUSR1), or one that came before its handler was set."""
        if _received is not None:
            raise Stopped(_received, between_ticks=True)

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _between_batches

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        global _trainer
        _trainer = None  # from here on a second signal stops the process at once
        if _received is None:
            return
        between = isinstance(exception, SIGTERMException) or getattr(exception, "between_ticks", False)
        name = signal.Signals(_received).name
        saved = self._save(trainer, pl_module) if between and trainer.state.fn == "fit" else None
        if trainer.is_global_zero:
            kept = f"saved {saved}" if saved else "the newest checkpoint is the last whole tick's"
            print(f"agentcap: {name}: stopped at tick {getattr(pl_module, 'tick', '?')}; {kept}; "
                  f"exit status {128 + _received}", file=sys.stderr)

    @staticmethod
    def _save(trainer: L.Trainer, pl_module: Any) -> str | None:
        """A tick checkpoint of the finished ticks through the run's TickCheckpoint (None when none)."""
        from agentcap.resume.checkpoints import TickCheckpoint

        saver = next((c for c in trainer.callbacks if isinstance(c, TickCheckpoint)), None)
        if saver is None or not hasattr(pl_module, "tick"):
            return None
        path = saver.tick_path(pl_module.run_dir, pl_module.tick)
        if not os.path.exists(path):  # a file, or a folder of shards (grpo_fsdp)
            saver.save(trainer, pl_module)
        return path
