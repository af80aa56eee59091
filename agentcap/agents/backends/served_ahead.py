"""Served engines sampling ahead of the update: the versions that rollouts in flight are sampled with.

With ``max_staleness`` K ≥ 1 (``agentcap.rollout.pipeline``) and ``backend: served`` the main thread
takes a :meth:`ServedAhead.snapshot` of the learner between updates, and the rollout thread installs
each batch's snapshot on the servers as a version of its own (``agentcap-<trainer>.<role>.v<N>``,
:meth:`ServedBackend.install`, verified on the probe) and asks for that version by name, so a reply
is tied to the weights its batch was queued with and every generation records it
(``Generation.sampler_version``; the pipeline checks it when it takes the batch).

An adapter version stays loaded while a batch queued with it is waiting or sampling and is unloaded
(and its folder removed) once the last of them is done or dropped, so a server holds the versions
in flight (at most K + 1 with one rollout thread, in practice one or two), never one that a rollout
still asks for. Batches queued with the same learner step (a stage's first K + 1) share one version.
A full fine-tune's server holds one set of weights: each new version replaces the last, which the
in-order rollout thread no longer needs; the weight version is read around every batch as before.

A server restarted mid-stage has lost the versions in flight: the next install or batch names the
restart (:class:`~agentcap.agents.backends.served.ServedEngineError`) before anything is trained on
it, as between two syncs of the serial step.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from agentcap.agents.backends.served import ServedBackend
from agentcap.agents.backends.verify import learner_logprobs
from agentcap.agents.backends.weights import gathered_weights, trainable_weights
from agentcap.agents.generation import Generation
from agentcap.parallel.sharding import is_sharded


class ServedAhead:
    """The learner's servers as the rollout thread drives them (one per GRPO stage): each batch's
    snapshot goes in as a named version, which that batch's rollouts ask for."""

    holds_weights = True  # generation never runs the learner's model (``Agent.generate``)

    def __init__(self, agent, served: ServedBackend):
        self.agent = agent  # the stand-in: its own tokenizer
        self.served = served
        self.version: int | None = None  # the learner step whose weights the current batch samples with
        self.names: dict[int, str] = {}  # learner step → the version its batches were sampled with (this stage)
        self.loaded: dict[int, str] = {}  # learner step → its adapter, still on the servers
        self.users: Counter[int] = Counter()  # learner step → its batches queued or sampling
        self.lock = threading.Lock()

    def snapshot(self, learner) -> dict[str, Any]:
        """In the main thread, between updates: the trainable tensors (a LoRA agent's adapter, on the host)
        and the learner's log-probs of the probe, all :meth:`load` needs later. Under ``grpo_fsdp`` every
        gather and the probe's forward are collectives, so they all run here; the rollout thread only
        writes files and talks HTTP."""
        served = self.served
        model = served.agent.model
        if served.adapter is not None:
            weights = served.adapter.tensors()  # whole tensors, gathered
        elif is_sharded(model):
            weights = gathered_weights(model)
        else:
            weights = trainable_weights(model, whole=True)
        return {"weights": weights, "probe": learner_logprobs(served.agent, served.probe)}

    def queued(self, version: int) -> None:
        """A batch to be sampled with learner step ``version``'s weights was queued (main thread)."""
        with self.lock:
            self.users[version] += 1

    def load(self, snapshot: Mapping[str, Any], version: int) -> None:
        """In the rollout thread, before a batch: its version on the servers (installed once per step)."""
        with self.lock:
            name, keep = self.loaded.get(version), list(self.loaded.values())
        if name is None:
            name = self.served.install(dict(snapshot["weights"]), snapshot["probe"], keep)
            with self.lock:
                if self.served.adapter is None:
                    self.loaded.clear()  # a full fine-tune's server holds one set of weights
                self.loaded[version] = name
                self.names[version] = name
        else:
            self.served.check_held(keep)  # a restart since the version went in
        self.version = version

    def finished(self, version: int) -> None:
        """A batch of ``version`` is done (sampled, failed or dropped): the last one unloads its adapter."""
        with self.lock:
            self.users[version] -= 1
            if self.users[version] > 0:
                return
            del self.users[version]
            name = self.loaded.pop(version, None) if self.served.adapter is not None else None
        if name is not None:
            self.served.unload(name)

    def expected(self, version: int) -> str | None:
        """The version the batches of learner step ``version`` were sampled with (None: not installed)."""
        return self.names.get(version)

    def sample(self, observations: Sequence[dict[str, Any]], inputs: dict[str, Any], greedy: bool,
               seeds: Sequence[int] | None = None) -> list[Generation]:
        assert self.version is not None, "ServedAhead.sample before load"
        return self.served.sample_as(self.agent, observations, greedy, seeds,
                                     self.served.model_of(self.names[self.version]))

    def sync(self) -> None:
        """The servers follow the learner through :meth:`load` only (between batches)."""

    weights_changed = sync
