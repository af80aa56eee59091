"""Off-policy correction between the sampler (vLLM) and the learner.

A vLLM engine and the learner compute the same policy with different kernels and precision, so
the log-probs the actions were sampled with (π_sampler) differ slightly from the learner's at
sampling time (π_old). Truncated importance sampling (TIS, as TRL and verl offer it) reweights
each token of the clipped objective by w = min(π_old / π_sampler, C), detached, which makes the
gradient that of the learner's policy again while the cap C bounds its variance. Off by default
(``tis_cap: null``); with the HF backend π_sampler = π_old and w = 1.

Stale rollouts (``max_staleness`` K ≥ 1, ``agentcap.rollout.pipeline``) are the same correction with a
larger gap: π_sampler is the policy of up to K optimiser steps ago, π_old the learner's at the update
(the "proximal" policy of decoupled PPO), so the clipped ratio stays anchored at the current policy and
w carries the staleness. They need a cap: with ``tis_cap: null`` they get :data:`STALE_TIS_CAP`.
"""

from __future__ import annotations

import torch

#: The truncation used for stale rollouts when ``tis_cap`` is not set: w = min(π_old / π_sampler, 2).
STALE_TIS_CAP = 2.0


def effective_tis_cap(tis_cap: float | None, max_staleness: int) -> float | None:
    """``tis_cap`` as given, or :data:`STALE_TIS_CAP` when rollouts run ahead (K ≥ 1) and none is given."""
    return STALE_TIS_CAP if tis_cap is None and max_staleness > 0 else tis_cap


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
