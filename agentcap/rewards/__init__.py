"""Rewards: per-sample functions (``agentcap.rewards.functional``), their weighted composition
(``base``), their synced means (``metric``: a torchmetrics ``Metric``), READ's reward (``read``) and ACE-Cap's raw utilities (``evidence``)."""

from agentcap._lazy import lazy_exports

# resolved on first use: see agentcap._lazy
EXPORTS = {
    "RewardMetric": "agentcap.rewards.metric",
    "read_rewards": "agentcap.rewards.read",
    "weighted_sum": "agentcap.rewards.base",
}

__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
