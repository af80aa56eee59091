"""ser(E) (ACE-Cap Eq. 7, 8, 10, 11): the evidence state as the caption-only judge reads it.

The environment writes it (``agentcap_envs.evidence_game``), the G2P reward scores it, and the judges
read it: :class:`~agentcap.judges.rule.RuleExaminer` skips its question lines, because questions
are non-assertive. The concrete format is ours (the paper only asks for a deterministic
concatenation with role delimiters): a one-line preamble saying what counts as evidence, then one
labelled line per item, whitespace collapsed so that no item can forge a role line of its own. The
zero-question state uses the same format, so the format's effect on the judge cancels in every
leave-one-out difference of Eq. 12; ser(E^{-t}) is ser of the shortened sequence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["ANSWER_LABEL", "EVIDENCE_PREAMBLE", "INITIAL_CAPTION_LABEL", "QUESTION_LABEL", "evidence_states",
           "serialize_evidence"]


EVIDENCE_PREAMBLE = (
    "Evidence about the audio. Only the initial caption and the answers state facts; "
    "the questions were only asked and are not evidence."
)
INITIAL_CAPTION_LABEL = "Initial caption:"
QUESTION_LABEL = "Question asked (not evidence):"
ANSWER_LABEL = "Answer:"

_WHITESPACE = re.compile(r"\s+")


def _one_line(text: str) -> str:
    """Collapse every whitespace run (newlines included) so an item stays on its own line."""
    return _WHITESPACE.sub(" ", text).strip()


def _line(label: str, text: str) -> str:
    body = _one_line(text)
    return f"{label} {body}" if body else label


def serialize_evidence(c0: str, qa: Sequence[tuple[str, str]]) -> str:
    """ser(E) (Eq. 7, 10): the judge input for c0 plus completed QA pairs, in interaction order.

    Format (one item per line, "\\n"-joined, no trailing newline)::

        Evidence about the audio. Only the initial caption and the answers state facts; the questions were only asked and are not evidence.
        Initial caption: <c0>
        Question asked (not evidence): <q_1>
        Answer: <a_1>
        ...

    The question label says "not evidence" on every question line, because a caption-only judge
    would otherwise read "Is there a dog barking far away?" as a claim. The question label does
    not begin with a bare "Question:", which judge prompts use for the MCQ itself. Empty items keep
    their label. Same input, same string.
    """
    if not isinstance(c0, str):
        raise TypeError(f"c0 must be a str (the Captioner's caption), got {type(c0).__name__}")
    lines = [EVIDENCE_PREAMBLE, _line(INITIAL_CAPTION_LABEL, c0)]
    for t, pair in enumerate(qa):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            raise TypeError(f"qa[{t}] must be a (question, answer) pair of str, got {pair!r}")
        question, answer = pair
        lines.append(_line(QUESTION_LABEL, question))
        lines.append(_line(ANSWER_LABEL, answer))
    return "\n".join(lines)


def evidence_states(c0: str, qa: Sequence[tuple[str, str]]) -> tuple[str, list[str]]:
    """ser(E_g) and [ser(E_g^{-t}) for t = 1..T_g] (Eq. 8, 11): the T_g + 1 texts the judge scores.

    Leave-one-out states may repeat (identical QA pairs); deduplicate before the judge call if
    judge calls are expensive.
    """
    pairs = list(qa)
    full = serialize_evidence(c0, pairs)
    minus = [serialize_evidence(c0, pairs[:t] + pairs[t + 1 :]) for t in range(len(pairs))]
    return full, minus
