"""The KL reference π_ref of a GRPO stage: the trainable agent as it was when the stage began, or
for a LoRA agent its own model with the adapters disabled (the base; no copy, no state).

Departure for LoRA: after an SFT stage the reference is the base *before* SFT, where a full
fine-tune's reference is the policy at the start of the GRPO stage.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from agentcap.agents.agent import Agent


class Reference:
    """A frozen copy of an agent's model, scored through the agent's own family (same encoding).

    Not an ``nn.Module``: on the GRPOModule it would be a submodule whose weights every checkpoint
    gathered and saved as module weights, beside the stage state that restores it
    (``agentcap.training.checkpoint_hooks``).

    A sharded agent cannot be deep-copied: it brings ``mirror``, a frozen copy sharded alike when
    the agents were sharded (``agentcap.parallel.sharding.shard_agents``), which takes the policy's current
    weights here, each process its own shards."""

    def __init__(self, agent: Agent, mirror: torch.nn.Module | None = None):
        if mirror is None:
            self.model = copy.deepcopy(agent.model).eval().requires_grad_(False)
            return
        live = dict(agent.model.named_parameters())
        mirror.to(next(iter(live.values())).device)  # built before the strategy placed the policy
        with torch.no_grad():
            for name, param in mirror.named_parameters():
                param.copy_(live[name])  # DTensor to DTensor of the same placement: local
        self.model = mirror

    @torch.no_grad()
    def completion_logprobs(self, agent: Agent, inputs: dict[str, Any], completion, mask) -> torch.Tensor:
        live = agent.family.model
        agent.family.model = self.model
        try:
            return agent.completion_logprobs(inputs, completion, mask)
        finally:
            agent.family.model = live


class AdaptersDisabled:
    """A LoRA agent's reference: the same model with every adapter switched off (peft's
    ``disable_adapter``). Nothing to checkpoint: the base is rebuilt from the config."""

    model = None

    def __init__(self, agent: Agent):
        self.adapters = agent.adapters

    @torch.no_grad()
    def completion_logprobs(self, agent: Agent, inputs: dict[str, Any], completion, mask) -> torch.Tensor:
        with self.adapters.disabled():
            return agent.completion_logprobs(inputs, completion, mask)


def kl_reference(agent: Agent, mirror: torch.nn.Module | None = None) -> Reference | AdaptersDisabled:
    return AdaptersDisabled(agent) if agent.adapters is not None else Reference(agent, mirror)
