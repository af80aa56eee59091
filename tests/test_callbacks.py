"""Lightning's stock callbacks on a GRPOModule fit: LearningRateMonitor sees each stage's optimiser,
EarlyStopping acts after an evaluate stage, ModelCheckpoint(monitor, every_n_train_steps) saves without
extra flags, and a plain ``L.Trainer(...).fit(module)`` gets tick checkpoints and the results table."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import Logger

from agentcap.cli import AgentcapCLI
from agentcap.resume.checkpoints import TickCheckpoint, checkpoints
from agentcap.training.loading import load_module
from agentcap.training.module import GRPOModule
from agentcap.training.optim import lr_factor


class Recorder(Logger):
    """Every ``log_metrics`` call, in memory."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def module_for(tmp_path: Path, world: Path, make_read_config, stages: list[dict]) -> GRPOModule:
    config = make_read_config(tmp_path / "run", world, stages)
    torch.manual_seed(0)
    return load_module(str(config), None)


def trainer(**kwargs) -> L.Trainer:
    settings = dict(accelerator="cpu", devices=1, max_epochs=1, num_sanity_val_steps=0, enable_model_summary=False,
                    enable_progress_bar=False, log_every_n_steps=1)
    return L.Trainer(**{**settings, **kwargs})


@pytest.mark.slow  # a Trainer fit
def test_learning_rate_monitor_logs_each_stages_scheduled_lr(tmp_path, toy_movie, make_read_config):
    stages = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 3, "lr": 1e-3, "warmup_steps": 1,
         "lr_schedule": "linear"},
        {"name": "eval", "kind": "evaluate", "split": "test"},
        {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2, "lr": 5e-4, "lr_schedule": "cosine"},
    ]
    module = module_for(tmp_path, toy_movie, make_read_config, stages)
    recorder = Recorder()
    trainer(logger=recorder, enable_checkpointing=False, callbacks=[LearningRateMonitor("step")]).fit(module)
    expected = {tick: 1e-3 * lr_factor(tick, 3, 1, "linear") for tick in range(3)}
    expected.update({4 + step: 5e-4 * lr_factor(step, 2, 0, "cosine") for step in range(2)})
    for key in ("lr-policy", "lr/policy"):  # LearningRateMonitor's, and the module's own every step
        logged = {step: row[key] for step, row in recorder.rows if key in row}
        assert logged == pytest.approx(expected), key


@pytest.mark.slow  # a Trainer fit
def test_early_stopping_stops_after_an_evaluate_stage(tmp_path, toy_movie, make_read_config):
    evaluate = {"kind": "evaluate", "split": "val"}
    sft = {"kind": "sft", "agent": "policy", "steps": 1}
    stages = [{"name": "e0", **evaluate}, {"name": "s0", **sft}, {"name": "e1", **evaluate},
              {"name": "s1", **sft}, {"name": "e2", **evaluate}]
    module = module_for(tmp_path, toy_movie, make_read_config, stages)
    # no evaluation can beat the first by 1e9: the second one stops the run
    stop = EarlyStopping(monitor="val/reward", mode="max", min_delta=1e9, patience=1)
    fit = trainer(logger=False, enable_checkpointing=False, callbacks=[stop])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fit.fit(module)
    assert module.tick == 3 and fit.should_stop and stop.wait_count >= 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary) == {"e0", "e1"}
    assert out.getvalue().strip().splitlines()[-1].endswith("summary.json")


@pytest.mark.slow  # a Trainer fit through the CLI
def test_model_checkpoint_with_monitor_and_every_n_train_steps_saves(tmp_path, toy_movie, make_read_config):
    stages = [{"name": "e0", "kind": "evaluate", "split": "val"},
              {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
              {"name": "e1", "kind": "evaluate", "split": "val"}]
    config = make_read_config(tmp_path / "run", toy_movie, stages)
    best = tmp_path / "best"
    with contextlib.redirect_stdout(io.StringIO()):  # no --trainer.enable_checkpointing needed
        cli = AgentcapCLI(
            GRPOModule, datamodule_class=None, save_config_kwargs={"overwrite": True},
            args=["fit", "--config", str(config), "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                  "--trainer.callbacks.monitor=val/reward", "--trainer.callbacks.mode=max",
                  "--trainer.callbacks.every_n_train_steps=1", f"--trainer.callbacks.dirpath={best}"],
        )
    saver = next(c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert float(saver.best_model_score) == pytest.approx(max(summary["e0"]["reward"], summary["e1"]["reward"]))
    assert Path(saver.best_model_path).parent == best
    state = torch.load(saver.best_model_path, weights_only=True)
    assert state["agentcap"]["tick"] == state["global_step"] >= 1  # saved at a tick, the step Lightning counts


@pytest.mark.slow  # a Trainer fit
def test_a_plain_trainer_fit_writes_tick_checkpoints_and_prints_the_table(tmp_path, toy_movie, make_read_config,
                                                                          capsys):
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 3},
              {"name": "after", "kind": "evaluate", "split": "test"}]
    module = module_for(tmp_path, toy_movie, make_read_config, stages)
    run_dir = tmp_path / "run"
    # the stock progress bar (enable_progress_bar=True), the user's own TickCheckpoint kept
    fit = trainer(logger=False, enable_progress_bar=True, callbacks=[TickCheckpoint(every=1, keep=2)],
                  default_root_dir=run_dir)
    fit.fit(module)
    names = [Path(p).name for p in checkpoints(str(run_dir))]
    assert names == ["tick-000004.ckpt", "tick-000003.ckpt"]  # every tick, the newest two
    assert Path(TickCheckpoint.path(str(run_dir))).samefile(run_dir / "checkpoints" / "tick-000004.ckpt")
    state = torch.load(run_dir / "checkpoints" / "tick-000003.ckpt", weights_only=True)
    assert state["agentcap"]["optimizer"]["state"] and state["optimizer_states"] == []  # saved once, by agentcap
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[-1] == str((run_dir / "summary.json").resolve())
    assert any(line.startswith("metric") and "after" in line for line in lines)


@pytest.mark.slow  # a Trainer fit
def test_a_plain_trainer_fit_adds_a_default_tick_checkpoint(tmp_path, toy_movie, make_read_config):
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 2}]
    module = module_for(tmp_path, toy_movie, make_read_config, stages)
    fit = trainer(logger=False, default_root_dir=tmp_path / "run")
    fit.fit(module)
    assert [type(c).__name__ for c in fit.callbacks if type(c).__name__ == "TickCheckpoint"] == ["TickCheckpoint"]
    assert [Path(p).name for p in checkpoints(str(tmp_path / "run"))] == ["tick-000002.ckpt"]  # the stage's end
