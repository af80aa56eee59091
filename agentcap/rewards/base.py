"""What every reward shares: a process-synced running mean, and weighted composition.

Each reward is a pair, as torchmetrics does it: a function in ``agentcap.rewards.functional`` that
returns the per-sample reward tensor (this feeds the advantages) and a ``Metric`` subclass of
:class:`RewardMetric` that calls the function in ``update`` and keeps only a sum and a count, so
``compute`` is the mean over every process after ``dist_reduce_fx="sum"``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torchmetrics import Metric


class RewardMetric(Metric):
    """Running mean of a per-sample reward; subclasses turn their inputs into that tensor."""

    higher_is_better = True
    is_differentiable = False
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def per_sample(self, *args, **kwargs) -> torch.Tensor:
        """The functional form of this reward; the default takes already-computed values."""
        (values,) = args
        return torch.as_tensor(values, dtype=torch.float64)

    def update(self, *args, **kwargs) -> None:
        values = self.per_sample(*args, **kwargs).detach().to(self.total.device, torch.float64).flatten()
        self.total += values.sum()
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        if self.count == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self.total / self.count


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
