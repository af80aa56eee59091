"""The rollout driver: steps B items × G rollouts together, turn by turn.

At every turn the pending observations are grouped by the agent that must act and each agent
makes one batched generation call for all of them; finished trajectories drop out. Every generated
action becomes a :class:`Span` carrying its agent, kind, token ids and old log-probs; environment
text (answers of a frozen role, prompts) stays in the observations and is never trained on.
Episodes are scored once per batch with the environment's batched ``score``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentcap.agents.agent import Agent
from agentcap.env import CaptionEnv
from agentcap.episode import Episode, Score


@dataclass
class Span:
    """One generated action, with what the update needs to re-score it."""

    agent: str
    kind: str
    trajectory: int
    group: int
    action_index: int
    observation: dict[str, Any]
    text: str
    completion_ids: torch.Tensor  # [T]
    old_logprobs: torch.Tensor | None  # [T]; None until the update needs them (agentcap.old_policy)
    utility: float | None = None
    advantage: float = 0.0


@dataclass
class RolloutBatch:
    episodes: list[Episode]
    scores: list[Score]
    spans: list[Span]
    generate_calls: dict[str, int] = field(default_factory=dict)
    turns: list[int] = field(default_factory=list)

    def spans_of(self, agent: str) -> list[Span]:
        return [s for s in self.spans if s.agent == agent and s.utility is not None]


class RolloutDriver:
    """Owns a pool of environments and the agents that act in them."""

    def __init__(
        self,
        make_env: Callable[[], CaptionEnv],
        agents: Mapping[str, Agent],
        generation_batch_size: int = 64,
        max_turns: int = 64,
    ):
        self.make_env = make_env
        self.agents = agents
        self.generation_batch_size = generation_batch_size
        self.max_turns = max_turns
        self.envs: list[CaptionEnv] = []

    def _pool(self, n: int) -> list[CaptionEnv]:
        while len(self.envs) < n:
            self.envs.append(self.make_env())
        return self.envs[:n]

    @property
    def scorer(self) -> CaptionEnv:
        return self._pool(1)[0]

    def run(
        self,
        indices: Sequence[int] | None = None,
        group_size: int = 1,
        greedy: bool = False,
        seed: int | None = None,
        items: Sequence[dict[str, Any]] | None = None,
        sample_agents: set[str] | None = None,
        old_logprobs: bool = True,
    ) -> RolloutBatch:
        """Roll out every item ``group_size`` times; ``items`` replaces dataset indices (inference).

        Agents in ``sample_agents`` sample (default: all unless ``greedy``); the others decode greedily,
        so a frozen role answers the same state the same way in every rollout of a group. Without
        ``old_logprobs`` the spans carry none (GRPO computes them only when off-policy).
        """
        keys = list(items) if items is not None else list(indices or [])
        n = len(keys) * group_size
        envs = self._pool(n)
        observations: list[dict[str, Any]] = []
        for t in range(n):
            key, group = keys[t // group_size], t // group_size
            options = {"item": key, "group": group} if items is not None else {"index": int(key), "group": group}
            obs, _ = envs[t].reset(seed=None if seed is None else seed + t, options=options)
            observations.append(obs)
        spans: list[Span] = []
        calls: dict[str, int] = defaultdict(int)
        turns = [0] * n
        active = list(range(n))
        for _ in range(self.max_turns):
            if not active:
                break
            waiting: dict[str, list[int]] = defaultdict(list)
            for t in active:
                waiting[observations[t]["agent"]].append(t)
            finished: set[int] = set()
            for name, trajectories in waiting.items():
                agent = self._agent(name)
                samples = not greedy and (sample_agents is None or name in sample_agents)
                extra = {} if old_logprobs else {"old_logprobs": False}  # agents without the option still work
                generations = agent.generate(
                    [observations[t] for t in trajectories], greedy=not samples, batch_size=self.generation_batch_size,
                    **extra,
                )
                calls[name] += -(-len(trajectories) // self.generation_batch_size)
                for t, gen in zip(trajectories, generations):
                    env = envs[t].unwrapped
                    action_index = len(env.episode.actions)
                    obs, _, terminated, truncated, info = envs[t].step(gen.text)
                    spans.append(
                        Span(
                            agent=name,
                            kind=info["action_kind"],
                            trajectory=t,
                            group=t // group_size,
                            action_index=action_index,
                            observation=observations[t],
                            text=gen.text,
                            completion_ids=gen.completion_ids,
                            old_logprobs=gen.old_logprobs,
                        )
                    )
                    turns[t] += 1
                    if terminated or truncated:
                        finished.add(t)
                    else:
                        observations[t] = obs
            active = [t for t in active if t not in finished]
        if active:
            raise RuntimeError(f"{len(active)} episodes still running after max_turns={self.max_turns}")
        episodes = [envs[t].unwrapped.episode for t in range(n)]
        scores = self.scorer.unwrapped.score(episodes)
        for span in spans:
            utilities = scores[span.trajectory].utilities
            span.utility = utilities[span.action_index] if span.action_index < len(utilities) else None
        return RolloutBatch(episodes=episodes, scores=scores, spans=spans, generate_calls=dict(calls), turns=turns)

    def _agent(self, name: str) -> Agent:
        if name not in self.agents:
            raise KeyError(
                f"the environment asks agent {name!r} to act, but only {sorted(self.agents)} are configured "
                f"(add `agents.{name}` to the config)"
            )
        return self.agents[name]
