"""The evaluation side of :class:`agentcap.training.module.GRPOModule`: Lightning's validate / test / predict
hooks and the ``evaluate`` stages of a schedule, all through :func:`evaluate_rollouts`.

A mixin, so that the module file stays the training algorithm; it reads the module's ``splits``,
``eval_limit``, ``generation_batch_size``, ``seed``, ``summary``, ``tick``, ``run_dir`` and
``eval_metrics``.

Evaluation metrics go to the loggers once, through ``emit``, and to Lightning through ``self.log``
with ``logger=False``: that fills ``trainer.callback_metrics`` (``ModelCheckpoint`` /
``EarlyStopping`` can monitor ``eval/<stage>/<metric>``) without the loggers seeing a value
repeated at every later tick.
"""

from __future__ import annotations

from typing import Any

import torch

from agentcap.evaluation.captioning import CaptionMetrics, warn
from agentcap.evaluation.items import write_eval_items
from agentcap.evaluation.predictions import write_predictions
from agentcap.evaluation.rollouts import evaluate_rollouts, write_summary
from agentcap.parallel import distributed
from agentcap.training.logs import emit, log_captions
from agentcap.training.schedule import Stage


class EvaluationHooks:
    """`agentcap validate / test` evaluate a split once; `agentcap predict` captions the test split."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.trainer.state.fn == "fit":
            return  # `fit` evaluates through the schedule's own evaluate stages
        self.evaluate(Stage(name="validate", kind="evaluate", split="val"))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.evaluate(Stage(name="test", kind="evaluate", split="test"))

    @torch.no_grad()
    def predict_step(self, batch: Any, batch_idx: int) -> list[dict[str, Any]]:
        """Captions of the test split (READ: recurrent), also written to ``<run_dir>/predictions.jsonl``."""
        driver = self.splits.driver("test", Stage(name="predict", kind="evaluate", split="test"))
        env = driver.scorer.unwrapped
        rank, world = distributed.world()
        results = env.caption(driver, env.items[rank::world])
        write_predictions(self.run_dir, results)
        return results

    @torch.no_grad()
    def evaluate(self, stage: Stage) -> dict[str, float]:
        """Rollouts on a held-out split (greedy unless the stage says otherwise); every reward
        component averaged over the items of all ranks; rank 0 writes ``<run_dir>/eval/<stage>.jsonl``."""
        rows: list[dict[str, Any]] = []
        result = evaluate_rollouts(
            self.splits.driver(stage.split, stage), self.eval_limit, self.generation_batch_size, stage.greedy,
            self.seed * 1_000_003 + self.tick * 10_007,  # sampled: per trajectory, any split
            captioning=self.captioning(), rows=rows,
        )
        self.summary[stage.name] = result
        metrics = {f"eval/{stage.name}/{k}": v for k, v in result.items()}
        emit(self.loggers, metrics, self.tick)
        self.log_dict(metrics, logger=False, batch_size=1)  # the same on every rank (gathered rows)
        if distributed.world()[0] == 0:
            write_eval_items(self.run_dir, stage.name, rows)
            log_captions(self.loggers, stage.name, rows, self.tick)
            self.write_summary()
        return result

    def captioning(self):
        """The papers' captioning metrics (``eval_metrics: papers``), one instance per module: METEOR's
        JVM and the BERTScore encoder start once per run."""
        if getattr(self, "eval_metrics", "rewards") != "papers":
            return None
        if getattr(self, "_captioning", None) is None:
            self._captioning = CaptionMetrics()
            if distributed.world()[0] == 0:
                warn(self._captioning.notes)
        return self._captioning

    def write_summary(self) -> str:
        """``<run_dir>/summary.json``; `validate` / `test` add their entry to a training run's file."""
        merge = self._trainer is not None and self.trainer.state.fn in ("validate", "test")
        return write_summary(self.run_dir, self.summary, merge=merge)
