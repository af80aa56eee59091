"""Rollouts that overlap the update: bounded-staleness asynchronous GRPO (``model.max_staleness: K``).

Within a GRPO stage the rollouts R_s of step s are sampled with the trainable agent's weights
θ_{max(0, s−K)}, exactly, so a seed and K give the same figures whatever the threads' timing. One
background thread samples R_{s+1} … R_{s+K}, in order, while the main thread updates θ_s → θ_{s+1}
with R_s. Each queued batch carries a snapshot of the trainable tensors it must be sampled with; the
worker loads it into the trainable agent's sampler (``agentcap.agents.backends.snapshot``: a copy of
an HF agent, the agent's vLLM engine, or its served engines, which hold each version under a name of
its own while batches queued with it are in flight) just before it starts that batch, so the sampler
never changes mid-generation. :meth:`RolloutPipeline.take` refuses a batch more than K steps old, or
one whose generations name another version than the one it was queued with. Frozen agents act with their own weights, which do not change within a stage. Nothing is queued past the stage's last GRPO step and
:meth:`RolloutPipeline.begin` drains the queue, so no rollout crosses a stage boundary.

With K = 0 :meth:`RolloutPipeline.take` runs the rollout inline: no thread, no copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ContextManager


from agentcap.agents.agent import Agent, AgentConfig
from agentcap.agents.backends.served import ServedBackend
from agentcap.agents.backends.snapshot import sampler_copy
from agentcap.agents.backends.vllm import VLLMBackend
from agentcap.core.settings import ConfigError

if TYPE_CHECKING:  # the driver (and its environments) are not needed to queue rollouts: tools/gpu_check.py
    from agentcap.rollout.driver import RolloutBatch

#: ``request(step)`` is called in the main thread (items, seeds: anything that may talk to other
#: ranks); the callable it returns rolls out, in the worker, with ``stand_ins`` acting for their roles.
Request = Callable[[int], Callable[[Mapping[str, Agent] | None], "RolloutBatch"]]

#: backends that sample in a second thread while the learner updates
AHEAD = ("hf", "vllm", "served")


class StaleRolloutError(RuntimeError):
    """A batch sampled with other weights than those it was queued with, or older than K steps."""


class RolloutPipeline:
    """Up to ``max_staleness`` rollout batches in flight, sampled by one worker thread."""

    def __init__(self, max_staleness: int = 0):
        self.max_staleness = max_staleness
        self._executor: ThreadPoolExecutor | None = None
        # step → (future, the snapshot it samples with, its step)
        self._pending: dict[int, tuple[Future, dict[str, Any], int]] = {}
        self._sampler: Agent | None = None
        self._context: Callable[[], ContextManager] = contextlib.nullcontext
        self._stage: int | None = None
        self._saved: dict[int, tuple[dict[str, Any], int]] = {}  # from a checkpoint, for its stage

    @staticmethod
    def check(max_staleness: int, agents: Mapping[str, AgentConfig]) -> None:
        """Refuse, before anything loads, what cannot sample in a second thread while the learner updates."""
        if not max_staleness:
            return
        for role, config in agents.items():
            owner = config.share_base_with
            if owner is None:
                continue
            # roles on one base sample through one vLLM engine (an adapter per role), which never switches
            # the shared model's adapter; HF generate would, in the rollout thread, while the update runs it
            hf = [r for r in (owner, role) if r in agents and agents[r].backend not in ("vllm", "served")]
            if hf:
                raise ConfigError(
                    f"--model.max_staleness {max_staleness}: agents.{role}.share_base_with is {owner!r}, and "
                    f"agents.{hf[0]}.backend is {agents[hf[0]].backend!r}: HF generate switches adapters on the "
                    "shared model, which the update and the rollout thread would do at once; set backend: vllm "
                    "(or served) on every role of the base (one engine holds it, with an adapter per role), or use "
                    "max_staleness 0"
                )
        for role, config in agents.items():
            if config.backend not in AHEAD:
                raise ConfigError(
                    f"--model.max_staleness {max_staleness}: agents.{role}.backend {config.backend!r} cannot "
                    f"sample ahead of the update ({', '.join(AHEAD)} can); use max_staleness 0"
                )

    @staticmethod
    def check_sharded(max_staleness: int, agents: Mapping[str, Agent] | None = None) -> None:
        """Under ``grpo_fsdp`` every forward of a sharded agent is a collective: a rollout thread's
        forwards would interleave with the update's collectives differently on each rank. So every
        agent must sample through an engine that holds weights of its own: a vLLM engine (rank-local)
        or the rank's ``vllm serve`` processes. The main thread gathers each snapshot (and the learner's
        probe log-probs) between updates, syncs the frozen roles' engines when the stage begins, scores
        the episodes and takes the learner's log-probs; the worker only drives engines (and HTTP)."""
        if not max_staleness:
            return
        hf = sorted(name for name, agent in (agents or {}).items()
                    if not isinstance(agent.backend, (VLLMBackend, ServedBackend)))
        if agents is None or hf:
            named = ", ".join(f"agents.{name}.backend" for name in hf) or "an agent's backend"
            raise ConfigError(
                f"--model.max_staleness {max_staleness} under --trainer.strategy grpo_fsdp needs every agent to "
                f"sample through a vLLM engine, but {named} is hf (a sharded agent's generate is a collective, "
                "which the rollout thread would run against the update's); set backend: vllm (or served), or use "
                "max_staleness 0, or grpo_ddp / ddp"
            )

    def begin(self, stage_index: int, agent: Agent | None, context: Callable[[], ContextManager] | None = None,
              acting: Sequence[Agent] = ()) -> None:
        """A stage boundary: drop whatever is in flight; a GRPO stage (``agent`` set) with K ≥ 1 gets a
        sampler of its own for its trainable agent. ``context`` is entered by the worker around each rollout
        (the trainer's precision context: autocast is thread-local). ``acting``: the stage's other roles
        that act; their vLLM engines are built and synced here, in the main thread (a sync of a sharded
        agent is a collective), so the worker only ever generates with them."""
        self.drain()
        self._sampler = None
        if self._stage != stage_index:
            self._saved = {}  # a checkpoint's pending batches belong to the stage it was written in
        self._stage = stage_index
        if self.max_staleness and agent is not None:
            self._sampler = sampler_copy(agent)
            self._context = context or contextlib.nullcontext
            for other in acting:
                if other is not agent and isinstance(other.backend, (VLLMBackend, ServedBackend)):
                    other.backend.prepare()

    def take(self, step: int, last_step: int, agent: Agent, request: Request) -> tuple[RolloutBatch, int]:
        """R_step and its staleness (optimiser steps between its weights and the current ones).

        First queues every step up to ``step + K`` (never past ``last_step``) that is not queued yet,
        with a snapshot of the current weights θ_step; then waits for R_step.
        """
        if not self.max_staleness:
            return request(step)(None), 0
        if self._sampler is None:
            raise RuntimeError("RolloutPipeline.take before begin() of a GRPO stage")
        jobs, now = [], None
        for later in range(step, min(step + self.max_staleness, last_step) + 1):
            if later not in self._pending:
                saved = self._saved.pop(later, None)
                if saved is None:  # one snapshot of θ_step for every batch queued with it
                    now = now or (self._sampler.backend.snapshot(agent), step)
                    saved = now
                jobs.append((later, *saved))
        # every batch counted before the first starts: a version whose batch finishes before a sibling
        # is counted would be released (a served adapter unloaded) and installed again under a new name
        queued = getattr(self._sampler.backend, "queued", None)
        if queued is not None:
            for _, _, version in jobs:
                queued(version)
        for later, snapshot, version in jobs:
            self._submit(later, request(later), snapshot, version)
        future, _, version = self._pending.pop(step)
        if step - version > self.max_staleness:
            raise StaleRolloutError(f"step {step}: its rollouts were queued with the weights of step {version}, "
                                    f"{step - version} steps old (max_staleness {self.max_staleness})")
        batch = future.result()
        self._check_version(batch, step, version)
        return batch, step - version

    def _check_version(self, batch: RolloutBatch, step: int, version: int) -> None:
        """Every generation of the trainable agent names the version its batch was queued with, where the
        sampler names versions (served engines: the adapter, or the weight version, each reply came from)."""
        sampler = self._sampler
        expected = getattr(sampler.backend, "expected", None)
        spans = getattr(batch, "spans", None)  # a RolloutBatch's; a bare list of generations names no agent
        if expected is None or spans is None:
            return
        want = expected(version)
        seen = sorted({str(s.sampler_version) for s in spans if s.agent == sampler.name} - {want})
        if seen:
            raise StaleRolloutError(f"agents.{sampler.name}: step {step}'s rollouts were queued with {want!r} "
                                    f"(the weights of step {version}) but came from {seen}")

    def _submit(self, step: int, run, snapshot: dict[str, Any], version: int) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="agentcap-rollout")
        future = self._executor.submit(self._rollout, run, snapshot, version)
        self._pending[step] = (future, snapshot, version)

    def _rollout(self, run, snapshot: dict[str, Any], version: int) -> RolloutBatch:
        """In the worker thread: the sampler takes the batch's weights, then rolls it out."""
        sampler = self._sampler
        assert sampler is not None
        try:
            with self._context():
                sampler.backend.load(snapshot, version)
                return run({sampler.name: sampler})
        finally:
            self._finished(sampler, version)

    @staticmethod
    def _finished(sampler: Agent, version: int) -> None:
        finished = getattr(sampler.backend, "finished", None)
        if finished is not None:
            finished(version)

    def drain(self) -> None:
        """Cancel queued batches and wait for the one being sampled; their results (and errors) are
        dropped: the stage that wanted them is over."""
        cancelled = [version for future, _, version in self._pending.values() if future.cancel()]
        for future, _, _ in self._pending.values():
            if not future.cancelled():
                with contextlib.suppress(Exception):
                    future.result()
        self._pending.clear()
        if self._sampler is not None:
            for version in cancelled:  # never ran: their versions are released here, after the one running
                self._finished(self._sampler, version)

    def close(self) -> None:
        """Drain and stop the worker thread (the fit ended)."""
        self.drain()
        self._sampler = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # --- checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any] | None:
        """The batches in flight as what regenerates them: their step and the snapshot they are sampled
        with (tensors only, for ``torch.load(weights_only=True)``). Sampling is a pure function of the
        weights, the items and the tick's seed, so a resume that samples them again gets the same rollouts."""
        if not self._pending:
            return None
        return {"stage": self._stage, "pending": [
            {"step": step, "version": version, "snapshot": snapshot}
            for step, (_, snapshot, version) in sorted(self._pending.items())
        ]}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """A checkpoint's batches in flight, queued again by :meth:`take` when their stage resumes."""
        self._saved = {}
        if state:
            self._stage = int(state["stage"])
            self._saved = {int(p["step"]): (dict(p["snapshot"]), int(p["version"])) for p in state["pending"]}
