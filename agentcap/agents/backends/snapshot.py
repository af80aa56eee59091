"""A sampler that holds its own copy of a trainable agent's weights, for rollouts that overlap the update.

With ``max_staleness`` ≥ 1 (``agentcap.rollout.pipeline``) the next rollouts are sampled in a
background thread while the learner's parameters change in place. The HF backend samples with the
learner's own model, so the sampler needs a copy: :func:`sampler_copy` deep-copies the agent (model,
adapters, tokenizer: a fast tokenizer is not safe to share between threads) and gives the copy a
:class:`SnapshotBackend`, which samples with the copy's weights and also returns the copy's log-probs
of what it sampled, so the update's truncated importance weights and sampler gap
(``agentcap.algorithms.offpolicy``) measure the real staleness. The learner's trainable weights reach
the copy only through :meth:`SnapshotBackend.load`, called between two generations, never during one.

Memory: one more copy of the trainable agent (plus one snapshot of its trainable tensors per rollout
batch in flight). At scale sample with vLLM, whose engine already holds its own copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentcap.agents.backends.hf import HFBackend
from agentcap.agents.generation import Generation
from agentcap.agents.tokens import pad_right


def trainable_weights(agent) -> dict[str, torch.Tensor]:
    """A detached clone of ``agent``'s trainable tensors (the adapter only, for a LoRA agent)."""
    with torch.no_grad():
        return {name: p.detach().clone() for name, p in agent.model.named_parameters() if p.requires_grad}


def sampler_copy(agent):
    """A frozen deep copy of ``agent`` that samples through a :class:`SnapshotBackend`."""
    if type(agent.backend) is not HFBackend:
        raise ValueError(f"agents.{agent.name}: a sampler copy is made of an HF-backend agent only "
                         f"(got {type(agent.backend).__name__})")
    names = [name for name, p in agent.model.named_parameters() if p.requires_grad]
    twin = copy.deepcopy(agent)
    twin.set_trainable(False)
    twin.backend = SnapshotBackend(twin, names)
    return twin


class SnapshotBackend:
    """HF sampling on a frozen copy; the copy's log-probs of each sample are the sampler's log-probs."""

    def __init__(self, agent, names: Sequence[str]):
        self.agent = agent
        self.hf = HFBackend(agent)
        self.names = list(names)  # the learner's trainable tensors, which :meth:`load` replaces
        self.stale = False  # never read: the copy changes only through `load`
        self.version: int | None = None  # the learner's step whose weights the copy holds

    @torch.no_grad()
    def load(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Take the learner's trainable tensors of step ``version`` (from :func:`trainable_weights`)."""
        missing = sorted(set(self.names) - set(weights))
        if missing:
            raise ValueError(f"agents.{self.agent.name}: the sampler snapshot lacks {missing[:3]}")
        params = dict(self.agent.model.named_parameters())
        for name in self.names:
            params[name].copy_(weights[name])
        self.version = version

    @torch.no_grad()
    def sample(
        self,
        observations: Sequence[dict[str, Any]],
        inputs: dict[str, Any],
        greedy: bool,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        sampled = self.hf.sample(observations, inputs, greedy, seeds)
        completion, mask = pad_right([g.completion_ids for g in sampled], self.agent.tokenizer.pad_token_id,
                                     self.agent.family.device)
        logprobs = self.agent.completion_logprobs(inputs, completion, mask)
        return [Generation(g.completion_ids, sampler_logprobs=lp[: g.completion_ids.numel()].float().cpu())
                for g, lp in zip(sampled, logprobs)]

    def sync(self) -> None:
        """The copy follows the learner through :meth:`load` only (between generations)."""
