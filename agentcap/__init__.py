"""agentcap: captioning agents trained with reinforcement learning.

The public API, imported on first use so that ``import agentcap`` stays light. The built-in
environments register through the ``gymnasium.envs`` entry point (``agentcap_envs``), not as a side
effect of this import.
"""

import importlib

_LAZY = {
    "CaptionEnv": "agentcap.core.env",
    "Action": "agentcap.core.episode",
    "Episode": "agentcap.core.episode",
    "Score": "agentcap.core.episode",
    "check_env": "agentcap.core.check",
    "GRPOModule": "agentcap.training.module",
    "Stage": "agentcap.training.schedule",
    "EnvConfig": "agentcap.rollout.splits",
    "RolloutDriver": "agentcap.rollout.driver",
    "Agent": "agentcap.agents.agent",
    "AgentConfig": "agentcap.agents.agent",
}

__all__ = list(_LAZY)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentcap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
