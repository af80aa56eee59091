"""Every weight sync is checked: a sync that silently delivers nothing must stop the run.

After each sync, full or adapter, the engine scores one fixed probe (a short prompt and completion,
tokenised once through the agent's own family, so it takes the path rollouts take) and the learner
scores it too (``completion_logprobs`` at temperature 1, eval mode, no grad). Their largest
per-token difference must stay within ``vllm.sync_tolerance``, or :class:`WeightSyncError` names
the agent, the sync version, the gap and the tolerance. One request of about 30 tokens per sync.

What it catches: weights that never arrived, arrived under the wrong names, or an adapter the
engine did not apply, once the learner has moved from the engine's weights by more than the
tolerance (one optimiser step at a paper learning rate may move log-probs by less; a missed sync
then shows at a later one, as the gap accumulates).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: max |Δ log p| allowed when ``vllm.sync_tolerance`` is not set, by engine dtype. Measured on the
#: CPU build against an fp32 learner (tools/bench_sync_check.py, docs/vllm.md): fp32 engine 4e-5
#: (up to 1.7e-4 after large updates), bf16 engine 0.12; GPU kernels round differently, hence the
#: margins; fp16 keeps 3 more mantissa bits than bf16.
DEFAULT_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.25}

PROBE_PROMPT = "Describe the sound in one sentence."
PROBE_COMPLETION = "A small dog barks twice while rain falls on a metal roof."


class WeightSyncError(RuntimeError):
    """The engine's log-probs of the probe differ from the learner's after a sync."""


@dataclass
class Probe:
    """The fixed prompt + completion, as the learner's inputs and as the engine's token ids."""

    inputs: dict
    completion: torch.Tensor  # [1, T]
    mask: torch.Tensor  # [1, T]
    prompt_ids: list[int]
    completion_ids: list[int]


def make_probe(agent) -> Probe:
    observation = {"agent": agent.name, "messages": [{"role": "user", "content": PROBE_PROMPT}], "media": {}}
    inputs = agent.encode([observation])
    prompt_ids = inputs["input_ids"][0][inputs["attention_mask"][0].bool()].tolist()
    completion_ids = list(agent.tokenizer(" " + PROBE_COMPLETION, add_special_tokens=False)["input_ids"])
    completion = torch.tensor([completion_ids], dtype=torch.long, device=inputs["input_ids"].device)
    return Probe(inputs, completion, torch.ones_like(completion), prompt_ids, completion_ids)


@torch.no_grad()
def learner_logprobs(agent, probe: Probe) -> torch.Tensor:
    return agent.completion_logprobs(probe.inputs, probe.completion, probe.mask, temperature=1.0)[0].float().cpu()


def check_sync(where: str, version: int, engine: torch.Tensor, learner: torch.Tensor, tolerance: float) -> float:
    """The max |Δ log p| between engine and learner on the probe; raises past ``tolerance``."""
    gap = float((engine.float().cpu() - learner.float().cpu()).abs().max())
    if not gap <= tolerance:  # NaN fails too
        raise WeightSyncError(
            f"{where}: weight sync {version} did not reach the vLLM engine: its log-probs of the probe differ "
            f"from the learner's by {gap:.3g} (max |Δ log p| over {learner.numel()} tokens), tolerance "
            f"{tolerance:g} ({where}.vllm.sync_tolerance)"
        )
    return gap
