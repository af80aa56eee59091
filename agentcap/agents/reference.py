"""The KL reference π_ref of a GRPO stage: the trainable agent as it was when the stage began, or
for a LoRA agent, by default, its own model with the adapters disabled (the base; no copy, no state).

Departure for LoRA (``kl_reference: base``, the default): after an SFT stage the reference is the
base *before* SFT, where a full fine-tune's reference is the policy at the start of the GRPO stage.
``kl_reference: stage_start`` gives a LoRA agent the paper's reference too: its adapter weights as
the stage began (:class:`AdaptersAtStageStart`), which matters when the stage follows the role's own
warm-up (ACE-Cap's Algorithm 1) and costs one copy of the adapter.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

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

    def state(self, full: bool = True) -> dict[str, Any]:
        from agentcap.parallel.sharding import model_state

        return model_state(self.model, full)

    def load_state(self, state) -> None:
        from agentcap.parallel.sharding import load_model_state

        load_model_state(self.model, state)

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

    def state(self, full: bool = True) -> None:
        return None

    def load_state(self, state) -> None:
        pass

    @torch.no_grad()
    def completion_logprobs(self, agent: Agent, inputs: dict[str, Any], completion, mask) -> torch.Tensor:
        with self.adapters.disabled():
            return agent.completion_logprobs(inputs, completion, mask)


class AdaptersAtStageStart:
    """A LoRA agent's reference as the policy at the start of its stage: a copy of its own adapter
    (and ``modules_to_save``) weights, swapped in for the reference pass and back out.

    The pass must run before the policy's forward of the same step (``training.update`` does), so
    no saved activation sees the swap. Not under ``grpo_fsdp``: a sharded adapter's copy would need
    its own sharded checkpoint entry."""

    def __init__(self, agent: Agent):
        from agentcap.parallel.sharding import is_sharded

        if is_sharded(agent.model):
            raise ValueError(f"kl_reference: stage_start is not supported for the sharded LoRA agent {agent.name!r} "
                             "(grpo_fsdp); use kl_reference: base")
        own = {id(p) for p in agent.adapters.own_parameters()}
        # Looked up once: moving the model between devices keeps these Parameter objects.
        self.live = {name: p for name, p in agent.model.named_parameters() if id(p) in own}
        self.weights = {name: p.detach().clone() for name, p in self.live.items()}

    def state(self, full: bool = True) -> dict[str, torch.Tensor]:
        return dict(self.weights)

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.weights):
            raise ValueError(f"the checkpoint's stage-start adapter has other tensors than the agent's: "
                             f"{sorted(set(state) ^ set(self.weights))[:3]}")
        self.weights = {name: state[name].to(w.device, w.dtype) for name, w in self.weights.items()}

    @torch.no_grad()
    def completion_logprobs(self, agent: Agent, inputs: dict[str, Any], completion, mask) -> torch.Tensor:
        current = {name: p.detach().clone() for name, p in self.live.items()}
        for name, weight in self.weights.items():
            self.live[name].copy_(weight)
        try:
            return agent.completion_logprobs(inputs, completion, mask)
        finally:
            for name, weight in current.items():
                self.live[name].copy_(weight)


def kl_reference(agent: Agent, mirror: torch.nn.Module | None = None,
                 mode: Literal["base", "stage_start"] = "base") -> Reference | AdaptersDisabled | AdaptersAtStageStart:
    """π_ref for ``agent``'s GRPO stage; ``mode`` matters only for a LoRA agent (module docstring)."""
    if agent.adapters is None:
        return Reference(agent, mirror)
    return AdaptersAtStageStart(agent) if mode == "stage_start" else AdaptersDisabled(agent)
