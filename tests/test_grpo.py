"""GRPO core: advantages (READ Eq. 1, through the one function training calls), the clipped objective
with KL, masks, and which weights an update moves."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentcap.agents import AgentConfig, build_agent
from agentcap.agents.agent import pad_right, trim_after_eos
from agentcap.algorithms.grpo import clipped_objective, kl_k3, token_weights
from agentcap.algorithms.loop import normalize_by_type
from agentcap.training.harness import UpdateHarness, rows


def test_group_advantages_match_hand_computation():
    """READ Eq. 1 is the one-kind case of the advantages training computes (LOOP Eq. 17)."""
    rewards = [1.0, 2.0, 3.0, 5.0, 5.0, 5.0]
    adv = normalize_by_type(rewards, ["completion"] * 6, [0, 0, 0, 1, 1, 1], eps=0.0)
    std = math.sqrt(2.0 / 3.0)  # population std of 1, 2, 3
    assert adv[:3].tolist() == pytest.approx([-1 / std, 0.0, 1 / std])
    assert adv[3:].tolist() == [0.0, 0.0, 0.0]  # all-equal group: zero, never NaN
    assert not torch.isnan(adv).any()


def test_clipped_objective_matches_hand_computation():
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    old = torch.log(torch.tensor([[0.25, 0.4]]))  # ratios 2.0 and 0.5
    mask = torch.ones(1, 2)
    out = clipped_objective(logp, old, torch.tensor([1.0]), mask, clip_eps=0.2)
    # A > 0: min(2.0, 1.2) = 1.2 and min(0.5, 0.8) = 0.5; token mean → loss −0.85
    assert out["loss"].item() == pytest.approx(-0.85)
    assert out["clipfrac"].item() == pytest.approx(0.5)
    neg = clipped_objective(logp, old, torch.tensor([-1.0]), mask, clip_eps=0.2)
    # A < 0: min(−2.0, −1.2) = −2.0 and min(−0.5, −0.8) = −0.8 → loss +1.4
    assert neg["loss"].item() == pytest.approx(1.4)


def test_kl_k3_and_beta():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    r = ref - logp
    expected = (torch.exp(r) - r - 1).mean()
    assert kl_k3(logp, ref).mean().item() == pytest.approx(expected.item())
    out = clipped_objective(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 2), beta=0.1, ref_logprobs=ref)
    assert out["loss"].item() == pytest.approx(0.1 * expected.item())
    # masked before exp(): padding with -inf log-probs gives exactly 0, and the objective's KL is kl_k3's
    padded, ref_padded = torch.tensor([[-1.0, -2.0, float("-inf")]]), torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    k3 = kl_k3(padded, ref_padded, mask)
    assert k3[0, 2].item() == 0.0 and k3[0, :2].tolist() == kl_k3(logp, ref)[0].tolist()
    out = clipped_objective(padded, padded, torch.tensor([0.0]), mask, beta=0.1, ref_logprobs=ref_padded)
    assert out["kl"].item() == (k3 * token_weights(mask)).sum().item()
    with pytest.raises(ValueError, match="ref_logprobs"):
        clipped_objective(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), beta=0.1)


def test_masked_tokens_get_no_gradient():
    logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    out = clipped_objective(logp, logp.detach(), torch.tensor([1.0]), mask)
    out["loss"].backward()
    assert logp.grad[0, 2] == 0 and logp.grad[0, 0] != 0


def test_global_token_normaliser_splits_exactly():
    """Loss of a batch = sum of its shards' losses under the global normaliser (data parallel)."""
    torch.manual_seed(0)
    logp, old = torch.randn(4, 5), torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).long()
    adv = torch.randn(4)
    full = clipped_objective(logp, old, adv, mask, weights=token_weights(mask))["loss"]
    total = float(mask.sum())
    parts = sum(
        clipped_objective(logp[s], old[s], adv[s], mask[s], weights=token_weights(mask[s], normalizer=total))["loss"]
        for s in (slice(0, 1), slice(1, 4))
    )
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)
    seq = token_weights(mask, mode="sequence")
    assert seq.sum().item() == pytest.approx(float((mask.sum(1) > 0).sum()) / 4)


def test_trim_after_eos_keeps_first_eos():
    ids, mask = trim_after_eos(torch.tensor([[5, 9, 7, 9, 3], [4, 4, 4, 4, 4]]), eos_ids=[9], pad_id=0)
    assert ids.tolist() == [[5, 9, 0, 0, 0], [4, 4, 4, 4, 4]]
    assert mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


@pytest.fixture
def two_agents(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("Anna opens the red door .\nTom picks up the key .\n")
    cfg = dict(toy={"media": "features", "feature_dim": 8, "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                    "intermediate_size": 64}, build_tokenizer_from=[str(texts)], max_new_tokens=6)
    torch.manual_seed(0)
    return build_agent("policy", AgentConfig(**cfg)), build_agent("other", AgentConfig(**cfg))


def observations(n: int):
    rng = np.random.default_rng(0)
    return [
        {"agent": "policy", "messages": [{"role": "user", "content": "Anna opens the" + " door" * (i % 3)}],
         "media": {"features": rng.standard_normal((3, 8)).astype(np.float32)}}
        for i in range(n)
    ]


def test_update_moves_every_trainable_weight_and_no_frozen_one(two_agents):
    policy, other = two_agents
    policy.set_trainable(True)
    other.set_trainable(False)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    frozen = {k: v.clone() for k, v in other.state_dict().items()}
    obs = observations(4)
    batch = rows(obs, policy.generate(obs))
    for row, advantage in zip(batch, (1.0, -1.0, 0.5, -0.5)):
        row.advantage = advantage
    harness = UpdateHarness(policy, lr=1e-2)  # the update agentcap fit runs (GRPOModule.update's), no Trainer
    for _ in range(2):
        assert harness.update(batch)["grad_norm"] > 0
    after = policy.state_dict()
    unchanged = [k for k, v in before.items() if v.is_floating_point() and torch.equal(v, after[k])]
    assert not unchanged, f"trainable weights that did not move: {unchanged}"
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in frozen.items())
    assert all(p.grad is None and not p.requires_grad for p in other.parameters())


def test_old_logprobs_equal_the_training_forward(two_agents):
    """Sampling and learning see the same numbers, also when prompts of different lengths are padded."""
    policy, _ = two_agents
    obs = observations(3)
    gens = policy.generate(obs, greedy=True)
    for single, gen in zip(obs, gens):
        alone = policy.generate([single], greedy=True)[0]
        assert alone.text == gen.text
        torch.testing.assert_close(alone.old_logprobs, gen.old_logprobs, atol=1e-5, rtol=1e-4)


def test_toy_audio_encoder_is_batch_invariant():
    """A clip's prefix must not depend on the other clips of its batch, or PPO ratios drift from 1."""
    from agentcap.agents.toy import ToyConfig, ToyMediaLM

    torch.manual_seed(0)
    model = ToyMediaLM(ToyConfig(vocab_size=20, media="audio", hidden_size=16, num_heads=2))
    rng = np.random.default_rng(0)
    clips = [{"waveform": rng.standard_normal(16000 * s).astype(np.float32)} for s in (3, 5, 1)]
    together = model.encode_media(clips)
    for clip, batched in zip(clips, together):
        torch.testing.assert_close(model.encode_media([clip])[0], batched, atol=1e-5, rtol=1e-4)


def test_sft_logprobs_ignore_the_sampling_temperature(two_agents):
    """SFT trains the model's own distribution; GRPO scores at the temperature it sampled with."""
    policy, _ = two_agents
    obs = observations(2)
    gens = policy.generate(obs, greedy=True)
    inputs = policy.encode(obs)
    completion, mask = pad_right([g.completion_ids for g in gens], policy.tokenizer.pad_token_id)
    at_one = policy.completion_logprobs(inputs, completion, mask, temperature=1.0)
    policy.temperature = 0.5
    tempered = policy.completion_logprobs(inputs, completion, mask)
    assert not torch.allclose(at_one, tempered)
    torch.testing.assert_close(policy.completion_logprobs(inputs, completion, mask, temperature=1.0), at_one)


# --- precision (each of these failed before the fix) --------------------------------------------
def test_an_all_equal_float64_group_gets_exactly_zero():
    rewards = torch.tensor([0.7] * 3 + [0.1, 0.3], dtype=torch.float64)
    advantages = normalize_by_type(rewards.tolist(), ["completion"] * 5, [0, 0, 0, 1, 1], 1e-6)
    assert advantages[:3].tolist() == [0.0, 0.0, 0.0]  # std of three 0.7s is ~1e-17, not 0
    assert advantages[3:].tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_unbiased_std_matches_trl():
    rewards = torch.tensor([0.0, 1.0, 3.0, 2.0, 2.0, 5.0], dtype=torch.float64)
    groups = [0, 0, 0, 1, 1, 1]
    got = normalize_by_type(rewards.tolist(), ["completion"] * 6, groups, 1e-4, std="unbiased")
    # TRL's GRPO: (r - mean) / (std(unbiased) + 1e-4) per group of G
    grouped = rewards.view(2, 3)
    trl = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
    assert torch.allclose(got, trl, rtol=0, atol=1e-15)


def test_no_std_keeps_the_reward_scale_dr_grpo():
    # Dr. GRPO / TRL's scale_rewards="none": u - mean per group, a small spread stays small
    rewards = [0.50, 0.51, 0.49, 0.50, 0.0, 2.0, 1.0, 1.0]
    got = normalize_by_type(rewards, ["completion"] * 8, [0] * 4 + [1] * 4, 1e-6, std="none")
    assert got.tolist() == pytest.approx([0.0, 0.01, -0.01, 0.0, -1.0, 1.0, 0.0, 0.0], abs=1e-12)
    scaled = normalize_by_type(rewards, ["completion"] * 8, [0] * 4 + [1] * 4, 1e-6)
    assert float(scaled[1]) == pytest.approx(float(scaled[5]), rel=1e-3)  # the std makes both groups' best +1.41
    with pytest.raises(ValueError, match="'population', 'unbiased' or 'none', got 'group'"):
        normalize_by_type(rewards, ["completion"] * 8, [0] * 8, 1e-6, std="group")


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_float64_logprobs_give_a_float64_loss(mode):
    g = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    old = logprobs + 0.01 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    advantages = torch.tensor([0.3, -1.1, 0.7], dtype=torch.float64)
    weights = token_weights(mask, mode=mode, dtype=logprobs.dtype)
    assert weights.dtype == torch.float64
    out = clipped_objective(logprobs, old, advantages, mask, weights=weights)
    ratio = torch.exp(logprobs - old)
    surrogate = torch.minimum(ratio * advantages[:, None], ratio.clamp(0.8, 1.2) * advantages[:, None])
    m = mask.double()
    if mode == "token":
        expected = -(surrogate * m).sum() / m.sum()
    else:
        expected = -((surrogate * m).sum(1) / m.sum(1)).mean()
    assert out["loss"].dtype == torch.float64
    assert abs(float(out["loss"] - expected)) < 1e-15
    default = clipped_objective(logprobs, old, advantages, mask)  # default weights follow the log-probs too
    assert default["loss"].dtype == torch.float64


@pytest.mark.slow  # builds a READ module on the toy movie (~10 s on the shared CPU)
def test_the_harness_runs_the_modules_own_update(tmp_path, toy_movie, make_read_config):
    """training.harness outside a Trainer: a module's own update (stage begun as training begins it)
    and the harness's call of the same function on the same agent give the same figures and weights."""
    import copy

    from agentcap.training.loading import load_module
    from agentcap.training.optim import build_optimizer

    stages = [{"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2}]
    config = make_read_config(tmp_path / "run", toy_movie, stages, beta=0.1, minibatch_size=3, micro_batch_size=2)
    torch.manual_seed(0)
    module = load_module(str(config), None)
    harness = UpdateHarness.of_module(module, 0)
    agent = module.agents["policy"]
    batch = module._rollout(module.schedule.stages[0], 0, 0)(None)  # the module's own rollout of step 0
    spans = batch.spans_of("policy")
    keys = [(batch.trajectory_ids[s.trajectory], s.action_index) for s in spans]
    for i, span in enumerate(spans):
        span.utility = float(i % 3)
    from agentcap.training.update import set_advantages

    set_advantages(spans, module.eps_norm, module.advantage_std)  # what grpo_step calls
    start, twins = copy.deepcopy(agent.state_dict()), copy.deepcopy(spans)
    got = harness.update(spans, keys)
    assert module.tick == 1 and got["grad_norm"] > 0
    after = copy.deepcopy(agent.state_dict())
    agent.load_state_dict(start)
    optimizer = build_optimizer(agent, module._optimizer.param_groups[0]["lr"], module.weight_decay)  # _begin_stage's
    again = UpdateHarness(agent, module.update_settings, optimizer=optimizer, reference=module._reference).update(twins, keys)
    assert again == got
    assert all(torch.equal(v, after[k]) for k, v in agent.state_dict().items())
