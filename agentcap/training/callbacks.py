"""Callbacks of a training run: Lightning's step counter kept at the schedule tick, sample tables for
the logger, EarlyStopping after each evaluate stage, and the results table at the end of a fit
(checkpoints: ``agentcap.resume.checkpoints``). ``GRPOModule.configure_callbacks`` adds them all, so
a plain ``L.Trainer(...).fit(module)`` gets them too."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping

from agentcap.evaluation.table import results_table


class TickStep(L.Callback):
    """Keeps Lightning's ``global_step`` equal to the schedule tick.

    The module steps its own optimisers (one per stage), which Lightning does not count, so
    ``global_step`` would stay 0 and ``ModelCheckpoint`` would never save (it skips a step it has
    saved at). A resumed run continues at its tick, not at Lightning's reset counter: the logging
    step (``LearningRateMonitor``'s) too.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        loop = trainer.fit_loop.epoch_loop
        loop._batches_that_stepped = pl_module.tick
        loop.manual_optimization.optim_step_progress.total.completed = pl_module.tick

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


class EvaluationStops(L.Callback):
    """Runs every ``EarlyStopping`` check after each evaluate stage, as Lightning would after a
    validation: a whole schedule is one epoch, whose end is the only check Lightning makes itself.

    A monitor no evaluation has logged yet is left for later (Lightning's own end-of-fit check still
    refuses one that never appears, when ``strict``)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        index, _ = pl_module.schedule.locate(pl_module.tick - 1)
        if pl_module.schedule.stages[index].kind != "evaluate":
            return
        for callback in trainer.callbacks:
            if isinstance(callback, EarlyStopping) and callback.monitor in trainer.callback_metrics \
                    and not callback._should_skip_check(trainer):
                callback._run_early_stopping_check(trainer)


class ResultsTable(L.Callback):
    """At the end of a fit (also one that stopped early), rank 0 writes ``summary.json`` and prints
    the table of its evaluated stages, then the file's path.

    Printed at ``teardown``, after the progress bar's: a rich progress bar redraws (and wraps what
    is printed) until then."""

    _finished = False

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._finished = True  # not called when the fit failed

    def teardown(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self._finished and trainer.is_global_zero:
            self._finished = False
            print_results(pl_module, "agentcap fit")


def print_results(module: Any, command: str) -> None:
    """The table of every evaluated stage in ``summary.json`` (schedule order), then its path, on stdout."""
    path = module.write_summary()
    with open(path, encoding="utf-8") as handle:
        summary = json.load(handle)
    order = [s.name for s in module.schedule.stages if s.kind == "evaluate"]
    print(results_table(summary, title=f"{command}: {module.run_dir}", order=order))
    print(os.path.abspath(path))
