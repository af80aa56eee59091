"""Frozen judges: cloze / MCQ examiners, temporal examiners and the READ coherence scorer."""

import importlib

# Re-exported on first use: a submodule importing a sibling runs this file, so it imports none of them.
_LAZY = {
    "CoherenceScorer": "agentcap.judges.coherence",
    **dict.fromkeys(["Examiner", "LLMExaminer", "Question", "RuleExaminer"], "agentcap.judges.examiner"),
    "causal_lm": "agentcap.judges.pool",
    **dict.fromkeys(["LLMTemporalExaminer", "RuleTemporalExaminer", "TemporalExaminer", "parse_intervals"],
                    "agentcap.judges.temporal"),
    "build_examiner": "agentcap.judges.build",
    "build_temporal_examiner": "agentcap.judges.build",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
