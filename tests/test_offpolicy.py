"""Off-policy correction (truncated importance sampling) and the served-judge client's failures."""

from __future__ import annotations

import socket

import pytest
import torch

from agentcap.algorithms.grpo import clipped_objective
from agentcap.algorithms.offpolicy import sampler_gap, truncated_importance_weights
from agentcap.judges.served import JudgeUnavailable, ServedClient, served_judge_client


def test_weights_are_the_capped_ratio_of_learner_to_sampler():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, 0.0, 0.0]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w = truncated_importance_weights(old, sampler, mask, cap=1.5)
    expected = torch.tensor([[1.5, torch.exp(torch.tensor(-1.0)), 1.0], [torch.exp(torch.tensor(-0.8)), 0, 0]])
    assert torch.allclose(w, expected)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="tis_cap"):
        truncated_importance_weights(old, sampler, mask, cap=0.0)
    gap = sampler_gap(old, sampler, mask)
    assert gap["sampler_gap_max"] == pytest.approx(1.0) and gap["sampler_gap_mean"] == pytest.approx(2.3 / 4)


def test_weights_scale_each_tokens_policy_gradient():
    logprobs = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = logprobs.detach().clone()
    advantages, mask = torch.tensor([1.0]), torch.ones(1, 2)
    plain = clipped_objective(logprobs, old, advantages, mask)
    (g_plain,) = torch.autograd.grad(plain["loss"], logprobs)
    weighted = clipped_objective(logprobs, old, advantages, mask, importance_weights=torch.tensor([[2.0, 0.5]]))
    (g_weighted,) = torch.autograd.grad(weighted["loss"], logprobs)
    assert torch.allclose(g_weighted, g_plain * torch.tensor([[2.0, 0.5]]))


def test_a_down_judge_server_gives_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = ServedClient(f"http://127.0.0.1:{port}/v1", "judge", timeout=2, retries=1, backoff=0.01)
    with pytest.raises(JudgeUnavailable, match=r"127\.0\.0\.1:\d+/v1/chat/completions .*after 2 attempts"):
        client.map("/chat/completions", [{"model": "judge", "messages": []}])


def test_served_judge_config_errors_name_the_field():
    with pytest.raises(ValueError, match="examiner: a served judge needs both url and model"):
        served_judge_client({"url": "http://127.0.0.1:8000/v1"}, "examiner")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['modle'\]"):
        served_judge_client({"url": "http://x/v1", "modle": "m"}, "examiner")
    with pytest.raises(ValueError, match="must start with http"):
        ServedClient("127.0.0.1:8000/v1", "m")
