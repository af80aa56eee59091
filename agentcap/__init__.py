"""agentcap: captioning agents trained with reinforcement learning.

Importing the package registers the built-in environments (``agentcap/<Name>-v0``) with Gymnasium.
"""

from agentcap.episode import Action, Episode, Score
from agentcap.env import CaptionEnv

import agentcap_envs  # noqa: F401  (registers the built-in environments)

__all__ = ["Action", "CaptionEnv", "Episode", "Score"]
__version__ = "0.1.0"
