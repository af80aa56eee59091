"""Tiny agents of the real architecture classes for tests: ``from tiny_agents import tiny_agent``.

The models come from :func:`agentcap.agents.tiny.build_tiny` (real HF classes and processors, random
weights, built offline); this wraps them in a ready :class:`agentcap.agents.agent.Agent`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentcap.agents.agent import Agent
from agentcap.agents.tiny import build_tiny


def tiny_agent(kind: str, name: str = "policy", texts: Sequence[str] = (), seed: int = 0, **agent_kwargs: Any) -> Agent:
    """An agent around ``build_tiny(kind)`` (frozen until ``set_trainable``); ``max_new_tokens`` 8 unless given."""
    parts = build_tiny(kind, texts=texts, seed=seed)
    agent_kwargs.setdefault("max_new_tokens", 8)
    return Agent(name, parts.model, parts.tokenizer, family=parts.family, processor=parts.processor, **agent_kwargs)
