"""The KL reference π_ref of a GRPO stage: the trainable agent as it was when the stage began."""

from __future__ import annotations

import copy
from typing import Any

import torch

from agentcap.agents.agent import Agent


class Reference(torch.nn.Module):
    """A frozen copy of an agent's model, scored through the agent's own family (same encoding)."""

    def __init__(self, agent: Agent):
        super().__init__()
        self.model = copy.deepcopy(agent.model).eval().requires_grad_(False)

    @torch.no_grad()
    def completion_logprobs(self, agent: Agent, inputs: dict[str, Any], completion, mask) -> torch.Tensor:
        live = agent.family.model
        agent.family.model = self.model
        try:
            return agent.completion_logprobs(inputs, completion, mask)
        finally:
            agent.family.model = live
