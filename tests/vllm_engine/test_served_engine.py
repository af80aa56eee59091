"""``backend: served`` against a real ``vllm serve`` (CPU build, SmolLM2-135M) that agentcap starts on
loopback (``vllm.served.start``): adapter versions loaded at run time (``/v1/load_lora_adapter``),
each verified by the server's log-probs of the probe, rollouts tied to the version's adapter name."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")
# Not yet seen passing: its only run here gave up while `vllm serve` was still compiling on a loaded
# 2-core machine (issue 33). Opt-in until it has passed once: AGENTCAP_SERVED_TEST=1.
pytestmark = pytest.mark.skipif(os.environ.get("AGENTCAP_SERVED_TEST") != "1",
                                reason="a real `vllm serve` start (minutes on 2 cores): set AGENTCAP_SERVED_TEST=1")

import torch  # noqa: E402

from agentcap.agents.adapters import LoraSpec  # noqa: E402
from agentcap.agents.agent import AgentConfig, build_agent  # noqa: E402
from agentcap.agents.backends import served as served_module  # noqa: E402
from agentcap.agents.backends.served import ServedBackend  # noqa: E402

OBS = {"agent": "policy", "messages": [{"role": "user", "content": "Describe a sound."}], "media": {}}


def test_served_engine_takes_adapter_versions_at_run_time(smollm2_folder, tmp_path):
    vllm = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True,
            "served": {"start": 1, "model": "smollm2", "folder": str(tmp_path / "sync"), "timeout": 600,
                       "start_timeout": 1800}}  # a shared 2-core machine: the first run gave up at 900 s
    agent = build_agent("policy", AgentConfig(model=str(smollm2_folder), peft=LoraSpec(r=8, alpha=16),
                                              backend="served", vllm=vllm, max_new_tokens=4))
    backend = agent.backend
    assert isinstance(backend, ServedBackend)
    try:
        for version in (1, 2):
            with torch.no_grad():  # an "update" of the adapter that moves every log-prob
                for name, p in agent.model.named_parameters():
                    if "lora_B" in name:
                        p.add_(torch.randn_like(p) * 0.02)
            agent.backend.weights_changed()
            out = backend.sample([OBS, OBS], {}, greedy=False, seeds=[3, 4])
            assert backend.version == version
            print(f"sync {version}: probe max |dlogp| = {backend.gap:.3g} (tolerance {backend.tolerance:g})")
            assert backend.gap <= backend.tolerance
            assert all(0 < g.completion_ids.numel() <= 4 for g in out)
            assert all(torch.isfinite(g.sampler_logprobs).all() for g in out)
        models = [c["id"] for c in backend._models(backend.servers[0])]
        assert f"{served_module.TRAINER}.policy.v2" in models and f"{served_module.TRAINER}.policy.v1" not in models
    finally:
        backend.close()
