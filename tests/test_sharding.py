"""Sharding through Lightning (grpo_fsdp, bf16-mixed): a killed run resumes exactly, and a 2-node launch works.

Both runs are 2 processes on CPU / gloo: one launched by Lightning on one node and killed inside the
GRPO stage, then resumed; the other two ``torchrun --nnodes 2`` processes on loopback (one per
node). They must end with the same weights and the same summary: the resumed run continued exactly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentcap.parallel.sharding import block_classes
from agentcap.resume.checkpoints import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
STAGES = [
    {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
    {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 4},
    {"name": "after", "kind": "evaluate", "split": "test", "greedy": False},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state(run: Path) -> dict:
    return read_checkpoint(str(run / "checkpoints" / "last.ckpt"))  # a folder of shards under grpo_fsdp


def test_the_toy_lm_shards_per_decoder_layer():
    from agentcap.agents.toy import ToyConfig, ToyMediaLM

    assert block_classes(ToyMediaLM(ToyConfig(vocab_size=10))) == {"LlamaDecoderLayer"}


@pytest.mark.slow  # `agentcap fit` / torchrun: 2-process runs
def test_killed_sharded_run_resumes_exactly_and_two_nodes_run(tmp_path, toy_movie, make_read_config):
    fit = [sys.executable, "-m", "agentcap.cli", "fit"]
    # 1) two nodes of one process each, on loopback: the uninterrupted reference
    nodes = make_read_config(tmp_path / "nodes", toy_movie, STAGES)
    port = free_port()
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
              "--master-addr", "127.0.0.1", "--master-port", str(port)]
    args = ["-m", "agentcap.cli", "fit", "--config", str(nodes), "--trainer.num_nodes=2",
            "--trainer.devices=1", "--trainer.strategy=grpo_fsdp", "--trainer.precision=bf16-mixed"]
    procs = [subprocess.Popen([*launch, "--node-rank", str(r), *args], cwd=ROOT, env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "sharded policy with FSDP2 over 2 processes (bf16 compute, fp32 masters)" in outs[0]

    # 2) one node, two processes, killed inside the GRPO stage, then resumed
    run = tmp_path / "killed"
    config = make_read_config(run, toy_movie, STAGES)
    cmd = [*fit, "--config", str(config), "--trainer.devices=2", "--trainer.strategy=fsdp", "--checkpoint_every=1",
           "--trainer.precision=bf16-mixed"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    ckpt, saved, deadline = run / "checkpoints" / "last.ckpt", None, time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists():
            try:
                saved = read_checkpoint(str(ckpt))["agentcap"]["tick"]
            except Exception:  # being replaced right now
                saved = None
            if saved is not None and 2 < saved < 6:
                break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert saved is not None and 2 < saved < 6, f"no checkpoint inside the GRPO stage before the kill (tick {saved})"
    resumed = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr

    a, b = state(tmp_path / "nodes"), state(run)
    assert a["agentcap"]["tick"] == b["agentcap"]["tick"] == 7
    for key in a["state_dict"]:
        torch.testing.assert_close(a["state_dict"][key], b["state_dict"][key], atol=1e-6, rtol=1e-5, msg=key)
    # bf16-mixed: FSDP2 computes in bf16 (agentcap.parallel.sharding.mixed_precision), the masters stay fp32
    assert {v.dtype for k, v in a["state_dict"].items() if v.is_floating_point()} == {torch.float32}
    s1, s2 = (json.loads((r / "summary.json").read_text())["after"] for r in (tmp_path / "nodes", run))
    assert s1 == s2 or max(abs(s1[k] - s2[k]) for k in s1) < 1e-6, (s1, s2)
