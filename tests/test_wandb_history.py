"""tools/wandb_history.py: an offline W&B run's logged curve, read back without syncing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import wandb_history  # noqa: E402


def test_logged_values_come_back_in_order_and_windows_pair_by_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    curves = {"a": [0.5, 0.6, 0.9, 1.0], "b": [1.0, 1.0, 0.5, 0.5]}
    for name, values in curves.items():
        run = wandb.init(project="agentcap-test", dir=str(tmp_path / name), mode="offline")
        for step, value in enumerate(values):
            run.log({"reward/policy/count": value, "other": step})
        run.log({"unrelated": 1.0})  # a log call without the key is skipped
        run.finish()
    runs = [str(tmp_path / name) for name in curves]
    assert wandb_history.series(runs[0], "reward/policy/count") == curves["a"]
    text = wandb_history.main([*runs, "--key", "reward/policy/count", "--windows", "1-2,3-4"])
    assert "(+0.400, -0.500)" in text  # (0.95 - 0.55, 0.5 - 1.0)


def test_a_foreign_file_is_named(tmp_path):
    bad = tmp_path / "wandb" / "latest-run" / "run-x.wandb"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a run file")
    with pytest.raises(ValueError, match=r"run-x\.wandb: not a W&B run file"):
        wandb_history.series(str(tmp_path), "k")
    with pytest.raises(FileNotFoundError, match="no wandb/latest-run"):
        wandb_history.series(str(tmp_path / "missing"), "k")
