"""Old log-probs only when off-policy: same losses and gradients, no extra forward on-policy."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from agentcap.agents import AgentConfig, build_agent
from agentcap.agents.agent import pad_right
from agentcap.algorithms.grpo import clipped_objective, token_weights
from agentcap.training.old_policy import fill_old_logprobs, old_or_current


@pytest.fixture
def policy(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("Anna opens the red door .\nTom picks up the key .\n")
    torch.manual_seed(0)
    tiny = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64}
    agent = build_agent("policy", AgentConfig(tiny=tiny, build_tokenizer_from=[str(texts)], max_new_tokens=5))
    agent.set_trainable(True)
    return agent


def rollout(agent, old_logprobs: bool):
    obs = [{"agent": "policy", "messages": [{"role": "user", "content": "Anna opens the" + " door" * (i % 3)}]}
           for i in range(4)]
    torch.manual_seed(3)
    gens = agent.generate(obs, old_logprobs=old_logprobs)
    return [SimpleNamespace(observation=o, completion_ids=g.completion_ids, old_logprobs=g.old_logprobs,
                            advantage=a) for o, g, a in zip(obs, gens, (1.0, -1.0, 0.5, -0.5))]


def updates(agent, spans, epochs: list[list[list[int]]], lazy: bool):
    """GRPOModule.update's loop: per minibatch loss, then an optimiser step."""
    optimizer = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.5)
    if lazy:
        fill_old_logprobs(agent, spans, set(epochs[0][0]), batch_size=2)
    losses, grads = [], []
    for chunks in epochs:
        for chunk in chunks:
            rows = [spans[i] for i in chunk]
            completion, mask = pad_right([r.completion_ids for r in rows], agent.tokenizer.pad_token_id)
            logprobs = agent.completion_logprobs(agent.encode([r.observation for r in rows]), completion, mask)
            old = old_or_current(rows, logprobs) if lazy else pad_right([r.old_logprobs for r in rows], 0)[0]
            out = clipped_objective(logprobs, old, torch.tensor([r.advantage for r in rows]), mask,
                                    weights=token_weights(mask))
            out["loss"].backward()
            losses.append(float(out["loss"].detach()))
            grads.append(torch.cat([p.grad.flatten() for p in agent.parameters() if p.grad is not None]).clone())
            optimizer.step()
            optimizer.zero_grad()
    return losses, grads


@pytest.mark.parametrize("epochs", [
    [[[0, 1, 2, 3]]],  # on-policy: one epoch, one minibatch
    [[[2, 0], [1, 3]], [[3, 1], [0, 2]]],  # off-policy: two minibatches, two epochs
])
def test_lazy_old_logprobs_give_the_same_losses_and_gradients(policy, epochs):
    eager = copy.deepcopy(policy)
    want_losses, want_grads = updates(eager, rollout(eager, old_logprobs=True), epochs, lazy=False)
    spans = rollout(policy, old_logprobs=False)
    assert all(s.old_logprobs is None for s in spans)
    losses, grads = updates(policy, spans, epochs, lazy=True)
    assert losses == pytest.approx(want_losses, abs=1e-6)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_on_policy_update_scores_no_extra_forward(policy):
    calls = []
    logits = policy.family.logits
    policy.family.logits = lambda *a, **k: calls.append(1) or logits(*a, **k)
    spans = rollout(policy, old_logprobs=False)
    assert not calls  # sampling alone: no scoring pass
    assert fill_old_logprobs(policy, spans, skip={0, 1, 2, 3}, batch_size=4) == 0
    updates(policy, spans, [[[0, 1, 2, 3]]], lazy=True)
    assert len(calls) == 1  # the update's own forward, nothing else
    assert all(s.old_logprobs is not None for s in spans)  # kept for any later epoch
    # two minibatches: only the second one's spans get the no-grad pass
    fresh = rollout(policy, old_logprobs=False)
    assert fill_old_logprobs(policy, fresh, skip={0, 1}, batch_size=4) == 2
