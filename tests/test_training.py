"""End to end through `agentcap fit`: the schedule, summary.json, checkpoints and resumption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # every test runs `agentcap fit` in a subprocess

STAGES = [
    {"name": "sft", "kind": "sft", "agent": "policy", "steps": 6},
    {"name": "before_grpo", "kind": "evaluate", "split": "test"},
    {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 3},
    {"name": "after_grpo", "kind": "evaluate", "split": "test"},
]


def fit(config: Path, *extra: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
    )


def test_fit_runs_the_schedule_and_prints_the_summary_last(tmp_path, toy_movie, make_read_config):
    config = make_read_config(tmp_path / "run", toy_movie, STAGES)
    result = fit(config)
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last == str((tmp_path / "run" / "summary.json").resolve())
    summary = json.loads(Path(last).read_text())
    assert set(summary) == {"before_grpo", "after_grpo"}
    for stage in summary.values():
        assert {"reward", "accuracy", "format", "length", "coherence"} <= set(stage)
    # per-item rows of every evaluate stage: one per held-out item, and their mean is the summary's
    from agentcap.evaluation.items import read_eval_items

    for name, stage in summary.items():
        rows = read_eval_items(str(tmp_path / "run"), name)
        assert len(rows) == min(4, len((toy_movie / "test.jsonl").read_text().splitlines()))  # eval_limit
        assert sum(r["reward"] for r in rows.values()) / len(rows) == pytest.approx(stage["reward"])
    # every logged group is there: rewards, losses, rollout statistics
    metrics = next((tmp_path / "run").rglob("metrics.csv")).read_text().splitlines()[0]
    for name in ("reward/policy/accuracy", "reward/policy/format", "reward/policy/length", "reward/policy/coherence",
                 "reward_std/policy/total", "rollout/policy/clipped", "loss/policy/pg_loss",
                 "loss/policy/kl", "loss/policy/clipfrac", "loss/policy/entropy", "rollout/policy/response_length",
                 "loss/policy/sft"):
        assert name in metrics, name
    samples = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert samples and {"prompt", "response", "reward", "advantage"} <= set(json.loads(samples[0]))
    # one row per tick, and a stage's metrics only on its own ticks: the SFT loss is not logged again
    # during GRPO, nor the GRPO reward after it (Lightning's self.log would repeat both)
    import csv

    rows = list(csv.DictReader(next((tmp_path / "run").rglob("metrics.csv")).open()))
    sft = [int(r["step"]) for r in rows if r.get("loss/policy/sft")]
    grpo = [int(r["step"]) for r in rows if r.get("reward/policy/total")]
    assert sft == list(range(6)) and grpo == [7, 8, 9]
    assert [int(r["step"]) for r in rows if r.get("eval/before_grpo/reward")] == [6]


def test_wandb_offline_logger_works(tmp_path, toy_movie, make_read_config):
    config = make_read_config(tmp_path / "run", toy_movie, STAGES[:2])
    result = fit(
        config,
        "--trainer.logger=lightning.pytorch.loggers.WandbLogger",
        f"--trainer.logger.save_dir={tmp_path}",
        "--trainer.logger.offline=true",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # everything a run writes is under its run_dir, whatever save_dir the logger was given
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*")), "no offline W&B run was written"


def test_killed_run_resumes_at_the_same_stage_and_step(tmp_path, toy_movie, make_read_config):
    stages = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 40},
        {"name": "after", "kind": "evaluate", "split": "test"},
    ]
    config = make_read_config(tmp_path / "run", toy_movie, stages)
    config = config.rename(tmp_path / "config.yaml")  # the run's own config.yaml will name the kill switch
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    # killed (SIGKILL) after tick 10: the newest checkpoint is tick 8's (tests/kill_switch.py)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    killed = subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), "--checkpoint_every", "4",
         "--trainer.callbacks+=kill_switch.KillAtTick", "--trainer.callbacks.tick=10"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)["agentcap"]
    assert saved["tick"] == 8
    result = fit(config, "--checkpoint_every", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stderr
    final = torch.load(ckpt, map_location="cpu", weights_only=True)["agentcap"]
    assert final["tick"] == 41
    # the resumed run did only the remaining steps
    lines = next((tmp_path / "run").rglob("metrics.csv"), None)
    assert lines is not None
    assert "after" in json.loads((tmp_path / "run" / "summary.json").read_text())
    # a changed schedule must not silently resume into the wrong stage
    other = fit(config, "--model.stages=[{name: other, kind: evaluate, split: val}]")
    assert other.returncode != 0 and "--model.stages" in other.stderr and "another config" in other.stderr
    anyway = fit(config, "--model.stages=[{name: other, kind: evaluate, split: val}]", "--resume", "anyway")
    assert anyway.returncode != 0 and "written by another schedule" in anyway.stderr


USER_PACKAGE = '''
from gymnasium.envs.registration import register

register(id="mytask/Echo-v0", entry_point="mytask.echo:EchoEnv")
'''

USER_ENV = '''
"""A throwaway user environment: say 'yes'."""
from agentcap import CaptionEnv, Score


class EchoEnv(CaptionEnv):
    """Say yes, politely."""

    required_fields = {"id": str}

    def begin(self, episode):
        return self.observation("policy", [{"role": "user", "content": "say yes please"}])

    def advance(self, episode, action):
        self.record(episode, "policy", "answer", action)
        return None

    def demonstrations(self, item):
        return [(self.begin(None), "yes yes")]

    def score(self, episodes):
        rewards = [float("yes" in e.actions[-1].text.split()) for e in episodes]
        return [Score(r, {"said_yes": r}, [r]) for r in rewards]
'''


def test_user_environment_registers_and_trains_by_id(tmp_path):
    package = tmp_path / "pkg" / "mytask"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(USER_PACKAGE)
    (package / "echo.py").write_text(USER_ENV)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"i{i}"}) + "\n" for i in range(4)))
    texts = tmp_path / "texts.txt"
    texts.write_text("yes no please say\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg"), "OMP_NUM_THREADS": "1"}
    listed = subprocess.run([sys.executable, "-m", "agentcap.cli", "envs", "mytask"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert "mytask/Echo-v0" in listed.stdout and "Say yes" in listed.stdout
    args = [
        "fit", "--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        f"--model.run_dir={tmp_path / 'run'}", "--model.env.id=mytask:mytask/Echo-v0",
        f"--model.env.train={{manifest: {manifest}}}", f"--model.env.val={{manifest: {manifest}}}",
        "--model.agents={policy: {toy: {media: none, hidden_size: 16, num_layers: 1, num_heads: 2, "
        f"intermediate_size: 32}}, build_tokenizer_from: [{texts}], max_new_tokens: 4, lr: 0.003}}}}",
        "--model.stages=[{name: sft, kind: sft, agent: policy, steps: 15}, {name: grpo, kind: grpo, agent: policy, "
        "steps: 2}, {name: after, kind: evaluate, split: val}]",
        "--model.group_size=2", "--model.rollout_batch_size=4", "--model.sft_batch_size=4",
    ]
    result = subprocess.run([sys.executable, "-m", "agentcap.cli", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["after"]["said_yes"] == 1.0


def test_validate_test_and_predict_subcommands(tmp_path, toy_movie, make_read_config):
    config = make_read_config(tmp_path / "run", toy_movie, STAGES[:1])
    assert fit(config).returncode == 0  # they evaluate the run's last checkpoint, and refuse without one
    for command in ("validate", "test", "predict"):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        result = subprocess.run([sys.executable, "-m", "agentcap.cli", command, "--config", str(config)],
                                cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, (command, result.stderr[-3000:])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"validate", "test"} <= set(summary) and "accuracy" in summary["test"]
    rows = (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()
    assert len(rows) == len((toy_movie / "test.jsonl").read_text().splitlines())
