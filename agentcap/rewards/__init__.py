"""Rewards: per-sample functions (``agentcap.rewards.functional``), their weighted composition
(``base``), their synced means (``metric``: a torchmetrics ``Metric``), READ's reward (``read``) and ACE-Cap's evidence utilities (``evidence``)."""

import importlib

# Re-exported on first use: a submodule importing a sibling runs this file, so it imports none of them.
_LAZY = {
    "RewardMetric": "agentcap.rewards.metric",
    "read_rewards": "agentcap.rewards.read",
    "weighted_sum": "agentcap.rewards.base",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
