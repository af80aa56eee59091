"""Evaluation as the papers report it: held-out rollouts scored by the environment's rewards and the
papers' metrics, the run's ``summary.json``, and the results table."""

import importlib

# Re-exported on first use: a submodule importing a sibling runs this file, so it imports none of them.
_LAZY = {
    "evaluate_rollouts": "agentcap.evaluation.rollouts",
    "write_summary": "agentcap.evaluation.rollouts",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
