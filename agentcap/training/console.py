"""The console of a run: one rich progress bar per schedule stage, its own losses, an ETA from the schedule.

Why not Lightning's bar as it is: a whole schedule is one epoch, so it shows "Epoch 0/0" and a
``v_num`` that say nothing, keeps the previous stage's loss on screen (``self.log`` keeps a value
until the epoch ends), estimates the time left as if every tick cost the same (an SFT step, a GRPO
rollout batch and an evaluation differ by orders of magnitude), and freezes while an evaluation
stage rolls out its items inside one training step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from rich.progress import ProgressColumn, TaskID
from rich.text import Text


class _TimeLeft(ProgressColumn):
    """Elapsed • time left; the time left is the bar's schedule estimate, counted down between ticks."""

    max_refresh = 0.5

    def __init__(self, bar: "StageProgressBar", style: Any = None):
        self.bar, self.style = bar, style
        super().__init__()

    def render(self, task: Any) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        left = self.bar.time_left()
        elapsed_text = "-:--:--" if elapsed is None else str(timedelta(seconds=int(elapsed)))
        left_text = "-:--:--" if left is None else str(timedelta(seconds=int(left)))
        return Text(f"{elapsed_text} • {left_text} left", style=self.style or "")


class StageProgressBar(RichProgressBar):
    """Lightning's rich bar, one bar per stage of ``pl_module.schedule``: "[2/5] grpo_captioner", the
    stage's step of its steps, the current stage's metrics only, and the run's time left estimated
    from the schedule's remaining ticks (each stage at the seconds per tick measured for it, or for
    its kind, or for the run so far). Evaluation stages get a bar of their items
    (:meth:`evaluation_progress`, called by ``agentcap.training.evaluation_hooks``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._stage: int | None = None
        self._eval_task: TaskID | None = None
        self._tick_started: float | None = None
        self._seconds: dict[int, list[float]] = defaultdict(list)  # stage index → seconds of each tick
        self._estimate: tuple[float, float] | None = None  # (seconds left, when estimated)

    def configure_columns(self, trainer: L.Trainer) -> list:
        columns = super().configure_columns(trainer)
        # Lightning's time column estimates from the epoch's average tick; ours from the schedule
        return [_TimeLeft(self, self.theme.time) if type(c).__name__ == "CustomTimeColumn" else c for c in columns]

    # --- the stage bar ------------------------------------------------------------------------
    def _locate(self, pl_module: Any) -> tuple[int, int] | None:
        schedule = getattr(pl_module, "schedule", None)
        if schedule is None or pl_module.tick >= schedule.total:
            return None
        return schedule.locate(pl_module.tick)

    def stage_description(self, pl_module: Any, index: int) -> str:
        """``[i/n] name``: where the run is in its schedule."""
        schedule = pl_module.schedule
        return f"[{index + 1}/{len(schedule.stages)}] {schedule.stages[index].name}"

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        where = self._locate(pl_module)
        if where is not None:
            self._show_stage(trainer, pl_module, *where)

    def _show_stage(self, trainer: L.Trainer, pl_module: Any, index: int, step: int) -> None:
        """Point the bar at stage ``index`` (at ``step`` of it) and drop the previous stage's metrics."""
        if self._stage is not None and index != self._stage:
            forget_bar_metrics(trainer)
        self._stage = index
        if self.progress is None or self.train_progress_bar_id is None:
            return
        stage = pl_module.schedule.stages[index]
        self.progress.reset(self.train_progress_bar_id, total=stage.ticks(), completed=step,
                            description=self.stage_description(pl_module, index), visible=True)
        self.refresh()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        where = self._locate(pl_module)
        if where is not None and where[0] != self._stage:
            self._show_stage(trainer, pl_module, *where)
        self._tick_started = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._tick_started is not None and self._stage is not None:
            self._seconds[self._stage].append(time.monotonic() - self._tick_started)
        schedule = getattr(pl_module, "schedule", None)
        if schedule is None:
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._estimate = (self.estimate_seconds_left(schedule, pl_module.tick), time.monotonic())
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        index, step = schedule.locate(max(pl_module.tick - 1, 0))
        self._update(self.train_progress_bar_id, step + 1)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module: Any) -> dict[str, Any]:
        """Lightning's bar metrics less ``v_num``, after the run's tick."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        schedule = getattr(pl_module, "schedule", None)
        if trainer.training and schedule is not None:
            metrics = {"tick": f"{pl_module.tick}/{schedule.total}", **metrics}
        return metrics

    # --- the time left --------------------------------------------------------------------------
    def estimate_seconds_left(self, schedule: Any, tick: int) -> float | None:
        """Seconds for the ticks from ``tick`` on: each stage's remaining ticks at its own measured
        seconds per tick, else its kind's (another GRPO stage), else the mean tick of the run so far."""
        if not self._seconds:
            return None
        every = [s for times in self._seconds.values() for s in times]
        by_kind: dict[str, list[float]] = defaultdict(list)
        for index, times in self._seconds.items():
            by_kind[schedule.stages[index].kind].extend(times)
        left = 0.0
        for index, stage in enumerate(schedule.stages):
            start = schedule.starts[index]
            ticks = max(0, min(stage.ticks(), start + stage.ticks() - tick))
            if not ticks:
                continue
            times = self._seconds.get(index) or by_kind.get(stage.kind) or every
            left += ticks * sum(times) / len(times)
        return left

    def time_left(self) -> float | None:
        """The latest estimate, less the time spent on the current tick since."""
        if self._estimate is None or self._estimate[0] is None:
            return None
        seconds, when = self._estimate
        return max(0.0, seconds - (time.monotonic() - when))

    # --- evaluation items -----------------------------------------------------------------------
    def evaluation_progress(self, stage: str, done: int, total: int) -> None:
        """A bar of the items an evaluation has rolled out; hidden when it reaches ``total``."""
        if self.progress is None or self.is_disabled:
            return
        if self._eval_task is None or done == 0:
            if self._eval_task is not None:
                self.progress.update(self._eval_task, visible=False)
            self._eval_task = self.progress.add_task(f"  eval {stage}", total=max(total, 1))
        self.progress.update(self._eval_task, completed=done, total=max(total, 1))
        if done >= total:
            self.progress.update(self._eval_task, visible=False)
            self._eval_task = None
        self.refresh()


def forget_bar_metrics(trainer: L.Trainer) -> None:
    """Drop the values logged with ``prog_bar=True`` so far: Lightning keeps them until the epoch ends,
    and a schedule is one epoch. A key logged again (the next GRPO stage's reward) comes back; the
    callback metrics a ``ModelCheckpoint`` monitors are kept."""
    results = getattr(trainer, "_results", None)
    for result in (results or {}).values():
        if getattr(result.meta, "prog_bar", False):
            result.reset()
    connector = getattr(trainer, "_logger_connector", None)
    if connector is not None:
        connector._progress_bar_metrics.clear()
