"""LoRA adapters: only adapters train, a shared base is one module, each role acts with its own
adapter, the KL reference is the base, and checkpoints hold adapters only."""

from __future__ import annotations

import pytest
import torch

from agentcap.agents.adapters import LoraSpec
from agentcap.agents.agent import AgentConfig, build_agent, build_agents, pad_right
from agentcap.agents.reference import AdaptersAtStageStart, AdaptersDisabled, kl_reference
from agentcap.training.harness import UpdateHarness, rows

LORA = LoraSpec(r=4, alpha=8)


def observations(n: int, role: str = "captioner"):
    return [{"agent": role, "messages": [{"role": "user", "content": "the cat sat on the" + " mat" * (i % 3)}]}
            for i in range(n)]


def shared_pair(seed: int = 0):
    return build_agents({
        "captioner": AgentConfig(tiny={"kind": "qwen2", "seed": seed}, peft=LORA, max_new_tokens=5),
        "instruct": AgentConfig(share_base_with="captioner", peft=LORA, max_new_tokens=5),
    })


def train(agent, steps: int = 3, lr: float = 1e-2):
    """A few of agentcap's own GRPO updates (GRPOModule.update's, through training.harness) on the
    agent's own samples; returns the stage's optimiser."""
    obs = observations(4, agent.name)
    torch.manual_seed(0)
    batch = rows(obs, agent.generate(obs))
    for row, advantage in zip(batch, (1.0, -1.0, 0.5, -0.5)):
        row.advantage = advantage
    harness = UpdateHarness(agent, lr=lr)
    for _ in range(steps):
        harness.update(batch)
    return harness.optimizer


def scores(agent, obs):
    gens = [g.completion_ids for g in agent.generate(obs, greedy=True)]
    completion, mask = pad_right(gens, agent.tokenizer.pad_token_id)
    with torch.no_grad():
        return agent.completion_logprobs(agent.encode(obs), completion, mask)


def test_only_adapters_train_base_bitwise_unchanged_every_adapter_weight_moved():
    agent = build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, peft=LORA, max_new_tokens=5))
    agent.set_trainable(True)
    named = dict(agent.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all(".lora_A.policy." in n or ".lora_B.policy." in n for n in trainable)
    assert sum(named[n].numel() for n in trainable) < 0.5 * sum(p.numel() for p in named.values())
    before = {n: p.detach().clone() for n, p in named.items()}
    optimizer = train(agent)
    # optimiser state exists for adapter tensors only
    assert {id(p) for p in optimizer.state} == {id(named[n]) for n in trainable}
    for n, p in named.items():
        if n in trainable:
            assert not torch.equal(p, before[n]), f"adapter weight did not move: {n}"
        else:
            assert torch.equal(p, before[n]) and p.grad is None, f"base weight changed: {n}"


def test_shared_base_is_one_module_and_each_role_acts_with_its_own_adapter():
    agents = shared_pair()
    captioner, instruct = agents["captioner"], agents["instruct"]
    assert captioner.model is instruct.model
    module = torch.nn.ModuleDict(agents)
    base = [p for n, p in captioner.model.named_parameters() if "lora_" not in n]
    assert len({p.data_ptr() for p in module.parameters()} & {p.data_ptr() for p in base}) == len(base)
    assert sum(1 for _ in module.parameters()) == sum(1 for _ in captioner.model.parameters())  # base listed once

    obs = observations(3)
    instruct_before = scores(instruct, obs)
    captioner.set_trainable(True)
    assert {id(p) for p in captioner.trainable_parameters()} == {id(p) for p in captioner.adapters.own_parameters()}
    assert instruct.trainable_parameters() == []
    train(captioner)
    captioner_after = scores(captioner, obs)
    # the frozen role still acts with its own (untouched) adapter on the shared base …
    torch.testing.assert_close(scores(instruct, obs), instruct_before, rtol=0, atol=0)
    # … and switching back gives the trained adapter; the frozen role's adapter never got a grad
    torch.testing.assert_close(scores(captioner, obs), captioner_after, rtol=0, atol=0)
    assert not torch.allclose(captioner_after, instruct_before)
    assert all(p.grad is None and not p.requires_grad for p in instruct.adapters.own_parameters())

    # the alternation: the other role trains next, the first keeps its adapter
    captioner.set_trainable(False)
    instruct.set_trainable(True)
    assert captioner.trainable_parameters() == [] and instruct.trainable_parameters()
    train(instruct)
    torch.testing.assert_close(scores(captioner, obs), captioner_after, rtol=0, atol=0)


def test_kl_reference_is_the_base_with_adapters_disabled_not_a_copy():
    agent = build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, peft=LORA, max_new_tokens=5))
    plain = build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, max_new_tokens=5))  # same seed, no adapter
    agent.set_trainable(True)
    train(agent)
    reference = kl_reference(agent)
    assert isinstance(reference, AdaptersDisabled) and reference.model is None  # nothing copied
    obs = observations(3, "policy")
    gens = [g.completion_ids for g in agent.generate(obs)]
    completion, mask = pad_right(gens, agent.tokenizer.pad_token_id)
    inputs = agent.encode(obs)
    flags = [p.requires_grad for p in agent.model.parameters()]
    ref = reference.completion_logprobs(agent, inputs, completion, mask)
    assert [p.requires_grad for p in agent.model.parameters()] == flags  # peft's toggling undone
    with torch.no_grad():
        torch.testing.assert_close(ref, plain.completion_logprobs(inputs, completion, mask))
        assert not torch.allclose(ref, agent.completion_logprobs(inputs, completion, mask))  # adapters back on


def test_stage_start_reference_is_the_adapter_as_the_stage_began_and_leaves_the_policy_as_it_is():
    """kl_reference: stage_start, for a GRPO stage after the role's own warm-up: π_ref is the warmed-up
    adapter, not the base; its pass swaps the adapter in and out without touching the policy or its
    gradients, and its state loads into another agent's reference."""
    from agentcap.training.update import UpdateSettings

    agent = build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, peft=LORA, max_new_tokens=5))
    agent.set_trainable(True)
    train(agent)  # the warm-up
    obs = observations(3, "policy")
    gens = [g.completion_ids for g in agent.generate(obs)]
    completion, mask = pad_right(gens, agent.tokenizer.pad_token_id)
    inputs = agent.encode(obs)
    with torch.no_grad():
        at_start = agent.completion_logprobs(inputs, completion, mask)
    reference = kl_reference(agent, mode="stage_start")
    assert isinstance(reference, AdaptersAtStageStart)
    assert reference.weights and all(".lora_" in k for k in reference.weights)

    # the stage's first update: policy = reference, so the KL is 0 and the backward still works
    harness = UpdateHarness(agent, UpdateSettings(beta=0.1), lr=1e-2, reference=reference)
    batch = rows(obs, agent.generate(obs))
    for row, advantage in zip(batch, (1.0, -1.0, 0.5)):
        row.advantage = advantage
    assert abs(harness.update(batch)["kl"]) < 1e-6
    for _ in range(2):
        harness.update(batch)
    live = {k: v.clone() for k, v in agent.model.state_dict().items()}
    ref = reference.completion_logprobs(agent, inputs, completion, mask)
    torch.testing.assert_close(ref, at_start, rtol=0, atol=0)
    assert all(torch.equal(v, live[k]) for k, v in agent.model.state_dict().items())  # swapped back
    with torch.no_grad():
        assert not torch.allclose(ref, agent.completion_logprobs(inputs, completion, mask))  # the policy moved
        with agent.adapters.disabled():
            assert not torch.allclose(ref, agent.completion_logprobs(inputs, completion, mask))  # not the base

    other = build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, peft=LORA, max_new_tokens=5))
    other.set_trainable(True)
    restored = kl_reference(other, mode="stage_start")
    restored.load_state(reference.state())
    torch.testing.assert_close(restored.completion_logprobs(other, inputs, completion, mask), at_start, rtol=0, atol=0)
    with pytest.raises(ValueError, match="other tensors"):
        restored.load_state({"lora_A.weight": torch.zeros(1)})


def test_checkpoint_holds_adapters_only_and_loads_back_strictly():
    agents = torch.nn.ModuleDict(shared_pair())
    agents["captioner"].set_trainable(True)
    train(agents["captioner"])
    state = agents.state_dict()
    assert all(".lora_" in k or k.endswith("adapter_base_fingerprint") for k in state), "base tensors in the checkpoint"
    assert any(k.startswith("captioner.") and ".lora_A.captioner." in k for k in state)
    assert any(k.startswith("instruct.") and ".lora_A.instruct." in k for k in state)
    assert not any(k.startswith("instruct.") and ".lora_A.captioner." in k for k in state)  # each adapter once

    fresh = torch.nn.ModuleDict(shared_pair())
    fresh.load_state_dict(state)  # strict: the base keys are filled with the live base
    for (k, v), (k2, v2) in zip(agents["captioner"].model.state_dict().items(), fresh["captioner"].model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k

    other = torch.nn.ModuleDict(shared_pair(seed=1))  # another base: the adapters do not belong to it
    with pytest.raises(ValueError, match="another base model"):
        other.load_state_dict(state)


def test_adapter_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"agents\.policy\.peft\.dropout"):
        build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, peft=LoraSpec(dropout=0.1)))
    with pytest.raises(ValueError, match=r"agents\.instruct\.share_base_with: 'nobody'"):
        build_agents({"captioner": AgentConfig(tiny={"kind": "qwen2"}, peft=LORA),
                      "instruct": AgentConfig(share_base_with="nobody", peft=LORA)})
    with pytest.raises(ValueError, match="need a `peft` adapter"):
        build_agents({"captioner": AgentConfig(tiny={"kind": "qwen2"}),
                      "instruct": AgentConfig(share_base_with="captioner", peft=LORA)})


def test_modules_to_save_train_in_full_per_role_and_the_reference_runs_the_original():
    """peft.modules_to_save (an audio LM's new projector): trained beside the adapter, one copy per
    role on a shared base, left out by the KL reference (adapters disabled), kept in checkpoints."""
    spec = LoraSpec(r=4, alpha=8, modules_to_save=["lm_head"])
    build = lambda: build_agents({  # noqa: E731
        "captioner": AgentConfig(tiny={"kind": "qwen2", "text": {"tie_word_embeddings": False}}, peft=spec, max_new_tokens=5),
        "instruct": AgentConfig(share_base_with="captioner", peft=spec, max_new_tokens=5),
    })
    agents = build()
    captioner = agents["captioner"]
    captioner.set_trainable(True)
    named = dict(captioner.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert any("lm_head.modules_to_save.captioner." in n for n in trainable)
    assert all(".captioner." in n for n in trainable)  # not instruct's copy, not the original head
    before = {n: p.detach().clone() for n, p in named.items()}
    train(captioner)
    head = [n for n in trainable if "modules_to_save" in n]
    assert all(not torch.equal(named[n], before[n]) for n in head)
    for n, p in named.items():
        if n not in trainable:
            assert torch.equal(p, before[n]), f"changed outside the captioner's adapter: {n}"
    state = torch.nn.ModuleDict(agents).state_dict()
    assert any(k.startswith("captioner.") and "lm_head.modules_to_save.captioner." in k for k in state)
    assert not any("original_module" in k for k in state)  # the base head stays out
    fresh = torch.nn.ModuleDict(build())
    fresh.load_state_dict(state)
    obs = observations(3)
    torch.testing.assert_close(scores(fresh["captioner"], obs), scores(captioner, obs))
