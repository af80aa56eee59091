"""agentcap: captioning agents trained with reinforcement learning.

The public API, imported on first use so that ``import agentcap`` stays light. The built-in
environments register through the ``gymnasium.envs`` entry point (``agentcap_envs``), not as a side
effect of this import.
"""

from agentcap._lazy import lazy_exports

# resolved on first use: see agentcap._lazy
EXPORTS = {
    "CaptionEnv": "agentcap.core.env",
    "Action": "agentcap.core.episode",
    "Episode": "agentcap.core.episode",
    "Score": "agentcap.core.episode",
    "check_env": "agentcap.core.check",
    "GRPOModule": "agentcap.training.module",
    "Stage": "agentcap.core.schedule",
    "EnvConfig": "agentcap.rollout.splits",
    "RolloutDriver": "agentcap.rollout.driver",
    "Agent": "agentcap.agents.agent",
    "AgentConfig": "agentcap.agents.agent",
}

__all__ = sorted(EXPORTS)
__version__ = "0.1.0"
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
