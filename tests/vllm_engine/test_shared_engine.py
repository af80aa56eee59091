"""Roles that share a base (``share_base_with``) on one vLLM engine (issue 33): the engine holds the
base once and one adapter per role, one LoRA request per role and version; each role's sync is
verified on its own probe; rollouts ahead of the update (K = 1) train one role while the other acts."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from agentcap.agents.adapters import LoraSpec  # noqa: E402
from agentcap.agents.agent import AgentConfig, build_agents, pad_right  # noqa: E402
from agentcap.agents.backends.weights import trainable_weights  # noqa: E402
from agentcap.rollout.pipeline import RolloutPipeline  # noqa: E402
from learner import load_weights  # noqa: E402

SAME_POLICY_TOL = 2e-3  # fp32 engine vs fp32 learner (tests/vllm_engine/test_backend.py)


def _prompts(role: str) -> list[dict]:
    return [{"agent": role, "messages": [{"role": "user", "content": text}], "media": {}}
            for text in ("Name a colour.", "Say one word about the sea.")]


def _logprobs(agent, generations) -> list[torch.Tensor]:
    completion, mask = pad_right([g.completion_ids for g in generations], agent.tokenizer.pad_token_id)
    with torch.no_grad():
        rows = agent.completion_logprobs(agent.encode(_prompts(agent.name)), completion, mask)
    return [row[: g.completion_ids.numel()] for g, row in zip(generations, rows)]


def _step(agent, optimizer, batch) -> None:
    completion, mask = pad_right([g.completion_ids for g in batch], agent.tokenizer.pad_token_id)
    loss = -(agent.completion_logprobs(agent.encode(_prompts(agent.name)), completion, mask) * mask).sum() / mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    agent.sync_weights()


def test_two_roles_on_one_engine_each_verified_and_one_trains_ahead(smollm2_folder):
    options = {"enforce_eager": True, "max_model_len": 256}
    configs = {
        "captioner": AgentConfig(model=str(smollm2_folder), backend="vllm", max_new_tokens=5, vllm=options,
                                 peft=LoraSpec(r=8, alpha=16)),
        "composer": AgentConfig(share_base_with="captioner", backend="vllm", max_new_tokens=5, vllm=options,
                                peft=LoraSpec(r=8, alpha=16)),
    }
    RolloutPipeline.check(1, configs)  # allowed: every role of the base samples through the engine
    agents = build_agents(configs)
    captioner, composer = agents["captioner"], agents["composer"]
    assert captioner.model is composer.model and captioner.backend.shared is composer.backend.shared
    # the composer's adapter moves away from the captioner's, so a request with the wrong adapter shows
    composer.set_trainable(True)
    with torch.no_grad():
        for p in composer.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    composer.set_trainable(False)
    composer.backend.weights_changed()
    first = composer.generate(_prompts("composer"), seeds=[0, 1])  # builds the one engine, syncs the composer
    captioner.generate(_prompts("captioner"), seeds=[0, 1])  # the same engine: the captioner's adapter added
    engine = captioner.backend.llm
    assert composer.backend.llm is engine and captioner.backend.syncs == composer.backend.syncs == 1
    assert engine.llm_engine.list_loras() == {1, 2}  # one LoRA id per role and version
    assert composer.backend.gap < SAME_POLICY_TOL and captioner.backend.gap < SAME_POLICY_TOL
    for g in first:
        assert float((g.sampler_logprobs - g.old_logprobs).abs().max()) < SAME_POLICY_TOL

    # K = 1: the captioner trains, the composer acts frozen through the same engine
    captioner.set_trainable(True)
    optimizer = torch.optim.SGD(captioner.trainable_parameters(), lr=2.0)
    pipeline = RolloutPipeline(1)
    pipeline.begin(0, captioner, acting=[composer])

    def request(step):
        def run(stand_ins):
            mine = stand_ins["captioner"].generate(_prompts("captioner"), seeds=[10 * step, 10 * step + 1],
                                                  old_logprobs=False)
            theirs = composer.generate(_prompts("composer"), seeds=[0, 1], old_logprobs=False)
            return mine, theirs
        return run

    thetas, batches = [], []
    for step in range(3):
        thetas.append(trainable_weights(captioner.model))
        (batch, theirs), staleness = pipeline.take(step, 2, captioner, request)
        assert staleness == min(step, 1)
        batches.append(batch)
        # the frozen role samples with its own adapter, unchanged, whatever the captioner's version
        assert [g.completion_ids.tolist() for g in theirs] == [g.completion_ids.tolist() for g in first]
        for g, want in zip(theirs, first):
            assert float((g.sampler_logprobs - want.sampler_logprobs).abs().max()) < SAME_POLICY_TOL
        _step(captioner, optimizer, batch)
    pipeline.close()
    backend = captioner.backend
    assert backend.syncs == 1 + 3 and backend.gap < SAME_POLICY_TOL  # one verified install per batch
    assert engine.llm_engine.list_loras() == {1, backend.adapter.ids[backend.adapter.version]}
    final = trainable_weights(captioner.model)
    for step, batch in enumerate(batches):
        load_weights(captioner, thetas[max(0, step - 1)])
        sampled_with = _logprobs(captioner, batch)
        load_weights(captioner, thetas[step])
        current = _logprobs(captioner, batch)
        for g, want, now in zip(batch, sampled_with, current):
            gap, moved = float((g.sampler_logprobs - want).abs().max()), float((g.sampler_logprobs - now).abs().max())
            print(f"captioner step {step}: sampler vs θ_(s-1) {gap:.2e}; vs θ_s {moved:.2e}")
            assert gap < SAME_POLICY_TOL
            if step >= 1:
                assert moved > 50 * SAME_POLICY_TOL
    load_weights(captioner, final)
    captioner.set_trainable(False)
    # after the stage: a plain sync of the captioner; the composer's adapter is still its own
    after = captioner.generate(_prompts("captioner"), seeds=[0, 1])
    for g in after:
        assert float((g.sampler_logprobs - g.old_logprobs).abs().max()) < SAME_POLICY_TOL
    assert composer.backend.verify() < SAME_POLICY_TOL
