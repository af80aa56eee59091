"""The vLLM backend with a real small model (SmolLM2-135M-Instruct): sampling, the sampler–learner
log-prob gap, and the weight sync after an optimiser step."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from agentcap.agents.agent import AgentConfig, build_agent, pad_right  # noqa: E402

#: fp32 engine and fp32 learner: measured gaps are ~1e-5; kernels differ (vLLM's CPU attention).
SAME_POLICY_TOL = 2e-3


def _obs(text: str) -> dict:
    return {"agent": "policy", "messages": [{"role": "user", "content": text}], "media": {}}


PROMPTS = [_obs("Name a colour."), _obs("Say one word about the sea."), _obs("Count to three.")]


@pytest.fixture(scope="module")
def agent(smollm2_folder):
    config = AgentConfig(model=str(smollm2_folder), backend="vllm", max_new_tokens=6, temperature=1.0,
                         vllm={"enforce_eager": True, "max_model_len": 256})
    return build_agent("policy", config)


def test_samples_carry_sampler_logprobs_close_to_the_learners(agent):
    torch.manual_seed(0)
    gens = agent.generate(PROMPTS + PROMPTS[:1])
    assert len(gens) == 4
    for g in gens:
        assert g.completion_ids.numel() >= 1 and g.sampler_logprobs.shape == g.old_logprobs.shape
        assert torch.all(g.sampler_logprobs <= 0)
    gap = max(float((g.old_logprobs - g.sampler_logprobs).abs().max()) for g in gens)
    print(f"sampler-learner max |Δ log p| = {gap:.2e}")
    assert gap < SAME_POLICY_TOL
    # one seed per request: two rollouts of the same prompt are independent samples
    assert gens[0].completion_ids.tolist() != gens[3].completion_ids.tolist() or gens[0].completion_ids.numel() == 1


def test_weight_sync_after_an_optimiser_step(agent):
    """After an update the engine scores a fixed completion as the learner does, and not as before."""
    torch.manual_seed(1)
    fixed = agent.generate(PROMPTS[:2])
    inputs = agent.encode(PROMPTS[:2])
    prompt_ids = [agent.backend.prompt(o)["prompt_token_ids"] for o in PROMPTS[:2]]
    completions = [g.completion_ids.tolist() for g in fixed]
    before = agent.backend.score(prompt_ids, completions)

    agent.set_trainable(True)
    optimizer = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.5)
    completion, mask = pad_right([g.completion_ids for g in fixed], agent.tokenizer.pad_token_id)
    loss = -(agent.completion_logprobs(inputs, completion, mask) * mask).sum() / mask.sum()
    loss.backward()
    optimizer.step()
    syncs = agent.backend.syncs
    agent.sync_weights()
    assert agent.backend.stale and agent.backend.syncs == syncs  # lazily: at the next use

    after = agent.backend.score(prompt_ids, completions)
    assert agent.backend.syncs == syncs + 1 and not agent.backend.stale
    with torch.no_grad():
        learner = agent.completion_logprobs(inputs, completion, mask)
    for i, (b, a) in enumerate(zip(before, after)):
        n = len(completions[i])
        engine_vs_learner = float((a - learner[i, :n]).abs().max())
        moved = float((a - b).abs().max())
        print(f"row {i}: engine vs learner after sync {engine_vs_learner:.2e}; change from update {moved:.2e}")
        assert engine_vs_learner < SAME_POLICY_TOL
        assert moved > 50 * SAME_POLICY_TOL
    agent.set_trainable(False)


def test_frozen_agent_is_never_synced(agent):
    agent.set_trainable(False)
    syncs = agent.backend.syncs
    agent.sync_weights()
    assert not agent.backend.stale
    agent.backend.score([[1, 2]], [[3]])
    assert agent.backend.syncs == syncs


def _perturb(agent) -> None:
    """A stand-in for an update that moves every log-prob of the probe."""
    torch.manual_seed(2)
    with torch.no_grad():
        for p in agent.model.parameters():
            p.add_(torch.randn_like(p) * 0.02)


def _shifted(model, weights=None):
    """Every decoder layer's weights sent under the next layer's names."""
    import re

    from agentcap.agents.backends.weights import layers

    n = model.config.num_hidden_layers
    for group in layers(model, weights):
        yield [(re.sub(r"\.layers\.(\d+)\.", lambda m: f".layers.{(int(m.group(1)) + 1) % n}.", name), t)
               for name, t in group]


@pytest.mark.parametrize("broken", ["sends nothing", "another layer's weights"])
def test_a_broken_sync_stops_the_run(agent, monkeypatch, broken):
    """The probe catches a sync that delivered nothing, or delivered to the wrong layers; a correct
    sync afterwards passes again."""
    import agentcap.agents.backends.vllm as vllm_backend
    from agentcap.agents.backends.verify import WeightSyncError

    agent.set_trainable(True)
    _perturb(agent)
    agent.sync_weights()
    agent.set_trainable(False)
    monkeypatch.setattr(vllm_backend, "layers", (lambda model, weights=None: iter([])) if broken == "sends nothing" else _shifted)
    with pytest.raises(WeightSyncError) as error:
        agent.generate(PROMPTS[:1])
    print(f"{broken}: {error.value}")
    assert "agents.policy: weight sync" in str(error.value) and "tolerance 0.001" in str(error.value)
    assert agent.backend.stale  # the run stops; a retry would sync again
    monkeypatch.undo()
    agent.backend.sync()
    print(f"after a correct sync: max |Δ log p| {agent.backend.gap:.2e}")
    assert agent.backend.gap < 1e-3
