"""Old log-probs only when off-policy: agentcap's own update (lazy old log-probs) gives the losses and
gradients of a hand-written loop on the sampler's, and takes no extra forward on-policy."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from agentcap.agents import AgentConfig, build_agent
from agentcap.agents.agent import pad_right
from agentcap.algorithms.grpo import clipped_objective, token_weights
from agentcap.parallel.distributed import global_minibatches
from agentcap.training.harness import UpdateHarness
from agentcap.training.old_policy import fill_old_logprobs
from agentcap.training.update import UpdateSettings


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
                            sampler_logprobs=g.sampler_logprobs, advantage=a) for o, g, a in zip(obs, gens, (1.0, -1.0, 0.5, -0.5))]


def reference_updates(agent, spans, epochs: list[list[list[int]]]):
    """The hand-written loop, eager old log-probs (the sampler's): per minibatch the token-mean
    clipped loss, backward, an SGD step; returns each minibatch's loss and gradient."""
    optimizer = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.5)
    losses, grads = [], []
    for chunks in epochs:
        for chunk in chunks:
            rows = [spans[i] for i in chunk]
            completion, mask = pad_right([r.completion_ids for r in rows], agent.tokenizer.pad_token_id)
            logprobs = agent.completion_logprobs(agent.encode([r.observation for r in rows]), completion, mask)
            old = pad_right([r.old_logprobs for r in rows], 0)[0]
            out = clipped_objective(logprobs, old, torch.tensor([r.advantage for r in rows]), mask,
                                    weights=token_weights(mask))
            out["loss"].backward()
            losses.append(float(out["loss"].detach()))
            grads.append(torch.cat([p.grad.flatten() for p in agent.parameters() if p.grad is not None]).clone())
            optimizer.step()
            optimizer.zero_grad()
    return losses, grads


def agentcap_updates(agent, spans, settings: UpdateSettings):
    """agentcap's own update (GRPOModule.update's, through training.harness), lazy old log-probs,
    with the same SGD and clipping out of reach; returns its mean loss and each step's gradient."""
    optimizer = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.5)
    grads = []
    optimizer.register_step_pre_hook(lambda *_: grads.append(
        torch.cat([p.grad.flatten() for p in agent.parameters() if p.grad is not None]).clone()))
    stats = UpdateHarness(agent, settings, optimizer=optimizer).update(spans)
    return stats["loss"], grads


@pytest.mark.parametrize("minibatch_size, ppo_epochs", [
    (4, 1),  # on-policy: one epoch, one minibatch
    (2, 2),  # off-policy: two minibatches, two epochs
])
def test_lazy_old_logprobs_give_the_same_losses_and_gradients(policy, minibatch_size, ppo_epochs):
    settings = UpdateSettings(minibatch_size=minibatch_size, ppo_epochs=ppo_epochs, max_grad_norm=1e9)
    keys = [(i, 0) for i in range(4)]  # the harness's default: span i is trajectory i
    epochs = [global_minibatches(keys, minibatch_size, seed=(settings.seed, 0, epoch)) for epoch in range(ppo_epochs)]
    eager = copy.deepcopy(policy)
    want_losses, want_grads = reference_updates(eager, rollout(eager, old_logprobs=True), epochs)
    spans = rollout(policy, old_logprobs=False)
    assert all(s.old_logprobs is None for s in spans)
    loss, grads = agentcap_updates(policy, spans, settings)
    assert loss == pytest.approx(sum(want_losses) / len(want_losses), abs=1e-6)
    assert len(grads) == len(want_grads) == sum(len(chunks) for chunks in epochs)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_on_policy_update_scores_no_extra_forward(policy):
    calls = []
    logits = policy.family.logits
    policy.family.logits = lambda *a, **k: calls.append(1) or logits(*a, **k)
    spans = rollout(policy, old_logprobs=False)
    assert not calls  # sampling alone: no scoring pass
    assert fill_old_logprobs(policy, spans, skip={0, 1, 2, 3}, batch_size=4) == 0
    agentcap_updates(policy, spans, UpdateSettings(minibatch_size=4))
    assert len(calls) == 1  # the update's own forward, nothing else
    assert all(s.old_logprobs is not None for s in spans)  # kept for any later epoch
    # two minibatches: only the second one's spans get the no-grad pass
    fresh = rollout(policy, old_logprobs=False)
    assert fill_old_logprobs(policy, fresh, skip={0, 1}, batch_size=4) == 2
