"""tools/gpu_check.py --smoke: every part of the prepared GPU check runs at tiny size on the CPU, with
only the packages the lent GPU machine's image has (agentcap's other dependencies made unimportable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# agentcap dependencies that the GPU image lacks (/work/.library/device/KINDS.md's package list)
ABSENT = ("gymnasium", "rouge_score", "wandb", "jsonargparse", "soundfile", "datasets", "tensorboardX", "vllm")


@pytest.mark.slow  # a process that builds, shards and steps a model (~30 s on the shared CPU)
def test_the_smoke_run_covers_every_part_without_the_missing_packages(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in ABSENT))
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--smoke", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    grpo, prefix = results["grpo"], results["prefix"]
    assert grpo["finite"] and grpo["grad_norm"] > 0 and grpo["update_tokens_per_s"] > 0 and 0 < grpo["mfu"] < 1
    assert grpo["rows"] == 4 and grpo["generate_tokens_per_s"] > 0
    assert prefix["prompts"] == 6 and prefix["same_answer"] == 1.0 and prefix["max_abs_logit_gap"] < 0.05
    assert results["vllm"]["status"].startswith("vllm: not installed")
    ahead = results["async"]  # K = 1 against K = 0 through the rollout pipeline
    assert ahead["pairs"] == 1 and len(ahead["k1_over_k0"]) == 1 and ahead["k0_step_s"] > 0 and ahead["k1_step_s"] > 0
    assert grpo["step"].startswith("agentcap (GRPOModule.update") and "agentcap's own step" in done.stdout
    assert "| agentcap's grpo step, FSDP2 bf16-mixed (" in done.stdout and "| prefix reader (" in done.stdout and "| vllm engine |" in done.stdout
    assert "| rollouts ahead, K = 1 vs K = 0 (" in done.stdout
