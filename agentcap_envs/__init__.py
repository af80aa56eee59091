"""Built-in environments. This file only registers them; each lives in its own module.

Registered by the ``gymnasium.envs`` entry point (:func:`register_envs`, which agentcap calls through
``agentcap.core.registry``) or by importing this package.
"""

from gymnasium.envs.registration import register, registry

BUILTIN = {
    "agentcap/ADClip-v0": "agentcap_envs.ad_clip:ADClipEnv",
    "agentcap/ClozeCaption-v0": "agentcap_envs.cloze_caption:ClozeCaptionEnv",
    "agentcap/EvidenceGame-v0": "agentcap_envs.evidence_game:EvidenceGameEnv",
    "agentcap/TextRewards-v0": "agentcap_envs.text_rewards:TextRewardsEnv",
}


def register_envs() -> None:
    for env_id, entry in BUILTIN.items():
        if env_id not in registry:
            register(id=env_id, entry_point=entry, disable_env_checker=True)


register_envs()
