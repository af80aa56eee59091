"""Weighted composition of named reward components, shared by every task's reward.

The per-sample rewards themselves are functions in ``agentcap.rewards.functional``, each returning
one float64 value per response; the environments call them on a finished batch and combine them
here. Held-out means are taken over the evaluation rows (``agentcap.evaluation.rollouts``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def weighted_sum(components: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> torch.Tensor:
    """R = sum_k w_k R_k over the named components (READ Eq. 6, AudioMap Eq. 7).

    Every weight must name a component and vice versa, so a typo in a config cannot silently drop
    a term.
    """
    missing = set(weights) - set(components)
    unused = set(components) - set(weights)
    if missing or unused:
        raise KeyError(
            f"reward weights {sorted(weights)} must match components {sorted(components)}"
            f" (missing: {sorted(missing)}, unweighted: {sorted(unused)})"
        )
    total = None
    for name, weight in weights.items():
        term = float(weight) * components[name].to(torch.float64)
        total = term if total is None else total + term
    assert total is not None, "no reward components"
    return total
