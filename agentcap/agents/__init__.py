"""Agents: roles bound to models, and the model families they load through."""

import importlib

# Re-exported on first use: a submodule importing a sibling runs this file, so it imports none of them.
_LAZY = {
    **dict.fromkeys(["Agent", "AgentConfig", "MissingWeightsError", "build_agent"], "agentcap.agents.agent"),
    "Generation": "agentcap.agents.generation",
    "build_word_tokenizer": "agentcap.agents.tokenizer",
    "ToyConfig": "agentcap.agents.toy",
    "ToyMediaLM": "agentcap.agents.toy",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
