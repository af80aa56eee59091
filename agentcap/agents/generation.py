"""The record of one sampled action, from the sampler to the update.

A backend (``agentcap.agents.backends``) fills the token ids and the log-probs it drew them with;
:meth:`agentcap.agents.agent.Agent.generate` adds the decoded text and the learner's log-probs; the
rollout's training row (:class:`agentcap.rollout.driver.Span`) extends it with its place in the
episode, its utility and its advantage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Generation:
    """One sampled action.

    ``completion_ids``: token ids up to and including EOS. ``sampler_logprobs``: the sampler's own
    log-probs of them (a vLLM backend's, for the off-policy correction); a backend whose sampler is
    the learner (HF) leaves them ``None`` and ``Agent.generate`` sets them to the learner's.
    ``text``: the decoded action. ``old_logprobs``: the learner's log-probs (the old policy), ``None``
    when not asked for: the update then takes them from its own first forward
    (``agentcap.training.old_policy``). ``sampler_version``: the weights that sampled it, where a
    sampler names them (a served engine's adapter or weight version), so rollouts sampled ahead of
    the update can be checked against the version they were queued with.
    """

    completion_ids: torch.Tensor  # [T]
    sampler_logprobs: torch.Tensor | None = None  # [T]
    text: str = ""
    old_logprobs: torch.Tensor | None = None  # [T]
    sampler_version: str | None = None
