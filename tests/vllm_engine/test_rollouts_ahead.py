"""Rollouts sampled ahead of the update (``max_staleness`` 1) on vLLM's CPU build: the rollout
thread drives the learner's own engine, and each batch is sampled with exactly the weights of one
step earlier, full fine-tune and LoRA adapter alike."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from agentcap.agents.adapters import LoraSpec  # noqa: E402
from agentcap.agents.agent import AgentConfig, build_agent, pad_right  # noqa: E402
from agentcap.agents.backends.weights import trainable_weights  # noqa: E402
from agentcap.rollout.pipeline import RolloutPipeline  # noqa: E402
from learner import load_weights  # noqa: E402

PROMPTS = [{"agent": "policy", "messages": [{"role": "user", "content": text}], "media": {}}
           for text in ("Name a colour.", "Say one word about the sea.")]
SAME_POLICY_TOL = 2e-3  # fp32 engine vs fp32 learner (tests/vllm_engine/test_backend.py)


def _agent(folder, **extra):
    config = AgentConfig(model=str(folder), backend="vllm", max_new_tokens=5, temperature=1.0,
                         vllm={"enforce_eager": True, "max_model_len": 256}, **extra)
    return build_agent("policy", config)


def _logprobs(agent, generations) -> list[torch.Tensor]:
    completion, mask = pad_right([g.completion_ids for g in generations], agent.tokenizer.pad_token_id)
    with torch.no_grad():
        rows = agent.completion_logprobs(agent.encode(PROMPTS), completion, mask)
    return [row[: g.completion_ids.numel()] for g, row in zip(generations, rows)]


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_each_batch_is_sampled_with_the_weights_one_step_back(smollm2_folder, kind):
    agent = _agent(smollm2_folder, **({"peft": LoraSpec(r=8, alpha=16)} if kind == "lora" else {}))
    agent.set_trainable(True)
    optimizer = torch.optim.SGD(agent.trainable_parameters(), lr=2.0 if kind == "lora" else 0.02)
    pipeline = RolloutPipeline(1)
    pipeline.begin(0, agent)
    request = lambda step: lambda stand_ins: stand_ins["policy"].generate(  # noqa: E731
        PROMPTS, seeds=[10 * step, 10 * step + 1], old_logprobs=False)
    thetas, batches = [], []
    for step in range(3):
        thetas.append(trainable_weights(agent.model))
        batch, staleness = pipeline.take(step, 2, agent, request)
        assert staleness == min(step, 1)
        batches.append(batch)
        # the update: the NLL of this batch's samples, a step large enough to move every log-prob
        completion, mask = pad_right([g.completion_ids for g in batch], agent.tokenizer.pad_token_id)
        loss = -(agent.completion_logprobs(agent.encode(PROMPTS), completion, mask) * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        agent.sync_weights()
    pipeline.close()
    backend = agent.backend
    assert backend.syncs == 3 and backend.gap < SAME_POLICY_TOL  # one verified install per batch
    if kind == "lora":
        assert backend.adapter.version == 3 and backend.llm.llm_engine.list_loras() == {3}
    final = trainable_weights(agent.model)
    for step, batch in enumerate(batches):
        load_weights(agent, thetas[max(0, step - 1)])
        sampled_with = _logprobs(agent, batch)
        load_weights(agent, thetas[step])
        current = _logprobs(agent, batch)
        for g, want, now in zip(batch, sampled_with, current):
            gap = float((g.sampler_logprobs - want).abs().max())
            moved = float((g.sampler_logprobs - now).abs().max())
            print(f"{kind} step {step}: sampler vs θ_(s-1) {gap:.2e}; vs θ_s {moved:.2e}")
            assert gap < SAME_POLICY_TOL
            if step >= 1:
                assert moved > 50 * SAME_POLICY_TOL  # the engine really held the older weights
    load_weights(agent, final)
    agent.set_trainable(False)
    after = agent.generate(PROMPTS, seeds=[0, 1])  # outside the pipeline: a plain sync to the learner's weights
    assert backend.syncs == 4 and not backend.stale
    for g in after:
        assert float((g.sampler_logprobs - g.old_logprobs).abs().max()) < SAME_POLICY_TOL
