"""Every registered environment passes the env checker and a seeded rollout."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.testing import check_env

REGISTERED = sorted(env_id for env_id in gym.registry if env_id.startswith("agentcap/"))


def test_kwargs(env_id: str, toy_movie, toy_soundscapes) -> dict:
    """Test arguments per registered id; a new environment must add itself here to be tested."""
    table = {
        "agentcap/ADClip-v0": {"manifest": str(toy_movie / "val.jsonl"), "prompt": "compact"},
        "agentcap/ClozeCaption-v0": {"manifest": str(toy_soundscapes / "val.jsonl"), "prompt": "compact"},
        "agentcap/EvidenceGame-v0": {"manifest": str(toy_soundscapes / "val.jsonl"), "prompt": "compact",
                                     "budget": 2},
        "agentcap/TextRewards-v0": {"items": [{"id": "q0", "prompt": "two plus two ?", "answer": "four"},
                                              {"id": "q1", "prompt": "the sky is ?", "answer": "blue"}],
                                    "reward_funcs": ["agentcap_envs.text_rewards:exact_match",
                                                     "agentcap_envs.text_rewards:contains_answer"]},
    }
    assert env_id in table, f"{env_id} is registered but has no test arguments in tests/test_envs.py"
    return table[env_id]


test_kwargs.__test__ = False  # a helper, not a test


def test_builtins_are_registered():
    assert {"agentcap/ADClip-v0", "agentcap/ClozeCaption-v0", "agentcap/EvidenceGame-v0"} <= set(REGISTERED)


@pytest.mark.parametrize("env_id", REGISTERED)
def test_env_checker_and_seeded_rollout(env_id, toy_movie, toy_soundscapes):
    env = gym.make(env_id, **test_kwargs(env_id, toy_movie, toy_soundscapes))
    info = check_env(env, seed=0)
    assert info["episode"].actions, "the episode recorded no action"


@pytest.mark.parametrize("env_id", REGISTERED)
def test_demonstrations_replay_as_episodes(env_id, toy_movie, toy_soundscapes):
    """Playing the supervised targets in order is a valid episode whose agents match the demos."""
    env = gym.make(env_id, **test_kwargs(env_id, toy_movie, toy_soundscapes))
    item = env.unwrapped.items[0]
    demos = env.unwrapped.demonstrations(item)
    obs, _ = env.reset(options={"index": 0})
    for demo_obs, action in demos:
        assert obs["agent"] == demo_obs["agent"]
        assert obs["messages"] == demo_obs["messages"]
        obs, reward, terminated, _, info = env.step(action)
        if terminated:
            break
    assert terminated, "the demonstrations must finish an episode"
    # the gold targets earn the task's full accuracy-like component
    gold = {"agentcap/ADClip-v0": "accuracy", "agentcap/ClozeCaption-v0": "esr", "agentcap/EvidenceGame-v0": "g2p_final",
            "agentcap/TextRewards-v0": "exact_match"}
    if env_id in gold:
        assert info["rewards"][gold[env_id]] == pytest.approx(1.0), info["rewards"]


def test_environment_pages_match_their_docstrings():
    """docs/envs/*.md are generated (tools/gen_env_docs.py); a docstring change must regenerate them."""
    from conftest import ROOT

    from agentcap.commands.envs import env_page

    for env_id in sorted(i for i in gym.registry if i.startswith("agentcap/")):
        path = ROOT / "docs" / "envs" / (env_id.split("/")[1] + ".md")
        assert path.read_text() == env_page(env_id), f"{path} is stale: run python tools/gen_env_docs.py"
