"""The trainable agent's optimiser: built when its stage begins, stepped after each minibatch.

Frozen agents get none, so they carry no optimiser state; only parameters with ``requires_grad``
are handed to AdamW.
"""

from __future__ import annotations

import torch

from agentcap import distributed
from agentcap.agents.agent import Agent
from agentcap.sharding import full_norm, needs_gradient_all_reduce


def build_optimizer(agent: Agent, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in agent.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def optimizer_step(agent: Agent, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
    """Sum gradients over ranks (a sharded agent's were reduce-scattered in backward), clip, step,
    clear, sync the agent's sampler; returns the gradient norm before clipping."""
    if needs_gradient_all_reduce(agent):
        distributed.sum_gradients(agent.parameters())
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in agent.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    agent.sync_weights()  # a vLLM sampler gets the new weights before the next rollout
    return full_norm(grad_norm)
