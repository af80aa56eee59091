"""``greedy_numbers``: sampled responses whose numbers are the likeliest ones, and a loss that skips them
(or, with ``number_beta``, holds them to the reference by their own KL term)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_agents import tiny_agent

from agentcap.agents.agent import AgentConfig
from agentcap.agents.sampling import RowSampler, collapse_to_best, number_token_ids
from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.agents.tokens import pad_right
from agentcap.algorithms.grpo import clipped_objective, kl_k3, token_weights
from agentcap.core.schedule import Stage
from agentcap.core.settings import ConfigError
from agentcap.training.module import GRPOModule
from agentcap.training.update import UpdateSettings, policy_loss, policy_step

TEXTS = ["From 0.3 s to 2 s a bell rings .", "12 dogs bark at 4.5 s ."]


def test_the_numbers_are_one_choice_drawn_with_their_mass_and_written_greedily():
    logits = torch.tensor([[1.0, 0.5, 0.8, 0.2, -0.3, 0.0]])
    numbers = torch.tensor([2, 3, 4])
    sampler = RowSampler([7], temperature=1.5, greedy_ids=numbers)
    counts = torch.zeros(6)
    for _ in range(6000):
        counts[int(sampler(None, logits).argmax())] += 1
    p = torch.softmax(logits[0] / 1.5, -1)
    expected = torch.tensor([p[0], p[1], p[2] + p[3] + p[4], 0.0, 0.0, p[5]])
    assert counts[3] == counts[4] == 0  # never a number other than the likeliest
    assert torch.allclose(counts / 6000, expected, atol=0.03), (counts / 6000, expected)
    # the row's likeliest number: per row, and a row whose numbers top-p removed keeps none
    two = collapse_to_best(torch.tensor([[0.0, 0.0, 1.0, 3.0, 2.0, 0.0], [5.0, -1.0] + [float("-inf")] * 3 + [0.0]]),
                           numbers)
    assert torch.isfinite(two).tolist() == [[True, True, False, True, False, True], [True, True, False, False, False, True]]
    assert float(two[0, 3]) == pytest.approx(float(torch.logsumexp(torch.tensor([1.0, 3.0, 2.0]), 0)))


def test_number_tokens_are_digits_with_an_optional_decimal_part():
    tokenizer = build_word_tokenizer(TEXTS)
    found = set(tokenizer.convert_ids_to_tokens(number_token_ids(tokenizer).tolist()))
    assert found == {"0.3", "12", "4.5", *"0123456789"}  # the word tokenizer holds the ten digits too


def _agent(greedy_numbers: bool, **options):
    return tiny_agent("qwen2", texts=TEXTS, max_new_tokens=12, seed=0, greedy_numbers=greedy_numbers, **options)


def _observations(n: int) -> list[dict]:
    return [{"agent": "policy", "messages": [{"role": "user", "content": "caption : a bell rings at 0.3 s ."}],
             "media": {}} for _ in range(n)]


def test_sampled_rows_write_only_the_likeliest_number_and_greedy_rows_are_unchanged():
    plain, greedy = _agent(False), _agent(True)
    numbers = set(greedy.greedy_ids.tolist())
    assert numbers and plain.greedy_ids is None
    sampled = greedy.generate(_observations(16), seeds=list(range(16)))
    # every number a row wrote is the one the model ranks first among the numbers at that point
    inputs = greedy.encode(_observations(1))
    checked = 0
    for g in sampled:
        ids = g.completion_ids
        for t in range(ids.numel()):
            if int(ids[t]) in numbers:
                completion, mask = ids[None, :t + 1], torch.ones(1, t + 1, dtype=torch.long)
                logits = greedy.family.logits(inputs, completion, mask)[0, t]
                assert int(ids[t]) == int(greedy.greedy_ids[logits[greedy.greedy_ids].argmax()])
                checked += 1
    assert checked > 0, "no row wrote a number: the check saw nothing"
    # greedy decoding does not depend on the option
    kept = [g.completion_ids.tolist() for g in plain.generate(_observations(2), greedy=True, old_logprobs=False)]
    assert kept == [g.completion_ids.tolist() for g in greedy.generate(_observations(2), greedy=True, old_logprobs=False)]


def _rows(agent) -> list[SimpleNamespace]:
    ids = lambda *words: torch.tensor(agent.tokenizer.convert_tokens_to_ids(list(words)), dtype=torch.long)
    return [SimpleNamespace(observation=_observations(1)[0], completion_ids=c, advantage=a, old_logprobs=None,
                            sampler_logprobs=None)
            for c, a in ((ids("From", "0.3", "s", "to", "2", "s"), 1.0), (ids("a", "bell", "12"), -1.0))]


def test_the_policy_loss_and_its_normaliser_leave_the_numbers_out():
    agent = _agent(True)
    agent.set_trainable(True)
    ids = lambda *words: torch.tensor(agent.tokenizer.convert_tokens_to_ids(list(words)), dtype=torch.long)
    rows = _rows(agent)
    assert agent.trained_tokens(rows[0].completion_ids).tolist() == [True, False, True, True, False, True]
    settings = UpdateSettings()
    norm = 6.0  # the trained tokens: 4 + 2
    stats = policy_loss(agent, rows, norm, settings, device=torch.device("cpu"), backward=lambda loss: None)
    # by hand: the clipped objective on the trained tokens only, under the same normaliser
    completion, mask = pad_right([r.completion_ids for r in rows], agent.tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = agent.completion_logprobs(agent.encode([r.observation for r in rows]), completion, mask)
    trained = mask * ~torch.isin(completion, agent.greedy_ids)
    by_hand = clipped_objective(logprobs, logprobs, torch.tensor([1.0, -1.0]), trained,
                                weights=token_weights(trained, normalizer=norm))
    assert stats["pg_loss"] == pytest.approx(float(by_hand["pg_loss"]), rel=1e-5)
    # a row made only of numbers gives the policy no gradient
    agent.model.zero_grad()
    only = [SimpleNamespace(observation=rows[0].observation, completion_ids=ids("0.3", "2"), advantage=1.0,
                            old_logprobs=None, sampler_logprobs=None)]
    optimizer = torch.optim.SGD(agent.trainable_parameters(), lr=0.1)
    stats = policy_step(agent, only, settings, optimizer, device=torch.device("cpu"))
    assert stats["pg_loss"] == 0.0 and stats["grad_norm"] == 0.0


class ShiftedReference:
    """A KL reference whose log-probs are the policy's minus ``shift`` nats on every token."""

    def __init__(self, shift: float):
        self.shift = shift

    def completion_logprobs(self, agent, inputs, completion, mask):
        with torch.no_grad():
            return agent.completion_logprobs(inputs, completion, mask) - self.shift


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_number_beta_holds_the_numbers_to_the_reference_with_their_own_kl(mode):
    agent = _agent(True, number_beta=0.5)
    agent.set_trainable(True)
    rows = _rows(agent)
    settings = UpdateSettings(beta=0.1, loss_aggregation=mode)
    norm = 6.0 if mode == "token" else 2.0  # the trained tokens (4 + 2), or the rows
    stats = policy_loss(agent, rows, norm, settings, device=torch.device("cpu"), reference=ShiftedReference(0.3),
                        backward=lambda loss: None)
    # by hand: k3 of a 0.3-nat gap on each number, weighted like a trained token of its row
    k3 = float(kl_k3(torch.zeros(()), torch.tensor(-0.3)))
    per_number = {"token": [1 / 6, 1 / 6], "sequence": [1 / 4 / 2, 1 / 2 / 2]}[mode]  # rows: 2 numbers, 1 number
    assert stats["number_kl"] == pytest.approx(k3 * (2 * per_number[0] + per_number[1]), rel=1e-5)
    assert stats["kl"] == pytest.approx(k3, rel=1e-5)  # the trained tokens' KL: weights summing to one
    assert stats["loss"] == pytest.approx(stats["pg_loss"] + 0.1 * stats["kl"] + 0.5 * stats["number_kl"], rel=1e-5)
    # a row made only of numbers now has a gradient, and it lowers the numbers' log-probs towards the reference's
    ids = lambda *words: torch.tensor(agent.tokenizer.convert_tokens_to_ids(list(words)), dtype=torch.long)
    only = [SimpleNamespace(observation=rows[0].observation, completion_ids=ids("0.3", "2"), advantage=1.0,
                            old_logprobs=None, sampler_logprobs=None)]
    inputs, (completion, mask) = agent.encode([only[0].observation]), pad_right([only[0].completion_ids], 0)
    before = agent.completion_logprobs(inputs, completion, mask).detach()
    optimizer = torch.optim.SGD(agent.trainable_parameters(), lr=1.0)
    stats = policy_step(agent, only, settings, optimizer, device=torch.device("cpu"), reference=ShiftedReference(0.3))
    assert stats["pg_loss"] == 0.0 and stats["grad_norm"] > 0.0
    assert float(agent.completion_logprobs(inputs, completion, mask).detach().sum()) < float(before.sum())


def test_greedy_numbers_needs_the_hf_backend_and_number_beta_needs_greedy_numbers_and_a_reference():
    with pytest.raises(ConfigError, match=r"agents\.policy\.greedy_numbers needs backend: hf.*'vllm'"):
        AgentConfig(model="m", backend="vllm", greedy_numbers=True).check("policy")
    with pytest.raises(ConfigError, match=r"agents\.policy\.number_beta .*needs .*greedy_numbers: true, got number_beta 0.5"):
        AgentConfig(model="m", number_beta=0.5).check("policy")
    with pytest.raises(ConfigError, match=r"agents\.policy\.number_beta \(0.5\) needs --model\.beta > 0"):
        GRPOModule(env=None, agents={"policy": AgentConfig(model="m", greedy_numbers=True, number_beta=0.5)},
                   stages=[Stage(name="grpo", kind="grpo", agent="policy")])
