"""Generation backends: who samples an agent's actions.

``hf`` runs the agent's own model through HF ``generate`` (default, runs everywhere); ``vllm``
samples with a vLLM engine (optional extra) whose weights follow the learner through
:meth:`Backend.sync`. Both return, per observation, the completion token ids and the log-probs
the sampler drew them with; the agent then recomputes the learner's log-probs itself, so the
clipped objective's old policy is always the learner's, and the sampler's log-probs serve the
off-policy correction (``agentcap.algorithms.offpolicy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class VLLMOptions:
    """The vLLM engine of an agent whose ``backend`` is ``vllm`` (one engine per process).

    Args:
        gpu_memory_utilization: vLLM: fraction of the accelerator's memory the engine may take.
        tensor_parallel_size: vLLM: GPUs one engine spans.
        max_model_len: vLLM: longest prompt + completion (None: the model's limit).
        enable_sleep_mode: vLLM on GPU: free the engine's weights and KV cache between rollouts,
            so the update has the memory (``LLM.sleep`` / ``wake_up``).
        dtype: vLLM engine dtype (``auto``: the learner's, so sampler and learner log-probs agree).
        enforce_eager: vLLM: no CUDA graphs (slower decode, faster start).
        seed: vLLM sampling seed.
    """

    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    enable_sleep_mode: bool = False
    dtype: str = "auto"
    enforce_eager: bool = False
    seed: int = 0


@dataclass
class Sampled:
    """One sampled completion: token ids (up to and including EOS) and the sampler's log-probs."""

    completion_ids: torch.Tensor  # [T]
    sampler_logprobs: torch.Tensor | None  # [T]; None when the sampler is the learner itself


class Backend(Protocol):
    def sample(
        self, observations: Sequence[dict[str, Any]], inputs: dict[str, Any], greedy: bool, seeds: Sequence[int] | None = None
    ) -> list[Sampled]:
        """Completions for ``observations`` (``inputs``: the family's encoding of them); ``seeds``, one
        per row, make each row's sample independent of its batch and rank."""

    #: The learner's weights changed since the sampler last took them (an optimiser step, a loaded
    #: checkpoint); a sampler with weights of its own syncs before it next samples.
    stale: bool

    def sync(self) -> None:
        """Bring the sampler's weights up to the learner's."""


def build_backend(
    agent, backend: str = "hf", options: VLLMOptions | None = None, model_path: str | None = None, where: str = "agent"
) -> Backend:
    """``where`` names the config entry in errors (``agents.policy``)."""
    if backend == "hf":
        from agentcap.agents.backends.hf import HFBackend

        return HFBackend(agent)
    if backend == "vllm":
        from agentcap.agents.backends.vllm import VLLMBackend

        return VLLMBackend(agent, options or VLLMOptions(), model_path, where)
    raise ValueError(f"{where}.backend: {backend!r} is not one of hf, vllm")


__all__ = ["Backend", "VLLMOptions", "Sampled", "build_backend"]
