"""Agents: roles bound to models, and the model families they load through."""

from agentcap._lazy import lazy_exports

# resolved on first use: see agentcap._lazy
EXPORTS = {
    **dict.fromkeys(["Agent", "AgentConfig", "MissingWeightsError", "build_agent"], "agentcap.agents.agent"),
    "Generation": "agentcap.agents.generation",
    "build_word_tokenizer": "agentcap.agents.tokenizer",
    "ToyConfig": "agentcap.agents.toy",
    "ToyMediaLM": "agentcap.agents.toy",
}

__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
