"""Frozen judges: cloze / MCQ questions and examiners, temporal examiners, the READ coherence scorer,
ACE-Cap's evidence format, served judges and the judge pool."""

from agentcap._lazy import lazy_exports

# resolved on first use: see agentcap._lazy
EXPORTS = {
    "CoherenceScorer": "agentcap.judges.coherence",
    **dict.fromkeys(["Examiner", "LLMExaminer"], "agentcap.judges.examiner"),
    "Question": "agentcap.judges.questions",
    "RuleExaminer": "agentcap.judges.rule",
    "causal_lm": "agentcap.judges.pool",
    **dict.fromkeys(["LLMTemporalExaminer", "RuleTemporalExaminer", "TemporalExaminer", "parse_intervals"],
                    "agentcap.judges.temporal"),
    "build_examiner": "agentcap.judges.build",
    "build_temporal_examiner": "agentcap.judges.build",
}

__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
