"""Built-in environments. This file only registers them; each lives in its own module."""

from gymnasium.envs.registration import register, registry

_BUILTIN = {
    "agentcap/ADClip-v0": "agentcap_envs.ad_clip:ADClipEnv",
    "agentcap/ClozeCaption-v0": "agentcap_envs.cloze_caption:ClozeCaptionEnv",
    "agentcap/EvidenceGame-v0": "agentcap_envs.evidence_game:EvidenceGameEnv",
}

for _id, _entry in _BUILTIN.items():
    if _id not in registry:
        register(id=_id, entry_point=_entry, disable_env_checker=True)
