"""Checks a user can run on their own environment before training on it.

``check_env`` runs Gymnasium's env checker (which our text spaces pass) and then what agentcap
itself relies on: seeded resets repeat, every episode ends within ``max_steps``, the utilities at
termination line up with the episode's actions, and deferred batched scoring equals per-episode
scoring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from agentcap.core.env import CaptionEnv


def rollout(env: gym.Env, policy: Callable[[dict[str, Any]], str], seed: int, max_steps: int, options=None):
    """Run one episode; returns (observations, actions, final info, rewards)."""
    obs, _ = env.reset(seed=seed, options=options)
    observations, actions, rewards = [obs], [], []
    for _ in range(max_steps):
        action = policy(obs)
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return observations, actions, info, rewards
        observations.append(obs)
    raise AssertionError(f"episode did not end within max_steps={max_steps}")


def check_env(env: gym.Env, policy: Callable[[dict[str, Any]], str] | None = None, seed: int = 0, max_steps: int = 64):
    """Raise ``AssertionError`` naming the broken contract; see the module docstring."""
    base = env.unwrapped
    assert isinstance(base, CaptionEnv), f"{type(base).__name__} must subclass agentcap.CaptionEnv"
    gymnasium_check_env(base, skip_render_check=True)
    space = env.action_space
    space.seed(seed)
    policy = policy or (lambda _obs: space.sample())
    options = {"index": 0, "group": 0}

    first = rollout(env, policy, seed, max_steps, options)
    space.seed(seed)
    again = rollout(env, policy, seed, max_steps, options)
    assert first[1] == again[1], "the same seed and policy must give the same actions"
    for a, b in zip(first[0], again[0]):
        assert a["agent"] == b["agent"] and a["messages"] == b["messages"], "seeded resets must repeat"
        for key in a["media"]:
            np.testing.assert_array_equal(a["media"][key], b["media"][key])

    observations, actions, info, rewards = first
    for obs in observations:
        assert env.observation_space.contains(obs), f"observation outside the observation space: {obs!r:.200}"
    episode = info["episode"]
    assert len(episode.actions) == len(actions), "every step must record exactly one action"
    assert len(info["utilities"]) == len(episode.actions), "one utility (or None) per action"
    assert np.isfinite(rewards[-1]), f"non-finite reward {rewards[-1]}"

    scored = base.score([episode, episode])
    assert len(scored) == 2 and scored[0].reward == scored[1].reward == rewards[-1], (
        "batched score() must equal the reward step() returned"
    )
    # under grpo_fsdp a process with no episode still scores, so a sharded judge's passes stay in step
    assert list(base.score([])) == [], "score([]) must return [] (and still ask its judges, if any)"
    return info
