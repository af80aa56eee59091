"""Group-normalised advantages: LOOP-GRPO Eq. 17, with plain GRPO (READ Eq. 1) as its one-kind case.

The environment scores the evidence and hands over raw utilities per action (Eq. 12-16, 22, 23:
``agentcap.rewards.evidence``); ``normalize_by_type(utilities, kinds, groups, eps)`` turns them
into advantages A(xi) within each (group, kind) set Xi_tau (Eq. 17). With one kind per group this
*is* plain GRPO (READ Eq. 1), so every task, the Captioner (Eq. 22) and Instruct (Eq. 23, group =
one replayed prompt) use the same function. The loss (Eq. 19-21) is GRPO's clipped objective
(:func:`agentcap.algorithms.grpo.clipped_objective`): each trained span is its own row, so the
token advantage of Eq. 18 is the span's advantage broadcast over its tokens.

Nothing here touches a model: scores come in as floats.

Departures from the paper, and why:

- Eq. 17 does not say which standard deviation; we use the population std (divide by |Xi_tau|),
  the one that makes a two-element set map to +-1 (``std="unbiased"`` divides by |Xi_tau| - 1 and,
  with eps 1e-4, matches TRL's advantages). A set with one element, or whose utilities are all
  equal, gets exactly zero advantage (never NaN): the formula gives ~0 there too, but its std is
  ~1e-17 in float arithmetic, not 0, and float noise in u - mu divided by eps_norm could otherwise
  turn into a spurious O(1e-10 / 1e-6) signal. ``None`` utilities (actions not trained in this
  phase) are left out of the statistics and get 0.
- ``std="none"`` leaves the std out, A = u - mu (Dr. GRPO, Liu et al. 2025; TRL's
  ``scale_rewards="none"``): a group whose utilities differ by a hair then gets a hair of
  advantage, instead of the same +-1 as a group that differs by the whole reward range
  (docs/real.md measures it on the pretrained audio LM).
- The paper gives no value for eps_norm; it defaults to 1e-6, far below the G2P reward's
  resolution (1/L with L questions, steps of 0.5/L).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from torch import Tensor

__all__ = ["AdvantageStd", "group_scales", "normalize_by_type"]

AdvantageStd = Literal["population", "unbiased", "none"]


def normalize_by_type(
    utilities: Sequence[float | None],
    kinds: Sequence[str],
    groups: Sequence[Hashable],
    eps: float,
    std: AdvantageStd = "population",
) -> Tensor:
    """A(xi) = (u(xi) - mu_tau) / (sigma_tau + eps) within each (group, kind) set Xi_tau (Eq. 17).

    This is the group-relative advantage of plain GRPO (READ Eq. 1) when every action of a group
    has the same kind; LOOP-GRPO pools questions, stops and finals of the G rollouts of one audio
    into separate sets so their scales do not mix. sigma is the population std by default (the
    paper does not say which; ``std="unbiased"`` matches TRL; ``"none"`` divides by nothing, Dr.
    GRPO). Singleton or constant sets give 0; None gives 0 and is not counted. To split by agent as
    well, fold it into ``kinds`` or ``groups``. Returns float64 [N].
    """
    advantages = torch.zeros(len(utilities), dtype=torch.float64)  # [N]
    for index, u, scale in _scaled_sets(utilities, kinds, groups, eps, std):
        if scale:  # else no relative signal: exactly zero, never NaN
            advantages[index] = (u - u.mean()) / scale
    return advantages


def group_scales(
    utilities: Sequence[float | None],
    kinds: Sequence[str],
    groups: Sequence[Hashable],
    eps: float,
    std: AdvantageStd = "population",
) -> Tensor:
    """What each action's (group, kind) set divides by in :func:`normalize_by_type`: sigma_tau + eps
    (1 for ``std="none"``), and 0 where the set carries no relative signal (one member, all equal,
    or a None utility). Per-sentence credit divides its shares by the same figure, so a sentence's
    advantage is in its caption's units. Returns float64 [N]."""
    scales = torch.zeros(len(utilities), dtype=torch.float64)  # [N]
    for index, _, scale in _scaled_sets(utilities, kinds, groups, eps, std):
        scales[index] = scale
    return scales


def _scaled_sets(
    utilities: Sequence[float | None], kinds: Sequence[str], groups: Sequence[Hashable], eps: float, std: AdvantageStd,
) -> list[tuple[list[int], Tensor, float]]:
    """Each (group, kind) set Xi_tau: its indices, its utilities and what it divides by (0: no signal)."""
    if std not in ("population", "unbiased", "none"):
        raise ValueError(f"std must be 'population', 'unbiased' or 'none', got {std!r}")
    out = []
    for index in _sets(utilities, kinds, groups).values():
        u = torch.tensor([float(utilities[i]) for i in index], dtype=torch.float64)  # [|Xi_tau|]
        if len(index) < 2 or bool(u.max() == u.min()):
            scale = 0.0
        else:
            scale = 1.0 if std == "none" else u.std(unbiased=std == "unbiased").item() + eps
        out.append((index, u, scale))
    return out


def _sets(
    utilities: Sequence[float | None], kinds: Sequence[str], groups: Sequence[Hashable]
) -> dict[tuple[Hashable, str], list[int]]:
    """The indices of each (group, kind) set Xi_tau, None utilities left out."""
    n = len(utilities)
    if len(kinds) != n or len(groups) != n:
        raise ValueError(
            f"utilities, kinds and groups must have one entry per action, got {n}, {len(kinds)}, {len(groups)}"
        )
    sets: dict[tuple[Hashable, str], list[int]] = {}
    for i, (u, kind, group) in enumerate(zip(utilities, kinds, groups)):
        if u is None:
            continue
        if not math.isfinite(float(u)):
            raise ValueError(f"utilities[{i}] (group {group!r}, kind {kind!r}) is not finite: {u}")
        sets.setdefault((group, kind), []).append(i)
    return sets
