"""Off-policy correction between the sampler (vLLM) and the learner.

A vLLM engine and the learner compute the same policy with different kernels and precision, so
the log-probs the actions were sampled with (π_sampler) differ slightly from the learner's at
sampling time (π_old). Truncated importance sampling (TIS, as TRL and verl offer it) reweights
each token of the clipped objective by w = min(π_old / π_sampler, C), detached, which makes the
gradient that of the learner's policy again while the cap C bounds its variance. Off by default
(``tis_cap: null``); with the HF backend π_sampler = π_old and w = 1.
"""

from __future__ import annotations

import torch


def truncated_importance_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """w_{i,t} = min(exp(log π_old − log π_sampler), cap) on kept tokens, 0 elsewhere: [N, T]."""
    if cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {cap}")
    keep = mask.bool()
    diff = torch.where(keep, old_logprobs - sampler_logprobs, torch.zeros_like(old_logprobs))
    return torch.where(keep, torch.exp(diff).clamp(max=cap), torch.zeros_like(diff)).detach()


def sampler_gap(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean and max |log π_old − log π_sampler| over kept tokens (logged per update)."""
    keep = mask.bool()
    if not keep.any():
        return {"sampler_gap_mean": 0.0, "sampler_gap_max": 0.0}
    gap = (old_logprobs - sampler_logprobs).abs()[keep]
    return {"sampler_gap_mean": float(gap.mean()), "sampler_gap_max": float(gap.max())}
