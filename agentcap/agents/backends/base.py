"""What a generation backend is (:class:`Backend`), what it returns (one
:class:`~agentcap.agents.generation.Generation` per observation, token ids and the sampler's
log-probs filled in) and the vLLM engine's options (:class:`VLLMOptions`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from agentcap.agents.generation import Generation


@dataclass
class ServedOptions:
    """The ``vllm serve`` processes of an agent whose ``backend`` is ``served``
    (``agentcap.agents.backends.served``; docs/vllm.md, "Engines in processes of their own").

    Args:
        urls: the servers' ``/v1`` URLs (``http://HOST:PORT/v1``); rollouts are spread over them.
        start: servers agentcap starts itself on loopback (``urls`` empty), one engine each.
        model: the name the servers serve the base under (``--served-model-name``); default: the
            agent's ``model`` as written in the config.
        folder: a folder this trainer writes and every server reads (adapter and full-weight
            versions); default: a temporary folder on this host (loopback servers only).
        timeout: seconds per request (a generation of a whole batch included), then retries.
        retries: further attempts after a failed request.
        backoff: seconds before the first retry, doubled each time.
        batch_size: requests in flight per server.
        api_key: sent as a bearer token when set.
        python: the interpreter that runs the servers agentcap starts (one with vLLM); default: this one.
        start_timeout: seconds a started server may take to answer.
    """

    urls: list[str] = field(default_factory=list)
    start: int = 0
    model: str | None = None
    folder: str | None = None
    timeout: float = 300.0
    retries: int = 1
    backoff: float = 1.0
    batch_size: int = 64
    api_key: str | None = None
    python: str | None = None
    start_timeout: float = 900.0


@dataclass
class VLLMOptions:
    """The vLLM engine of an agent whose ``backend`` is ``vllm`` (one engine per process).

    Args:
        gpu_memory_utilization: vLLM: fraction of the accelerator's memory the engine may take.
        tensor_parallel_size: vLLM: GPUs one engine spans.
        max_model_len: vLLM: longest prompt + completion (None: the model's limit).
        enable_sleep_mode: vLLM on GPU: an engine its stage does not use sleeps, freeing its
            device memory (``LLM.sleep`` / ``wake_up``; ``agentcap.training.engines``). Not on
            vLLM's CPU build, which refuses it.
        dtype: vLLM engine dtype (``auto``: the learner's, so sampler and learner log-probs agree).
        enforce_eager: vLLM: no CUDA graphs (slower decode, faster start).
        seed: vLLM sampling seed.
        served: where the engines are when ``backend`` is ``served`` (:class:`ServedOptions`).
        sync_tolerance: largest max |Δ log p| between engine and learner on the probe after a
            sync (``backends.verify``); None: by engine dtype (fp32 1e-3, bf16 0.5, fp16 0.25).
    """

    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    enable_sleep_mode: bool = False
    dtype: str = "auto"
    enforce_eager: bool = False
    seed: int = 0
    sync_tolerance: float | None = None
    served: ServedOptions = field(default_factory=ServedOptions)

    def __post_init__(self):
        if isinstance(self.served, dict):
            known = {f.name for f in fields(ServedOptions)}
            unknown = sorted(set(self.served) - known)
            if unknown:
                raise ValueError(f"vllm.served: unknown option(s) {unknown}; known: {sorted(known)}")
            self.served = ServedOptions(**self.served)


class Backend(Protocol):
    def sample(
        self, observations: Sequence[dict[str, Any]], inputs: dict[str, Any], greedy: bool, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Completions for ``observations`` (``inputs``: the family's encoding of them): token ids and
        the sampler's log-probs (``None`` when the sampler is the learner itself); ``seeds``, one per
        row, make each row's sample independent of its batch and rank."""

    def weights_changed(self) -> None:
        """The learner's weights changed (an optimiser step, a loaded checkpoint): a sampler with
        weights of its own syncs before it next samples; one that reads the learner's does nothing."""

    def sync(self) -> None:
        """Bring the sampler's weights up to the learner's."""
