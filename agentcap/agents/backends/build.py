"""Building an agent's backend by name (``hf``, ``vllm`` or ``served``)."""

from __future__ import annotations

from agentcap.agents.backends.base import Backend, VLLMOptions
from agentcap.agents.backends.hf import HFBackend
from agentcap.agents.backends.served import ServedBackend
from agentcap.agents.backends.vllm import VLLMBackend  # vllm itself loads when an engine is built


def build_backend(
    agent, backend: str = "hf", options: VLLMOptions | None = None, model_path: str | None = None, where: str = "agent",
    share: Backend | None = None,
) -> Backend:
    """``where`` names the config entry in errors (``agents.policy``); ``share``: the vLLM backend of
    the role whose base this one shares (one engine for both)."""
    if backend == "hf":
        return HFBackend(agent)
    if backend == "vllm":
        return VLLMBackend(agent, options or VLLMOptions(), model_path, where, share=share)
    if backend == "served":  # roles that share a base are adapters of their own on the same servers
        return ServedBackend(agent, options or VLLMOptions(), model_path, where)
    raise ValueError(f"{where}.backend: {backend!r} is not one of hf, vllm, served")
