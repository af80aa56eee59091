"""Algorithm 1 end to end on tiny agents: every stage kind, the S1…S5 summary, and inference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # every test runs `agentcap fit` in a subprocess


#: Algorithm 1: SFT of every role, S1, Captioner GRPO, S2, Instruct GRPO, S3, Composer warm-up, S4, one cycle, S5.
ALGORITHM_1 = [
    {"name": "sft_captioner", "kind": "sft", "agent": "captioner", "steps": 2},
    {"name": "sft_instruct", "kind": "sft", "agent": "instruct", "steps": 2},
    {"name": "sft_composer", "kind": "sft", "agent": "composer", "steps": 2},
    {"name": "S1", "kind": "evaluate", "split": "test"},
    {"name": "captioner_grpo", "kind": "grpo", "agent": "captioner", "steps": 1, "env": {"mode": "captioner"}},
    {"name": "S2", "kind": "evaluate", "split": "test"},
    {"name": "instruct_grpo", "kind": "grpo", "agent": "instruct", "steps": 1, "env": {"mode": "instruct"},
     "harvest": {"mode": "game"}, "harvest_items": 3},
    {"name": "S3", "kind": "evaluate", "split": "test"},
    {"name": "composer_warmup", "kind": "grpo", "agent": "composer", "steps": 1},
    {"name": "S4", "kind": "evaluate", "split": "test"},
    {"name": "cycle1_instruct", "kind": "grpo", "agent": "instruct", "steps": 1, "env": {"mode": "instruct"},
     "harvest": {"mode": "game"}, "harvest_items": 3},
    {"name": "cycle1_composer", "kind": "grpo", "agent": "composer", "steps": 1},
    {"name": "S5", "kind": "evaluate", "split": "test"},
]


@pytest.fixture
def acecap_config(make_game_config):
    """The shared tiny ACE-Cap run (tests/conftest.py) with Algorithm 1's stages, no logger."""

    def build(run_dir: Path, world: Path) -> Path:
        return make_game_config(run_dir, world, ALGORITHM_1, trainer={"logger": False}, new_tokens=(8, 12, 8),
                                minibatch_size=16)

    return build


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentcap.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_algorithm_1_runs_every_stage_and_captions(tmp_path, toy_soundscapes, acecap_config):
    config = acecap_config(tmp_path / "run", toy_soundscapes)
    result = run("fit", "--config", str(config))
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert list(summary) == ["S1", "S2", "S3", "S4", "S5"]
    for stage in summary.values():
        assert {"g2p_c0", "g2p_evidence", "g2p_final", "questions", "retention_gap"} <= set(stage)
        assert 0 <= stage["questions"] <= 2

    audio = sorted((toy_soundscapes / "audio").glob("test-*.wav"))[:2]
    out = tmp_path / "captions.jsonl"
    result = run("caption", "--config", str(config), "--audio", *map(str, audio), "--out", str(out))
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        agents = [step["agent"] for step in row["trace"]]
        assert agents[0] == "captioner" and agents[-1] == "composer"
        assert row["trace"][-1]["kind"] == "final" and row["caption"] == row["trace"][-1]["text"]
    assert "captioner/caption" in result.stdout  # the evidence trace is printed


def test_a_run_killed_inside_an_instruct_stage_replays_the_same_harvest(tmp_path, toy_soundscapes, acecap_config):
    """Resuming mid-stage must not harvest again: a partly trained Instruct at another tick would give
    other histories, so the stage would train on prompts it never started with."""
    import signal
    import time

    import torch

    config = acecap_config(tmp_path / "run", toy_soundscapes)
    spec = yaml.safe_load(config.read_text())
    spec["model"]["stages"] = [
        {"name": "sft_composer", "kind": "sft", "agent": "composer", "steps": 2},
        {"name": "instruct_grpo", "kind": "grpo", "agent": "instruct", "steps": 30, "env": {"mode": "instruct"},
         "harvest": {"mode": "game"}, "harvest_items": 4},
    ]
    config.write_text(yaml.safe_dump(spec, sort_keys=False))
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen([sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), "--checkpoint_every", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    saved, deadline = None, time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists():
            state = torch.load(ckpt, map_location="cpu", weights_only=True)["agentcap"]
            if state["stage_index"] == 1 and 2 < state["tick"] < 30:
                saved = state
                break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert saved is not None and saved["replay"], "no checkpoint inside the Instruct stage before the kill"
    harvested = json.loads(saved["replay"])
    assert len(harvested) == 1 and harvested[0] and all("question" in item for item in harvested[0])

    result = run("fit", "--config", str(config), "--checkpoint_every", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    total = len(harvested[0])
    assert f"instruct_grpo: replaying the {total} Instruct items harvested before the checkpoint" in result.stderr
    final = torch.load(ckpt, map_location="cpu", weights_only=True)["agentcap"]
    assert final["tick"] == 32
    assert json.loads(final["replay"]) == harvested
