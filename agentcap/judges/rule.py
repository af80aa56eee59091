"""The deterministic examiner of the offline toy worlds (templated captions, attribute words).

Matching attribute words is an exact judge only where captions are templated; on real captions
use an LLM examiner (:mod:`agentcap.judges.examiner`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentcap.judges.evidence import EVIDENCE_PREAMBLE, QUESTION_LABEL
from agentcap.judges.questions import LETTERS, Question, check_pairs, sentences


def _word_pattern(phrase: str, plural: bool = False) -> re.Pattern[str]:
    words = r"\s+".join(re.escape(w) for w in phrase.split())
    suffix = r"(?:e?s)?" if plural else ""
    return re.compile(rf"(?<![\w-]){words}{suffix}(?![\w-])", re.IGNORECASE)


class RuleExaminer:
    """Deterministic judge for the offline toy worlds ONLY (templated captions, attribute words).

    With ``meta["subject"]`` (e.g. "beep"), only the caption sentences that mention the subject
    (whole word, plural allowed) are read; without it, the whole caption is. Options A–D are
    searched as whole words, longest first, and a shorter option inside an already matched longer
    one does not count ("very high" hides its "high"). Exactly one option found → its letter; none,
    or a subject the caption never mentions → "E"; several → the one found first in the text.
    Lines of a serialised evidence state that carry a question (ACE-Cap's ser(E)) are not read:
    questions are non-assertive, so only the initial caption and the answers count as evidence.
    """

    def answer(self, captions: Sequence[str], questions: Sequence[Question]) -> list[str]:
        check_pairs(captions, questions, "questions")
        return [self._answer_one(c, q) for c, q in zip(captions, questions)]

    def _answer_one(self, caption: str, question: Question) -> str:
        caption = "\n".join(
            line for line in caption.splitlines() if not line.startswith((QUESTION_LABEL, EVIDENCE_PREAMBLE))
        )
        subject = question.meta.get("subject") if question.meta else None
        if subject:
            pattern = _word_pattern(str(subject), plural=True)
            text = " ".join(s for s in sentences(caption) if pattern.search(s))
        else:
            text = caption
        if not text.strip():
            return "E"
        claimed: list[tuple[int, int]] = []
        first_at: dict[str, int] = {}
        order = sorted(range(4), key=lambda k: -len(question.options[k]))
        for k in order:
            for match in _word_pattern(question.options[k]).finditer(text):
                span = match.span()
                if any(span[0] < end and start < span[1] for start, end in claimed):
                    continue
                claimed.append(span)
                first_at.setdefault(LETTERS[k], span[0])
        if not first_at:
            return "E"
        return min(first_at, key=lambda letter: first_at[letter])
