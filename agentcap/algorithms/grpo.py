"""GRPO: group-relative advantages and the clipped objective with a KL penalty.

Follows READ Eq. 1–2 and AudioMap Eq. 1. Departures, and why:

1. Advantages divide by ``std + eps`` (AudioMap's δ) with the population std (``std="unbiased"``
   and eps 1e-4 match TRL); a group whose rewards are all equal gets exactly zero advantage
   (never NaN), as with READ Eq. 1 in the limit.
2. The ratio is per token (AudioMap's ρ_{i,t}); READ writes it per sequence, which for a clipped
   objective is numerically fragile on long responses.
3. KL uses the k3 estimator exp(r) − r − 1 with r = log π_ref − log π_θ, unbiased and positive.
4. The loss is a weighted sum of per-token terms with weights that sum to one over the *global*
   batch (token mode: 1/ΣM, LOOP Eq. 21; sequence mode: 1/(T_i·N), AudioMap Eq. 1). Passing the
   global normaliser keeps a data-parallel run equal to a single-process one when gradients are
   summed across ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch


def group_advantages(
    rewards: torch.Tensor,
    groups: Sequence[int] | torch.Tensor,
    eps: float = 1e-6,
    std: Literal["population", "unbiased"] = "population",
):
    """A_i = (R_i − mean_g R) / (std_g R + eps) within each group g (READ Eq. 1): [N] → [N].

    A group whose rewards are all equal (or that has one member) gets exactly 0: its std is ~1e-17
    in float arithmetic, not 0, so testing ``std > 0`` would pass rounding noise through.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    groups = torch.as_tensor(groups)
    advantages = torch.zeros_like(rewards)
    for g in torch.unique(groups):
        members = groups == g
        r = rewards[members]
        if r.numel() < 2 or bool(r.max() == r.min()):
            continue
        advantages[members] = (r - r.mean()) / (r.std(unbiased=std == "unbiased") + eps)
    return advantages


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate exp(r) − r − 1, r = log π_ref − log π_θ: [N, T]."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


def token_weights(
    mask: torch.Tensor,
    normalizer: float | None = None,
    mode: Literal["token", "sequence"] = "token",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Weights over tokens that sum to one over the (global) batch: [N, T], in the log-probs' ``dtype``."""
    mask = mask.to(dtype)
    if mode == "token":
        total = float(mask.sum()) if normalizer is None else float(normalizer)
        return mask / max(total, 1.0)
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    rows = float(mask.shape[0]) if normalizer is None else float(normalizer)
    return mask / lengths / max(rows, 1.0)


def clipped_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Clipped surrogate minus β·KL, as a loss to minimise.

    Shapes: logprobs, old_logprobs, mask, ref_logprobs [N, T]; advantages [N] (one per sequence,
    GRPO) or [N, T] (span-aligned, LOOP-GRPO Eq. 18). ``weights`` [N, T] from :func:`token_weights`.
    ``importance_weights`` [N, T] (detached) reweight each token's surrogate: the off-policy
    correction of ``algorithms.offpolicy`` when a separate engine sampled the actions.
    """
    keep = mask.bool()  # [N, T]
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    advantages = torch.where(keep, advantages.to(logprobs.dtype).expand_as(logprobs), zero)
    if weights is None:
        weights = token_weights(mask, dtype=logprobs.dtype)
    weights = weights.to(logprobs.dtype)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    # masked positions are zeroed before exp(), so -inf / NaN padding never reaches the loss
    ratio = torch.exp(torch.where(keep, logprobs - old_logprobs.detach(), zero))  # ρ_{i,t}  # [N, T]
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)  # [N, T]
    if importance_weights is not None:
        surrogate = surrogate * importance_weights.detach().to(surrogate.dtype)
    pg_loss = -(surrogate * weights).sum()
    with torch.no_grad():
        was_clipped = ((ratio < 1.0 - clip_eps) & (advantages < 0)) | ((ratio > 1.0 + high) & (advantages > 0))
        clipfrac = (was_clipped.to(weights.dtype) * weights).sum()
        ratio_mean = (ratio * weights).sum()
    if beta > 0.0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs from the frozen reference model")
    if ref_logprobs is not None:  # logged whenever a reference exists, trained only when beta > 0
        # masked before exp() for the same reason as the ratio; equals kl_k3 on kept tokens
        r = torch.where(keep, ref_logprobs.detach() - logprobs, zero)
        kl = ((torch.exp(r) - r - 1.0) * weights).sum()
    else:
        kl = zero
    return {
        "loss": pg_loss + beta * kl if beta > 0.0 else pg_loss,
        "pg_loss": pg_loss.detach(),
        "kl": kl.detach(),
        "clipfrac": clipfrac,
        "ratio": ratio_mean,
    }
