"""Adapter-only syncs on vLLM's CPU build (SmolLM2-135M-Instruct with a LoRA adapter), their
verification, and sleep mode where the build has it."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")
pytest.importorskip("peft")

import torch  # noqa: E402

from agentcap.agents.adapters import LoraSpec  # noqa: E402
from agentcap.agents.agent import AgentConfig, build_agent, pad_right  # noqa: E402
from agentcap.agents.backends.verify import WeightSyncError  # noqa: E402

PROMPTS = [{"agent": "policy", "messages": [{"role": "user", "content": text}], "media": {}}
           for text in ("Name a colour.", "Say one word about the sea.")]


@pytest.fixture(scope="module")
def lora_agent(smollm2_folder):
    config = AgentConfig(model=str(smollm2_folder), backend="vllm", max_new_tokens=6, temperature=1.0,
                         peft=LoraSpec(r=8, alpha=16), vllm={"enforce_eager": True, "max_model_len": 256})
    return build_agent("policy", config)


def _update(agent, completions, lr: float) -> None:
    """One SGD step of the adapter on the NLL of ``completions``, then the agent's sync_weights."""
    agent.set_trainable(True)
    inputs = agent.encode(PROMPTS)
    completion, mask = pad_right([torch.tensor(c) for c in completions], agent.tokenizer.pad_token_id)
    optimizer = torch.optim.SGD(agent.trainable_parameters(), lr=lr)
    loss = -(agent.completion_logprobs(inputs, completion, mask) * mask).sum() / mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    agent.sync_weights()
    agent.set_trainable(False)


def test_the_engine_receives_only_the_adapter_and_follows_the_learner(lora_agent):
    agent, backend = lora_agent, lora_agent.backend
    assert backend.stale  # an adapter engine starts without its adapter
    torch.manual_seed(0)
    sampled = agent.generate(PROMPTS)
    assert backend.syncs == 1 and backend.adapter.version == 1 and backend.gap < backend.tolerance
    prompts = [backend.prompt(o)["prompt_token_ids"] for o in PROMPTS]
    completions = [g.completion_ids.tolist() for g in sampled]
    before = backend.score(prompts, completions)

    _update(agent, completions, lr=2.0)
    assert backend.stale and backend.syncs == 1
    after = backend.score(prompts, completions)
    assert backend.syncs == 2 and backend.adapter.version == 2
    print(f"adapter sync: probe max |Δ log p| {backend.gap:.2e} (tolerance {backend.tolerance:g})")
    inputs = agent.encode(PROMPTS)
    completion, mask = pad_right([torch.tensor(c) for c in completions], agent.tokenizer.pad_token_id)
    with torch.no_grad():
        learner = agent.completion_logprobs(inputs, completion, mask)
    for i, (b, a) in enumerate(zip(before, after)):
        n = len(completions[i])
        gap, moved = float((a - learner[i, :n]).abs().max()), float((a - b).abs().max())
        print(f"row {i}: engine vs learner {gap:.2e}; change from the update {moved:.2e}")
        assert gap < 1e-3 and moved > 0.05
    # what travelled: the adapter, one version on disk and in the engine
    folder = backend.adapter.folder(2)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    base = sum(p.numel() * p.element_size() for p in agent.adapters.base_parameters())
    print(f"adapter version: {size / 2**20:.2f} MiB on disk; the base: {base / 2**20:.1f} MiB ({size / base:.4f})")
    assert sorted(os.listdir(backend.adapter.root)) == ["v2"]
    assert sorted(os.listdir(folder)) == ["adapter_config.json", "adapter_model.safetensors"]
    assert backend.llm.llm_engine.list_loras() == {2}


def test_an_adapter_sync_that_delivers_nothing_stops_the_run(lora_agent, monkeypatch):
    """A version whose update is lost on the way (its lora_B written as zeros: the engine answers as
    the base) is caught by the probe; a correct sync afterwards passes."""
    from safetensors.torch import load_file, save_file

    from agentcap.agents.backends.adapter_sync import AdapterVersions

    agent, backend = lora_agent, lora_agent.backend
    torch.manual_seed(1)
    completions = [g.completion_ids.tolist() for g in agent.generate(PROMPTS)]
    _update(agent, completions, lr=2.0)
    save = AdapterVersions.save

    def save_nothing(self, tensors=None):
        sent = save(self, tensors)
        path = os.path.join(self.folder(self.version), "adapter_model.safetensors")
        tensors = load_file(path)
        save_file({k: torch.zeros_like(v) if "lora_B" in k else v for k, v in tensors.items()}, path)
        return sent

    monkeypatch.setattr(AdapterVersions, "save", save_nothing)
    expected = r"agents\.policy: weight sync \d+ did not reach the vLLM engine"
    with pytest.raises(WeightSyncError, match=expected) as error:
        agent.generate(PROMPTS)
    print(error.value)
    monkeypatch.undo()
    backend.sync()
    assert backend.gap < backend.tolerance


def test_sleep_mode_on_this_build(smollm2_folder):
    """Sleep levels on a real engine: level 2, a re-sync, the probe. vLLM's CPU build (0.32) refuses
    ``enable_sleep_mode`` before loading anything; the test then says so and skips."""
    from vllm import LLM

    try:
        del_me = LLM(model=str(smollm2_folder), enable_sleep_mode=True, dtype="float32", enforce_eager=True,
                     max_model_len=128)
    except ValueError as error:
        if "Sleep mode is not supported" in str(error):
            pytest.skip(f"vLLM's CPU build refuses sleep mode: {error}")
        raise
    del del_me
    config = AgentConfig(model=str(smollm2_folder), backend="vllm", max_new_tokens=4,
                         vllm={"enforce_eager": True, "max_model_len": 256, "enable_sleep_mode": True})
    agent = build_agent("policy", config)
    agent.generate(PROMPTS)
    assert agent.backend.sleep(2) == 2 and agent.backend.stale
    agent.generate(PROMPTS)  # wakes, re-syncs the discarded weights, verifies them
    assert agent.backend.level == 0 and agent.backend.gap < agent.backend.tolerance
