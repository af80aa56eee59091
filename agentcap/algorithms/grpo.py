"""GRPO's clipped objective with a KL penalty (READ Eq. 2, AudioMap Eq. 1, LOOP-GRPO Eq. 19–21).

The advantages it takes come from :func:`agentcap.algorithms.loop.normalize_by_type` (READ Eq. 1,
LOOP-GRPO Eq. 17), one per row: each trained span is its own row, so LOOP-GRPO's token advantage
(Eq. 18) is the row's advantage broadcast over its tokens. Departures, and why:

1. The ratio is per token (AudioMap's ρ_{i,t}); READ writes it per sequence, which for a clipped
   objective is numerically fragile on long responses.
2. KL uses the k3 estimator exp(r) − r − 1 with r = log π_ref − log π_θ, unbiased and positive
   (LOOP Eq. 21 leaves the estimator open), weighted like the policy term.
3. The loss is a weighted sum of per-token terms with weights that sum to one over the *global*
   batch (token mode: 1/ΣM, LOOP Eq. 21; sequence mode: 1/(T_i·N), AudioMap Eq. 1). Passing the
   global normaliser keeps a data-parallel run equal to a single-process one when gradients are
   summed across ranks.
4. Masked positions are removed with ``torch.where`` before ``exp``, so padding that carries -inf
   or NaN log-probs cannot poison the loss or its gradient (M · NaN would).
5. The clip fraction (a log, not part of the objective) counts the weighted tokens whose gradient
   clipping removes: ρ > 1 + ε with A > 0, or ρ < 1 − ε with A < 0. Tokens with A = 0 never count.
"""

from __future__ import annotations

from typing import Literal

import torch


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate exp(r) − r − 1, r = log π_ref − log π_θ: [N, T].

    With ``mask``, r is set to 0 on masked positions before ``exp`` (their estimate is exactly 0).
    """
    r = ref_logprobs - logprobs
    if mask is not None:
        r = torch.where(mask.bool(), r, r.new_zeros(()))
    return torch.exp(r) - r - 1.0


def token_weights(
    mask: torch.Tensor,
    normalizer: float | None = None,
    mode: Literal["token", "sequence"] = "token",
    dtype: torch.dtype = torch.float32,
    on: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weights over tokens that sum to one over the (global) batch: [N, T], in the log-probs' ``dtype``.

    ``on`` puts the weight a ``mask`` token gets in its row on other tokens instead (default: ``mask``):
    the greedily written numbers' KL weighs each number like a trained token of its row.
    """
    mask = mask.to(dtype)
    on = mask if on is None else on.to(dtype)
    if mode == "token":
        total = float(mask.sum()) if normalizer is None else float(normalizer)
        return on / max(total, 1.0)
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    rows = float(mask.shape[0]) if normalizer is None else float(normalizer)
    return on / lengths / max(rows, 1.0)


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

    Shapes: logprobs, old_logprobs, mask, ref_logprobs [N, T]; advantages [N], one per row (a
    response, GRPO; a span, LOOP-GRPO, whose Eq. 18 gives every token of the span the span's
    advantage), or [N, T], one per token (per-sentence credit, ``Score.text_credit``).
    ``weights`` [N, T] from :func:`token_weights`.
    ``importance_weights`` [N, T] (detached) reweight each token's surrogate: the off-policy
    correction of ``algorithms.offpolicy`` when a separate engine sampled the actions.
    """
    keep = mask.bool()  # [N, T]
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    elif advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be [N], one per row, or [N, T], one per token, for log-probs of shape "
            f"{tuple(logprobs.shape)}; got shape {tuple(advantages.shape)}"
        )
    advantages = torch.where(keep, advantages.to(logprobs.dtype), zero)
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
        kl = (kl_k3(logprobs, ref_logprobs.detach(), keep) * weights).sum()  # masked before exp(), as the ratio
    else:
        kl = zero
    return {
        "loss": pg_loss + beta * kl if beta > 0.0 else pg_loss,
        "pg_loss": pg_loss.detach(),
        "kl": kl.detach(),
        "clipfrac": clipfrac,
        "ratio": ratio_mean,
    }
