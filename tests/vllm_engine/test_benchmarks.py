"""The vLLM benchmarks' smallest settings, in the environment that has vLLM (tests/test_benchmarks_smoke.py
skips them in the main one): HF generate against one engine (full weights, LoRA), and two shared-base roles on one engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flags, expected", [
    ([], ["| vllm |", "weight sync"]),
    (["--lora"], ["+ LoRA r 8", "| vllm |", "adapter sync"]),
    (["--shared-base"], ["| one vllm engine | 1 |", "median round vllm / hf", "LoRA ids in the engine"]),
])
def test_rollout_benchmark_smoke(flags, expected, smollm2_folder):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "tools/bench_rollout.py", "--smoke", "--model", str(smollm2_folder), *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for want in expected:
        assert want in done.stdout, (want, done.stdout[-3000:])
