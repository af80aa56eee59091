"""agentcap: captioning agents trained with reinforcement learning.

Importing the package registers the built-in environments (``agentcap/<Name>-v0``) with Gymnasium.
The training classes are imported on first use, so ``import agentcap`` stays light for env users.
"""

import importlib

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.env import CaptionEnv
from agentcap.episode import Action, Episode, Score

_LAZY = {
    "GRPOModule": "agentcap.module",
    "EnvSpec": "agentcap.splits",
    "Stage": "agentcap.schedule",
    "Agent": "agentcap.agents",
    "AgentConfig": "agentcap.agents",
    "RolloutDriver": "agentcap.rollout",
    "check_env": "agentcap.testing",
}

__all__ = ["Action", "CaptionEnv", "Episode", "Score", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentcap' has no attribute {name!r}")
