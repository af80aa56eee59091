"""Callbacks of a training run: Lightning's step counter (and W&B's) kept at the schedule tick, sample
tables for the logger, one log line per logging step when the output is not a terminal, a warning
when a GRPO stage's groups have no spread, EarlyStopping after each evaluate stage, and the results
table at the end of a fit (checkpoints: ``agentcap.resume.checkpoints``).
``GRPOModule.configure_callbacks`` adds them all, so a plain ``L.Trainer(...).fit(module)`` gets them too."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping

from agentcap.evaluation.table import results_table
from agentcap.resume.appended import read_appended


class TickStep(L.Callback):
    """Keeps Lightning's ``global_step`` equal to the schedule tick.

    The module steps its own optimisers (one per stage), which Lightning does not count, so
    ``global_step`` would stay 0 and ``ModelCheckpoint`` would never save (it skips a step it has
    saved at). A resumed run continues at its tick, not at Lightning's reset counter: the logging
    step (``LearningRateMonitor``'s) too.
    """

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        for logger in trainer.loggers:
            wandb_steps_at_tick(logger)

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        loop = trainer.fit_loop.epoch_loop
        loop._batches_that_stepped = pl_module.tick
        loop.manual_optimization.optim_step_progress.total.completed = pl_module.tick

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.total.completed = pl_module.tick


def wandb_steps_at_tick(logger: Any) -> None:
    """W&B's own step (``_step``) is the tick: Lightning's ``WandbLogger.log_metrics`` logs the step only
    as ``trainer/global_step`` and lets wandb count its calls (several per tick: metrics, tables, the
    lr), so ``_step`` drifts from the tick. Patched on the instance; other loggers are left alone."""
    try:
        from lightning.pytorch.loggers import WandbLogger
    except ImportError:  # pragma: no cover
        return
    if not isinstance(logger, WandbLogger) or getattr(logger, "_agentcap_steps", False) \
            or logger._wandb_init.get("sync_tensorboard"):
        return
    from lightning.fabric.utilities.logger import _add_prefix

    def log_metrics(metrics: Any, step: int | None = None) -> None:
        metrics = _add_prefix(metrics, logger._prefix, logger.LOGGER_JOIN_CHAR)
        if step is None:
            logger.experiment.log(metrics)
        else:
            logger.experiment.log({**metrics, "trainer/global_step": step}, step=int(step))

    logger.log_metrics, logger._agentcap_steps = log_metrics, True


def logged(pl_module: Any) -> dict[str, float]:
    """What the module logged for the tick that just ended (``GRPOModule._emit``)."""
    if getattr(pl_module, "__dict__", {}).get("_logged_tick") != pl_module.tick - 1:
        return {}
    return dict(pl_module.__dict__.get("logged") or {})


class LogLines(L.Callback):
    """One line per logging step on stdout when it is not a terminal (a run redirected to a file, a
    batch job) or when the run has no progress bar: the stage, the tick, the reward, the loss, the
    clipped-completion share and the time. Every ``trainer.log_every_n_steps`` ticks, and at the
    first and last tick of every stage and every evaluation."""

    def __init__(self, stream: Any = None, force: bool | None = None):
        self.stream, self.force = stream, force
        self._started: float | None = None
        self._tick_started: float | None = None

    def _active(self, trainer: L.Trainer) -> bool:
        if not trainer.is_global_zero:
            return False
        if self.force is not None:
            return self.force
        stream = self.stream or sys.stdout
        return trainer.progress_bar_callback is None or not getattr(stream, "isatty", lambda: False)()

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._started = time.monotonic()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._tick_started = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        schedule = getattr(pl_module, "schedule", None)
        if schedule is None or not self._active(trainer):
            return
        tick = pl_module.tick - 1
        index, step = schedule.locate(tick)
        stage = schedule.stages[index]
        every = max(int(getattr(trainer, "log_every_n_steps", 1) or 1), 1)
        if not (stage.kind == "evaluate" or step == 0 or step + 1 == stage.ticks() or (tick + 1) % every == 0):
            return
        now = time.monotonic()
        seconds = now - (self._tick_started or now)
        elapsed = timedelta(seconds=int(now - (self._started or now)))
        line = f"agentcap: [{index + 1}/{len(schedule.stages)}] {stage.name} tick {tick + 1}/{schedule.total}"
        line += " " + " ".join(log_fields(stage, logged(pl_module)))
        print(f"{line} {seconds:.2f} s/tick elapsed {elapsed}".replace("  ", " "), file=self.stream or sys.stdout,
              flush=True)


def log_fields(stage: Any, metrics: dict[str, float]) -> list[str]:
    """The few figures of a log line, by stage kind."""
    def value(key: str, name: str) -> list[str]:
        return [f"{name} {metrics[key]:.4g}"] if key in metrics and not math.isnan(metrics[key]) else []

    agent = stage.agent
    if stage.kind == "evaluate":
        return [f"({stage.split})", *value(f"eval/{stage.name}/reward", "reward")]
    if stage.kind == "sft":
        return [agent, *value(f"loss/{agent}/sft", "loss")]
    spread = [v for k, v in metrics.items() if k.startswith("utility/") and k.endswith("/zero_spread")]
    fields = [agent, *value(f"reward/{agent}/total", "reward"), *value(f"reward_std/{agent}/total", "±"),
              *value(f"loss/{agent}/loss", "loss"), *value(f"loss/{agent}/kl", "kl"),
              *value(f"loss/{agent}/grad_norm", "grad_norm"), *value(f"rollout/{agent}/clipped", "clipped")]
    if spread:
        fields.append(f"zero_spread {max(spread):.2f}")
    return fields


class SpreadWatch(L.Callback):
    """Warns when a GRPO stage's groups have had no spread for ``steps`` steps in a row: every group's
    utilities equal (``utility/<kind>/zero_spread`` 1.0), so every advantage is 0 and, without a KL
    term, the gradient is 0 (``grad_norm`` 0): nothing trains. Once per stage."""

    def __init__(self, steps: int = 10):
        self.steps = steps
        self._flat: dict[str, int] = {}
        self._warned: set[str] = set()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        schedule = getattr(pl_module, "schedule", None)
        if schedule is None:
            return
        stage = schedule.stages[schedule.locate(pl_module.tick - 1)[0]]
        metrics = logged(pl_module)
        spread = [v for k, v in metrics.items() if k.startswith("utility/") and k.endswith("/zero_spread")]
        if stage.kind != "grpo" or not spread:
            return
        flat = all(v >= 1.0 for v in spread)
        self._flat[stage.name] = self._flat.get(stage.name, 0) + 1 if flat else 0
        if self._flat[stage.name] >= self.steps and stage.name not in self._warned and trainer.is_global_zero:
            self._warned.add(stage.name)
            grad = metrics.get(f"loss/{stage.agent}/grad_norm")
            warnings.warn(zero_spread_message(stage, self._flat[stage.name], grad), UserWarning, stacklevel=2)


def zero_spread_message(stage: Any, steps: int, grad_norm: float | None) -> str:
    grad = f", loss/{stage.agent}/grad_norm {grad_norm:.3g}" if grad_norm is not None else ""
    return (f"agentcap: GRPO stage {stage.name!r} ({stage.agent}): every group has had zero spread for {steps} "
            f"steps (utility/*/zero_spread 1.0{grad}): all advantages are 0, so nothing trains. Give the reward "
            "room to differ inside a group (a graded reward, not a 0/1 one), raise group_size or the "
            "temperature, or warm the agent up with SFT.")


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
        kept = [line for line, row in read_appended(path) if row.get("tick", -1) < pl_module.tick]  # torn: named
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
    refuses one that never appears, when ``strict``); one of a split no evaluate stage uses
    (``val/reward`` on a schedule that evaluates ``test``) is refused when the fit starts."""

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        schedule = getattr(pl_module, "schedule", None)
        if schedule is None:
            return
        splits = sorted({s.split for s in schedule.stages if s.kind == "evaluate"})
        for callback in trainer.callbacks:
            if not isinstance(callback, EarlyStopping) or not callback.strict:
                continue
            split, _, metric = str(callback.monitor).partition("/")
            if split in ("train", "val", "test") and metric and split not in splits:
                alternatives = ", ".join(f"{s}/{metric}" for s in splits) or "none: no stage evaluates"
                raise ValueError(
                    f"EarlyStopping(monitor={callback.monitor!r}): no evaluate stage of the schedule uses the "
                    f"{split!r} split, so it would never be logged (what is: {alternatives})"
                )

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
