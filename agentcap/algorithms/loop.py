"""LOOP-GRPO credit assignment (ACE-Cap, "LOOP-GRPO", Eq. 17-21) as pure functions.

The environment scores the evidence and hands over raw utilities per action (Eq. 12-16, 22, 23:
``agentcap.rewards.evidence``); this room turns them into advantages and a loss:

1. ``normalize_by_type(utilities, kinds, groups, eps)`` -> A(xi) within each (group, kind) set
   Xi_tau (Eq. 17). With one kind per group this *is* plain GRPO (READ Eq. 1), so the Captioner
   (Eq. 22) and Instruct (Eq. 23, group = one replayed prompt) use the same function.
2. ``token_advantages`` (Eq. 18) when several spans share one token row; ``loop_loss`` (Eq. 19-21).

Nothing here touches a model: scores come in as floats, log-probs as tensors.

Departures from the paper, and why:

- Eq. 17 does not say which standard deviation; we use the population std (divide by |Xi_tau|),
  the one that makes a two-element set map to +-1 (``std="unbiased"`` divides by |Xi_tau| - 1, as
  TRL does). A set with one element, or whose utilities are all equal, gets exactly zero
  advantage: the formula gives ~0 there too, but float noise in u - mu divided by eps_norm could
  otherwise turn into a spurious O(1e-10 / 1e-6) signal. ``None`` utilities (actions not trained
  in this phase) are left out of the statistics and get 0.
- Eq. 21 leaves the KL estimator open; we use k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased,
  non-negative), averaged over the same mask M as the policy term.
- The paper does not define a clip fraction (it is a log, not part of the objective). Ours counts
  the masked tokens whose gradient clipping removes: rho > 1 + eps with A > 0, or rho < 1 - eps
  with A < 0 (the min in Eq. 21 picks the clipped branch there). Tokens with A = 0 never count.
- Masked positions are removed with ``torch.where`` before ``exp`` so padding carrying -inf or NaN
  log-probs cannot poison the loss or its gradient; M * NaN would.
- ``loop_loss`` takes an optional ``token_count``: Eq. 21 divides by sum M over the whole batch,
  so under gradient accumulation the caller passes that global count to every micro-batch.
- The paper gives no values for eps_norm, eps_clip or beta; eps_norm defaults to 1e-6, far below
  the G2P reward's resolution (1/L with L questions, steps of 0.5/L).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from torch import Tensor

from agentcap.algorithms.grpo import clipped_objective, token_weights

__all__ = ["loop_loss", "normalize_by_type", "token_advantages"]

# --------------------------------------------------------------------------------------------
# Advantages, Eq. 17 (= READ Eq. 1 with one kind) and Eq. 18
# --------------------------------------------------------------------------------------------


def normalize_by_type(
    utilities: Sequence[float | None],
    kinds: Sequence[str],
    groups: Sequence[Hashable],
    eps: float,
    std: Literal["population", "unbiased"] = "population",
) -> Tensor:
    """A(xi) = (u(xi) - mu_tau) / (sigma_tau + eps) within each (group, kind) set Xi_tau (Eq. 17).

    This is the group-relative advantage of plain GRPO (READ Eq. 1) when every action of a group
    has the same kind; LOOP-GRPO pools questions, stops and finals of the G rollouts of one audio
    into separate sets so their scales do not mix. sigma is the population std by default (the
    paper does not say which; ``std="unbiased"`` matches TRL). Singleton or constant sets give 0, None gives 0 and is not counted. To split
    by agent as well, fold it into ``kinds`` or ``groups``. Returns float64 [N].
    """
    n = len(utilities)
    if len(kinds) != n or len(groups) != n:
        raise ValueError(
            f"utilities, kinds and groups must have one entry per action, got {n}, {len(kinds)}, {len(groups)}"
        )
    advantages = torch.zeros(n, dtype=torch.float64)  # [N]
    sets: dict[tuple[Hashable, str], list[int]] = {}
    for i, (u, kind, group) in enumerate(zip(utilities, kinds, groups)):
        if u is None:
            continue
        if not math.isfinite(float(u)):
            raise ValueError(f"utilities[{i}] (group {group!r}, kind {kind!r}) is not finite: {u}")
        sets.setdefault((group, kind), []).append(i)
    for index in sets.values():
        u = torch.tensor([float(utilities[i]) for i in index], dtype=torch.float64)  # [|Xi_tau|]
        if len(index) < 2 or bool(u.max() == u.min()):
            continue  # no relative signal: exactly zero, never NaN
        mu = u.mean()
        sigma = u.std(unbiased=std == "unbiased")
        advantages[index] = (u - mu) / (sigma + eps)
    return advantages


def token_advantages(span_lengths: Sequence[int], span_advantages: Sequence[float]) -> Tensor:
    """A^tok (Eq. 18) for one packed token row: every token of span i gets span_advantages[i].

    Give non-trained segments (prompts, Instruct answers, scheduler text) their own span with
    advantage 0 and mask them out in M; a forced finalisation simply has no stop span (or one of
    length 0). When each span is its own row (context + one span), pass the [N] span advantages
    to :func:`loop_loss` directly instead; it broadcasts them. Returns float64 [sum(span_lengths)].
    """
    if len(span_lengths) != len(span_advantages):
        raise ValueError(f"{len(span_lengths)} span lengths but {len(span_advantages)} span advantages")
    if any(int(length) < 0 for length in span_lengths):
        raise ValueError(f"span lengths must be >= 0, got {list(span_lengths)}")
    lengths = torch.tensor([int(length) for length in span_lengths], dtype=torch.long)
    values = torch.tensor([float(a) for a in span_advantages], dtype=torch.float64)
    return torch.repeat_interleave(values, lengths)  # [K]


# --------------------------------------------------------------------------------------------
# Clipped objective with KL, Eq. 19-21
# --------------------------------------------------------------------------------------------


def loop_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_clip: float,
    beta: float = 0.0,
    ref_logprobs: Tensor | None = None,
    token_count: float | Tensor | None = None,
) -> dict[str, Tensor]:
    """L_LOOP (Eq. 21): clipped policy term with token advantages plus beta x masked-mean KL.

    logprobs, old_logprobs, ref_logprobs, mask: [N, T] (mask bool or 0/1); advantages: [N, T]
    token advantages (Eq. 18) or [N], one per row, broadcast over its tokens. The sum over tokens
    is divided by sum M (``token_count`` overrides it, e.g. the whole batch's count when it is split
    into micro-batches). Returns "loss" (with grad), and detached "pg_loss", "kl", "clipfrac",
    "ratio_mean" for logging.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask"
            f" {tuple(mask.shape)} must have the same [N, T] shape"
        )
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logprobs from the frozen reference policy")
    if eps_clip <= 0:
        raise ValueError(f"eps_clip must be > 0, got {eps_clip}")
    count = float(mask.sum()) if token_count is None else float(token_count)
    # Eq. 19-21 are GRPO's clipped objective with span-aligned advantages: one implementation
    out = clipped_objective(
        logprobs, old_logprobs, advantages, mask, clip_eps=eps_clip, beta=beta, ref_logprobs=ref_logprobs,
        weights=token_weights(mask, normalizer=max(count, 1.0), dtype=logprobs.dtype),
    )
    local = max(float(mask.sum()), 1.0) / max(count, 1.0)  # clipfrac / ratio are per given token
    return {
        "loss": out["loss"],
        "pg_loss": out["pg_loss"],
        "kl": out["kl"],
        "clipfrac": out["clipfrac"] / local,
        "ratio_mean": out["ratio"] / local,
    }
