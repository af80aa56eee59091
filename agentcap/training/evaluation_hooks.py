"""The evaluation side of :class:`agentcap.training.module.GRPOModule`: Lightning's validate / test / predict
hooks and the ``evaluate`` stages of a schedule, all through :func:`evaluate_rollouts`.

A mixin, so that the module file stays the training algorithm; it reads the module's ``splits``,
``eval_limit``, ``generation_batch_size``, ``seed``, ``summary``, ``tick``, ``run_dir`` and
``eval_metrics``.

Evaluation metrics go to the loggers once, through ``GRPOModule._emit``, and to Lightning through ``self.log``
with ``logger=False``: that fills ``trainer.callback_metrics`` (``ModelCheckpoint`` /
``EarlyStopping`` can monitor ``eval/<stage>/<metric>``) without the loggers seeing a value
repeated at every later tick.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from agentcap.core.manifests import ManifestError, resolve
from agentcap.core.schedule import Stage
from agentcap.evaluation.benchmark import (
    build_benchmark_judge,
    cache_key,
    evaluate_benchmark,
    parse_judge_spec,
    read_benchmark,
    stage_metrics,
)
from agentcap.evaluation.captioning import CaptionMetrics, warn
from agentcap.evaluation.items import write_eval_items
from agentcap.evaluation.predictions import write_predictions
from agentcap.evaluation.rollouts import evaluate_rollouts, write_summary
from agentcap.evaluation.tasks import caption_text
from agentcap.parallel import distributed
from agentcap.training.logs import log_captions


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
        driver = self.splits.driver(stage.split, stage)
        result = evaluate_rollouts(
            driver, self.eval_limit, self.generation_batch_size, stage.greedy,
            self.seed * 1_000_003 + self.tick * 10_007,  # sampled: per trajectory, any split
            captioning=self.captioning(), rows=rows, progress=self._evaluation_progress(stage.name),
        )
        if getattr(self, "benchmark", None) is not None and stage.greedy:
            result.update(self.stage_benchmark(stage, driver, rows))
        self.summary[stage.name] = result
        metrics = {f"eval/{stage.name}/{k}": v for k, v in result.items()}
        self._emit(metrics)  # GRPOModule._emit: every logger, and the tick's log line
        self.log_dict(metrics, logger=False, batch_size=1)  # the same on every rank (gathered rows)
        if distributed.world()[0] == 0:
            write_eval_items(self.run_dir, stage.name, rows)
            log_captions(self.loggers, stage.name, rows, self.tick)
            self.write_summary()
        return result

    def stage_benchmark(self, stage: Stage, driver: Any, rows: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Caption-as-evidence accuracy on ``--model.benchmark`` through ``evaluate_benchmark`` (the code
        of ``agentcap evaluate --benchmark``). A clip this stage has just rolled out keeps that caption;
        the others are rolled out greedily by the same driver, split over ranks and gathered. Rank 0
        asks the judge and writes ``<run_dir>/benchmarks/<stage>/``; every rank receives the metrics."""
        config = self.benchmark
        questions = read_benchmark(config.path, config.limit)
        env = driver.scorer.unwrapped
        captions = {_clip_of(item): {"caption": row["caption"]} for item, row in zip(env.items, rows)}
        clips = list(dict.fromkeys(q["_clip"] for q in questions))
        captions.update(self._roll_out_clips(driver, [c for c in clips if c not in captions]))
        metrics = None
        if distributed.world()[0] == 0:
            if getattr(self, "_benchmark_judge", None) is None:
                self._benchmark_judge = build_benchmark_judge(
                    parse_judge_spec(config.judge, "--model.benchmark.judge"), str(self.device))
            identity = cache_key("stage rollouts", [[c, captions[c]] for c in clips])  # content: never stale
            summary = evaluate_benchmark(questions, lambda wanted: {c: captions[c] for c in wanted}, identity,
                                         self._benchmark_judge, os.path.join(self.run_dir, "benchmarks", stage.name))
            metrics = stage_metrics(summary)
        return distributed.gather_objects(metrics)[0]

    def _roll_out_clips(self, driver: Any, clips: Sequence[str]) -> dict[str, dict[str, str]]:
        """Greedy captions of raw audio files (``{path: {"caption"} or {"error"}}``, every rank's):
        each rank takes every ``world``-th clip, and all make as many rollout calls (sharded agents)."""
        env = driver.scorer.unwrapped
        if clips and not hasattr(env, "item_from_audio"):
            raise ValueError(f"--model.benchmark: {type(env).__name__} does not caption raw audio files, and "
                             f"{len(clips)} benchmark clips (e.g. {clips[0]}) are not items of this split")
        rank, world = distributed.world()
        made: dict[str, dict[str, str]] = {}
        items = []
        for path in clips[rank::world]:
            try:
                items.append({**env.item_from_audio(path), "id": path})
            except ManifestError as err:  # missing or undecodable: this clip's questions count as wrong
                made[path] = {"error": str(err)}
        chunk = max(1, self.generation_batch_size)
        for start in range(0, distributed.most(-(-len(items) // chunk)) * chunk, chunk):
            part = items[start : start + chunk]
            for item, episode in zip(part, driver.run(items=part, greedy=True, old_logprobs=False).episodes):
                made[item["id"]] = {"caption": caption_text(env, episode.actions[-1].text if episode.actions else "")}
        return {path: value for share in distributed.gather_objects(made) for path, value in share.items()}

    def _evaluation_progress(self, stage: str):
        """The console's bar of evaluated items (``agentcap.training.console.StageProgressBar``), if it has one."""
        bar = self.trainer.progress_bar_callback if self._trainer is not None else None
        show = getattr(bar, "evaluation_progress", None)
        return None if show is None else (lambda done, total: show(stage, done, total))

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


def _clip_of(item: dict[str, Any]) -> str | None:
    """An item's audio file as ``read_benchmark`` names a question's clip (absolute path)."""
    audio = item.get("audio")
    return os.path.abspath(resolve(audio, item.get("_manifest"))) if isinstance(audio, str) else None
