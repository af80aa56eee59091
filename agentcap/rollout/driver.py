"""The rollout driver: steps B items × G rollouts together, turn by turn.

At every turn the pending observations are grouped by the agent that must act and each agent
makes one batched generation call for all of them; finished trajectories drop out. Every generated
action (a :class:`~agentcap.agents.generation.Generation`) becomes a :class:`Span`, the same record
with its agent, kind and place in the rollout added; environment
text (answers of a frozen role, prompts) stays in the observations and is never trained on.
Episodes are scored once per batch with the environment's batched ``score``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcap.agents.agent import Agent
from agentcap.agents.generation import Generation
from agentcap.agents.sampling import trajectory_seed
from agentcap.core.env import CaptionEnv
from agentcap.core.episode import Episode, Score
from agentcap.judges.pool import sharded as judges_sharded
from agentcap.parallel.lockstep import Lockstep
from agentcap.rollout.credit import token_pieces


@dataclass(kw_only=True)
class Span(Generation):
    """One generated action (its text, token ids and log-probs: :class:`Generation`) as a training
    row: who took it, of which kind, where in the rollout, on which observation (the update re-scores
    it there), and the utility the environment gave it and the advantage the update trains it with."""

    agent: str
    kind: str
    trajectory: int
    group: int
    action_index: int
    observation: dict[str, Any]
    utility: float | None = None
    advantage: float = 0.0
    # per-piece credit (``Score.text_credit``): each token's piece, the pieces' utilities, and the
    # per-token advantages the update then trains with in place of ``advantage``
    pieces: list[int] | None = None
    piece_utilities: list[float] | None = None
    token_advantages: list[float] | None = None


@dataclass
class RolloutBatch:
    episodes: list[Episode]
    scores: list[Score]
    spans: list[Span]
    generate_calls: dict[str, int] = field(default_factory=dict)
    turns: list[int] = field(default_factory=list)
    trajectory_ids: list[int] = field(default_factory=list)  # global position of each trajectory

    def spans_of(self, agent: str) -> list[Span]:
        return [s for s in self.spans if s.agent == agent and s.utility is not None]


class RolloutDriver:
    """Owns a pool of environments and the agents that act in them."""

    def __init__(
        self,
        make_env: Callable[[], CaptionEnv],
        agents: Mapping[str, Agent],
        generation_batch_size: int = 64,
        max_turns: int | None = None,
    ):
        """``max_turns`` defaults to the environment's own bound (``max_actions``), else 64; a
        limit below that bound is refused when the first environment is built, not mid-rollout."""
        self.make_env = make_env
        self.agents = agents
        self.generation_batch_size = generation_batch_size
        self.requested_max_turns = max_turns
        self.max_turns = 64 if max_turns is None else max_turns
        self.envs: list[CaptionEnv] = []
        self._scoring_env: CaptionEnv | None = None  # score() of a batch played by another thread

    def _pool(self, n: int) -> list[CaptionEnv]:
        while len(self.envs) < n:
            self.envs.append(self.make_env())
            if len(self.envs) == 1:
                self._set_max_turns(self.envs[0].unwrapped)
        return self.envs[:n]

    def _set_max_turns(self, env: CaptionEnv) -> None:
        bound = getattr(env, "max_actions", None)
        if bound is None:
            return
        if self.requested_max_turns is None:
            self.max_turns = bound
        elif self.requested_max_turns < bound:
            raise ValueError(
                f"max_turns={self.requested_max_turns} is below {type(env).__name__}'s own bound of "
                f"{bound} actions per episode; raise max_turns or leave it unset"
            )

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
        positions: Sequence[int] | None = None,
        old_logprobs: bool = True,
        stand_ins: Mapping[str, Agent] | None = None,
        collectives: bool = True,
    ) -> RolloutBatch:
        """Roll out every item ``group_size`` times; ``items`` replaces dataset indices (inference).

        Agents in ``sample_agents`` sample (default: all unless ``greedy``); the others decode greedily,
        so a frozen role answers the same state the same way in every rollout of a group.
        ``positions`` are the items' places in the global batch (default 0, 1, …): with ``seed``,
        trajectory ``positions[i] * group_size + g`` samples from its own seed at every turn, so any
        split of a global batch over processes rolls out the same trajectories. Without
        ``old_logprobs`` the spans carry none (GRPO computes them only when off-policy).
        ``stand_ins`` act in place of the agents they name (a sampler copy of a trainable agent,
        ``agentcap.rollout.pipeline``); spans keep the role's name.
        Without ``collectives`` the rollout talks to no other process (a rollout thread's under
        ``grpo_fsdp``, every agent sampling through its own engine): no lock-step calls, and the
        episodes are left unscored, for :meth:`score` in the main thread.
        """
        keys = list(items) if items is not None else list(indices or [])
        n = len(keys) * group_size
        places = list(positions) if positions is not None else list(range(len(keys)))
        ids = [places[t // group_size] * group_size + t % group_size for t in range(n)]
        envs = self._pool(n)
        observations: list[dict[str, Any]] = []
        for t in range(n):
            key, group = keys[t // group_size], t // group_size
            options = {"item": key, "group": group} if items is not None else {"index": int(key), "group": group}
            obs, _ = envs[t].reset(seed=None if seed is None else seed + ids[t], options=options)
            observations.append(obs)
        spans: list[Span] = []
        calls: dict[str, int] = defaultdict(int)
        turns = [0] * n
        active = list(range(n))
        lockstep = Lockstep(self.agents if collectives else {})  # sharded agents: every process calls them equally often
        for _ in range(self.max_turns):
            if not lockstep.anyone_running(bool(active)):
                break
            waiting: dict[str, list[int]] = defaultdict(list)
            for t in active:
                waiting[observations[t]["agent"]].append(t)
            finished: set[int] = set()
            for name, trajectories, stand_in_calls, stand_in in lockstep.turn(
                waiting, observations, self.generation_batch_size
            ):
                agent = (stand_ins or {}).get(name) or self._agent(name)
                samples = not greedy and (sample_agents is None or name in sample_agents)
                seeds = None if seed is None else [trajectory_seed(seed, ids[t], turns[t]) for t in trajectories]
                extra = {} if old_logprobs else {"old_logprobs": False}  # agents without the option still work
                generations = agent.generate(
                    [observations[t] for t in trajectories], greedy=not samples, batch_size=self.generation_batch_size,
                    seeds=seeds, **extra,
                ) if trajectories else []
                for _ in range(stand_in_calls):  # discarded: keeps this process in step with the others
                    agent.generate([stand_in], greedy=True, batch_size=1, **extra)  # the same passes as a real call
                calls[name] += -(-len(trajectories) // self.generation_batch_size)
                for t, gen in zip(trajectories, generations):
                    env = envs[t].unwrapped
                    action_index = len(env.episode.actions)
                    obs, _, terminated, truncated, info = envs[t].step(gen.text)
                    spans.append(
                        Span(
                            **vars(gen),  # the Generation's fields
                            agent=name,
                            kind=info["action_kind"],
                            trajectory=t,
                            group=t // group_size,
                            action_index=action_index,
                            observation=observations[t],
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
        batch = RolloutBatch(episodes=episodes, scores=[], spans=spans, generate_calls=dict(calls), turns=turns,
                             trajectory_ids=ids)
        return self.score(batch, self.scorer) if collectives else batch

    def score(self, batch: RolloutBatch, scorer: CaptionEnv | None = None) -> RolloutBatch:
        """Score ``batch``'s episodes with the environment's batched ``score`` and give each span its
        utility. Without ``scorer``, an environment of its own (not the pool's: a rollout thread may be
        playing the next batch in those meanwhile)."""
        if scorer is None:
            if self._scoring_env is None:
                self._scoring_env = self.make_env()
            scorer = self._scoring_env
        # a process with no episode still scores when judges are sharded: each judge call is a collective
        scores = scorer.unwrapped.score(batch.episodes) if batch.episodes or judges_sharded() else []
        for span in batch.spans:
            utilities = scores[span.trajectory].utilities
            span.utility = utilities[span.action_index] if span.action_index < len(utilities) else None
            credit = scores[span.trajectory].text_credit
            credit = credit[span.action_index] if span.action_index < len(credit) else None
            if credit and span.utility is not None:
                ends, span.piece_utilities = [e for e, _ in credit], [float(u) for _, u in credit]
                span.pieces = token_pieces(self._agent(span.agent).tokenizer, span.completion_ids, span.text, ends)
        batch.scores = scores
        return batch

    def _agent(self, name: str) -> Agent:
        if name not in self.agents:
            raise KeyError(
                f"the environment asks agent {name!r} to act, but only {sorted(self.agents)} are configured "
                f"(add `agents.{name}` to the config)"
            )
        return self.agents[name]
