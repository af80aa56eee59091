"""Frozen judges: cloze / MCQ examiners, temporal examiners and the READ coherence scorer."""

from agentcap._lazy import lazy_exports

# resolved on first use: see agentcap._lazy
EXPORTS = {
    "CoherenceScorer": "agentcap.judges.coherence",
    **dict.fromkeys(["Examiner", "LLMExaminer", "Question", "RuleExaminer"], "agentcap.judges.examiner"),
    "causal_lm": "agentcap.judges.pool",
    **dict.fromkeys(["LLMTemporalExaminer", "RuleTemporalExaminer", "TemporalExaminer", "parse_intervals"],
                    "agentcap.judges.temporal"),
    "build_examiner": "agentcap.judges.build",
    "build_temporal_examiner": "agentcap.judges.build",
}

__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
