"""Which vLLM engines stay awake in each stage, and how deeply the others sleep.

Colocated engines share the device with the learner, and an engine its stage does not use only
takes memory the update needs. When a stage begins (``GRPOModule._begin_stage``), :func:`begin_stage`
puts to sleep every engine whose role does not act in the stage:

- level 2 (weights discarded) for the engine of the agent the stage trains: its weights are
  re-synced before its next generate anyway;
- level 1 (weights kept in host memory) for a frozen agent's engine that a later stage uses again
  before that agent trains;
- level 2 for any other: no later stage needs its weights as they are (a sync from the learner
  restores them if one ever generates with it).

The engines of the roles that act stay awake for the whole stage, rollouts and updates alike (what
``agentcap plan`` counts). A sleeping engine wakes before its first generate, and after level 2 it
re-syncs first (``backends.vllm``), so nothing is ever synced into a sleeping engine. An adapter
engine sleeps at level 1 at most (its base never changes). Engines not built yet, HF backends and
engines without ``enable_sleep_mode`` are left as they are. Roles that share a base share one
engine (an adapter each): it sleeps only when none of them acts.

The roles that act in a stage: none in an SFT stage (it never generates); in a GRPO or evaluate
stage, those the environment names for its settings (``acting_roles(**kwargs)`` on the environment
class: ACE-Cap's ``captioner`` mode is the Captioner alone, its ``game`` every role), else every
agent; a GRPO stage's own agent always. A stage's harvest rollout runs before this call, with
whatever engines are awake or woken on demand.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from agentcap.core.registry import load_env_plugins
from agentcap.core.schedule import Stage
from agentcap.rollout.splits import EnvConfig


def env_class(env_id: str):
    """The registered class (or factory) of ``env_id``, without making an environment."""
    load_env_plugins()
    entry = gym.spec(env_id.rpartition(":")[2]).entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def acting_roles(stage: Stage, env: EnvConfig, agents: Collection[str]) -> set[str]:
    """The roles whose engines generate in ``stage``."""
    if stage.kind == "sft":
        return set()
    split = "train" if stage.kind == "grpo" else stage.split
    kwargs = {**env.kwargs, **getattr(env, split), **stage.env}
    declared = getattr(env_class(env.id), "acting_roles", None)
    roles = set(agents) if declared is None else set(declared(**kwargs)) & set(agents)
    if stage.kind == "grpo":
        roles.add(stage.agent)
    return roles


def sleep_levels(
    stages: Sequence[Stage], index: int, uses: Sequence[set[str]], roles: Collection[str]
) -> dict[str, int]:
    """Per role in stage ``index``: 0 (its engine acts: awake), else the level it sleeps at."""
    levels: dict[str, int] = {}
    for role in roles:
        if role in uses[index]:
            levels[role] = 0
            continue
        levels[role] = 2
        if stages[index].agent == role:
            continue  # trains now: its engine's weights are stale
        for later, used in zip(stages[index + 1 :], uses[index + 1 :]):
            if later.agent == role and later.kind != "evaluate":
                break  # it trains before any use: re-synced anyway
            if role in used:
                levels[role] = 1
                break
    return levels


def begin_stage(agents: Mapping[str, object], stages: Sequence[Stage], index: int, env: EnvConfig) -> dict[str, int]:
    """Put every engine stage ``index`` does not use to sleep; returns the levels asked for."""
    uses = [acting_roles(stage, env, agents) for stage in stages]
    levels = sleep_levels(stages, index, uses, list(agents))
    # roles on a shared base share one engine: it sleeps only when none of them acts, at the lightest level
    engines: dict[int, tuple[object, int]] = {}
    for name, level in levels.items():
        backend = agents[name].backend
        key = id(getattr(backend, "shared", backend))
        engines[key] = (engines[key][0], min(engines[key][1], level)) if key in engines else (backend, level)
    for backend, level in engines.values():
        sleep = getattr(backend, "sleep", None)
        if level and sleep is not None:
            sleep(level)
    return levels
