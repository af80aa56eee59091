"""Frozen judges: cloze / MCQ examiners, temporal examiners and the READ coherence scorer."""

from __future__ import annotations

from typing import Literal

from agentcap.judges.coherence import CoherenceScorer
from agentcap.judges.examiner import Examiner, LLMExaminer, Question, RuleExaminer
from agentcap.judges.temporal import LLMTemporalExaminer, RuleTemporalExaminer, TemporalExaminer, parse_intervals


def build_examiner(spec: str, device: str = "cpu", readout: Literal["letters", "options"] = "letters") -> Examiner:
    """``rule`` (toy worlds only) or the local folder of an HF causal LM.

    ``readout="letters"`` answers by the next-token logits of A–E (the papers' examiner);
    ``"options"`` scores each option's text, for small models that cannot follow a letter format.
    """
    if spec == "rule":
        return RuleExaminer()
    return LLMExaminer.from_pretrained(spec, device=device, readout=readout)


def build_temporal_examiner(spec: str, half_width: float, device: str = "cpu") -> TemporalExaminer:
    """``rule`` (the deterministic timestamp parser) or the local folder of an HF causal LM."""
    if spec == "rule":
        return RuleTemporalExaminer(half_width=half_width)
    return LLMTemporalExaminer.from_pretrained(spec, half_width=half_width, device=device)


__all__ = [
    "CoherenceScorer", "Examiner", "LLMExaminer", "LLMTemporalExaminer", "Question", "RuleExaminer",
    "RuleTemporalExaminer", "TemporalExaminer", "build_examiner", "build_temporal_examiner", "parse_intervals",
]
