"""Data parallel on CPU: two processes train, and equal one process on the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def fit(config: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
    )


def weights(run: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return state["state_dict"]


def test_two_processes_equal_one(tmp_path, toy_movie, make_read_config):
    """Same global batch of demonstrations per step, split over 2 ranks: same weights and same synced
    held-out metrics as one process, up to float tolerance."""
    stages = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 4},
        {"name": "after", "kind": "evaluate", "split": "test"},
    ]
    single = make_read_config(tmp_path / "one", toy_movie, stages, sft_batch_size=4)
    double = make_read_config(tmp_path / "two", toy_movie, stages, sft_batch_size=2)
    one = fit(single)
    assert one.returncode == 0, one.stderr[-3000:]
    two = fit(double, "--trainer.devices=2", "--trainer.strategy=ddp")
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())["after"]
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())["after"]
    assert s1.keys() == s2.keys()
    for key in s1:
        assert abs(s1[key] - s2[key]) < 1e-5, (key, s1[key], s2[key])


def test_grpo_trains_under_ddp(tmp_path, toy_movie, make_read_config):
    stages = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
        {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2},
        {"name": "after", "kind": "evaluate", "split": "test"},
    ]
    config = make_read_config(tmp_path / "run", toy_movie, stages, sft_batch_size=2)
    result = fit(config, "--trainer.devices=2", "--trainer.strategy=ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["agentcap"]["tick"] == 5
    metrics = next((tmp_path / "run").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "reward/accuracy" in metrics and "loss/policy/pg_loss" in metrics
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"reward", "accuracy"} <= set(summary["after"])
