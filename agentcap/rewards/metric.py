"""The Metric half of every reward: the mean of each reward component over a batch of scored
episodes, synced across processes by torchmetrics.

The environments compute per-sample rewards with the functions of ``agentcap.rewards.functional``
(that tensor feeds the advantages); this metric accumulates what they returned, as a sum and a count
per component in float64 with ``dist_reduce_fx="sum"``, so ``compute`` is the mean over every
process's episodes: N processes log the reward means one process logs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from agentcap.core.episode import Score


class RewardMetric(Metric):
    """Running means of ``total`` (the reward) and each named component, over every process.

    ``components`` are fixed when the metric is built (every process must build it with the same
    names: they are its synced states); a score lacking a component does not count towards its mean.
    """

    higher_is_better = True
    is_differentiable = False
    full_state_update = False

    def __init__(self, components: Sequence[str], **kwargs):
        super().__init__(**kwargs)
        self.names = ["total", *sorted(set(components) - {"total"})]
        for name in self.names:
            self.add_state(f"sum_{name}", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state(f"count_{name}", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, scores: Sequence[Score]) -> None:
        for score in scores:
            for name in self.names:
                value = score.reward if name == "total" else score.components.get(name)
                if value is None:
                    continue
                setattr(self, f"sum_{name}", getattr(self, f"sum_{name}") + float(value))
                setattr(self, f"count_{name}", getattr(self, f"count_{name}") + 1)

    def compute(self) -> dict[str, float]:
        """Mean per name (NaN where no score carried it)."""
        out = {}
        for name in self.names:
            count = int(getattr(self, f"count_{name}"))
            out[name] = float(getattr(self, f"sum_{name}")) / count if count else float("nan")
        return out
