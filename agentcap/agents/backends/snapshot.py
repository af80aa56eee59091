"""Samplers that hold the weights of an earlier step, for rollouts that overlap the update.

With ``max_staleness`` ≥ 1 (``agentcap.rollout.pipeline``) the next rollouts are sampled in a
background thread while the learner's parameters change in place. The main thread takes a
:meth:`snapshot` of the learner between two updates; the rollout thread ``load``\\ s it into its
sampler just before the batch that must be sampled with it, never during a generation.
:func:`sampler_copy` builds the rollout thread's stand-in for the trainable agent:

- HF backend (:class:`SnapshotBackend`): the HF backend samples with the learner's own model, so the
  stand-in is a deep copy of the agent (model, adapters, tokenizer) whose trainable tensors take
  each snapshot; it also returns the copy's log-probs of what it sampled, so the update's truncated
  importance weights and sampler gap (``agentcap.algorithms.offpolicy``) measure the real staleness.
  Memory: one more copy of the trainable agent.
- vLLM backend (:class:`EngineSnapshot`): the engine already holds weights of its own, so the
  stand-in shares the learner's model (never run) and engine and copies only what a second thread
  must not share (tokenizer, processor: a fast tokenizer is not thread-safe). Each snapshot goes
  into the engine as a verified sync (``backends.vllm``, :meth:`VLLMBackend.load_snapshot`).
- served backend (``backends.served_ahead.ServedAhead``): the same stand-in, driving the learner's
  ``vllm serve`` processes; each snapshot goes in as a named version of its own, kept loaded while
  batches queued with it are in flight.

Either way each batch in flight keeps one snapshot of the trainable tensors (a LoRA agent's: its
adapter) until it is sampled.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentcap.agents.backends.hf import HFBackend
from agentcap.agents.backends.served import ServedBackend
from agentcap.agents.backends.served_ahead import ServedAhead
from agentcap.agents.backends.vllm import VLLMBackend
from agentcap.agents.backends.weights import trainable_weights
from agentcap.agents.generation import Generation
from agentcap.agents.tokens import pad_right


def sampler_copy(agent):
    """The rollout thread's stand-in for ``agent`` (frozen), sampling through a snapshot backend."""
    backend = agent.backend
    if type(backend) is HFBackend:
        names = [name for name, p in agent.model.named_parameters() if p.requires_grad]
        twin = copy.deepcopy(agent)
        twin.set_trainable(False)
        twin.backend = SnapshotBackend(twin, names)
        return twin
    if isinstance(backend, VLLMBackend):
        backend.llm, backend.probe  # built here, in the main thread, not by the rollout thread
        twin = copy.deepcopy(agent, _shared(agent))  # the model and the engine stay the learner's
        twin.trainable = False  # not set_trainable: that would freeze the learner's shared model
        twin.backend = EngineSnapshot(twin, backend)
        return twin
    if isinstance(backend, ServedBackend):
        backend.servers, backend.probe  # connected and checked here, in the main thread
        twin = copy.deepcopy(agent, _shared(agent))
        twin.trainable = False
        twin.backend = ServedAhead(twin, backend)
        return twin
    raise ValueError(f"agents.{agent.name}: rollouts ahead of the update need an hf, vllm or served backend "
                     f"(got {type(backend).__name__})")


def _shared(agent) -> dict[int, Any]:
    """What a stand-in that never runs the model shares with the learner (a ``deepcopy`` memo): the
    backend and every module, the peft wrapper's included (FSDP refuses to copy a sharded module)."""
    modules = list(agent.model.modules())
    if agent.adapters is not None:
        modules += list(agent.adapters.peft_model.modules())
    return {id(agent.backend): agent.backend, **{id(m): m for m in modules}}


class SnapshotBackend:
    """HF sampling on a frozen copy; the copy's log-probs of each sample are the sampler's log-probs."""

    def __init__(self, agent, names: Sequence[str]):
        self.agent = agent
        self.hf = HFBackend(agent)
        self.names = list(names)  # the learner's trainable tensors, which :meth:`load` replaces
        self.version: int | None = None  # the learner's step whose weights the copy holds

    @staticmethod
    def snapshot(learner) -> dict[str, Any]:
        """In the main thread: the learner's trainable tensors now."""
        return {"weights": trainable_weights(learner.model)}

    @torch.no_grad()
    def load(self, snapshot: Mapping[str, Any], version: int) -> None:
        """Take the learner's trainable tensors of step ``version`` (a :meth:`snapshot`)."""
        weights = snapshot["weights"]
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

    weights_changed = sync


class EngineSnapshot:
    """The learner's vLLM engine as the rollout thread drives it: each batch's snapshot goes in
    first; the engine's own log-probs of each sample are the sampler's log-probs."""

    holds_weights = True  # generation never runs the learner's model (``Agent.generate``)

    def __init__(self, agent, engine: VLLMBackend):
        self.agent = agent  # the stand-in: its own tokenizer
        self.engine = engine
        self.version: int | None = None

    def snapshot(self, learner) -> dict[str, Any]:
        """In the main thread: the learner's trainable tensors and probe log-probs now."""
        return self.engine.snapshot()

    def load(self, snapshot: Mapping[str, Any], version: int) -> None:
        self.engine.load_snapshot(snapshot)
        self.version = version

    def sample(
        self,
        observations: Sequence[dict[str, Any]],
        inputs: dict[str, Any],
        greedy: bool,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        return self.engine.sample_as(self.agent, observations, greedy, seeds)

    def sync(self) -> None:
        """The engine follows the learner through :meth:`load` only (between generations)."""

    weights_changed = sync
