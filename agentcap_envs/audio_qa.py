"""Questions about a clip answered from its audio: the warm-start turns that teach an audio LM to answer.

ACE-Cap's Instruct answers the Composer's questions from the audio; the paper's starts from an audio
LM that already does. Both environments that hold a clip's ``qa`` pairs use these: the evidence game
for its Instruct's warm-up turns, AudioMap's caption environment for question turns beside its
captions in the warm start (so the roles that start from that warm start already answer from the
audio). A question about a subject the clip *lacks*, answered "The <subject> is not heard.", keeps
the answers from being "yes" whatever the audio holds.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agentcap.core.manifests import ManifestError

#: The instruction after the question, per prompt style (the Instruct's, so the turns transfer).
ANSWER_PROMPTS = {
    "paper": "Answer the question from the audio in one sentence.",
    "compact": "Answer from the audio .",
}


def check_qa(row: Mapping[str, Any], where: str) -> None:
    """Refuse a malformed ``qa`` field at load, naming the row and the pair."""
    qa = row.get("qa", [])
    if not isinstance(qa, list):
        raise ManifestError(f"{where}: field 'qa' must be a list of {{question, answer}} objects, got {qa!r}")
    for j, pair in enumerate(qa):
        if not isinstance(pair, dict):
            raise ManifestError(f"{where}: qa[{j}]: must be an object with 'question' and 'answer', got {pair!r}")
        for name in ("question", "answer"):
            if not isinstance(pair.get(name), str) or not pair[name].strip():
                got = "missing" if name not in pair else repr(pair[name])
                raise ManifestError(f"{where}: qa[{j}]: field {name!r} must be a non-empty string, got {got}")


def _held(item: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """The clip's (question, answer) pairs by subject (pairs that name none are left out)."""
    held: dict[str, list[tuple[str, str]]] = {}
    for pair in item.get("qa", []):
        subject = (pair.get("meta") or {}).get("subject")
        if isinstance(subject, str):
            held.setdefault(subject, []).append((pair["question"], pair["answer"]))
    return held


def _no_subjects() -> ValueError:
    return ValueError("demo_absent asks about subjects a clip lacks; no item of the split names one "
                      "(field 'qa', 'meta.subject')")


def subject_questions(items: Sequence[Mapping[str, Any]], forms: Literal["first", "all"] = "first") -> dict[str, list[str]]:
    """Each subject of the split's ``qa`` ``meta.subject`` with the words it is asked in: its first
    question's (``forms="first"``) or every form its questions take in the split (``"all"``)."""
    subjects: dict[str, list[str]] = {}
    for row in items:
        for subject, pairs in _held(row).items():
            if forms == "first":
                subjects.setdefault(subject, [pairs[0][0]])
            else:
                words = subjects.setdefault(subject, [])
                words.extend(q for q, _ in pairs if q not in words)
    if not subjects:
        raise _no_subjects()
    return subjects


def absent_pairs(item: Mapping[str, Any], subjects: Mapping[str, Sequence[str]], draw: random.Random,
                 count: int) -> list[tuple[str, str]]:
    """Up to ``count`` (question, "The <subject> is not heard.") pairs about subjects the clip lacks,
    which ones (and, where a subject has several, which words) drawn by ``draw`` (seed it by the item,
    so an item shows the same ones every time).

    The evidence game's ``demo_absent`` turns. Asked in one form per subject (``subject_questions``
    with ``forms="first"``, as its recipes were measured) the words can give the answer away (see
    :class:`BalancedQuestions`); ``forms="all"`` draws them from the subject's present forms."""
    if not count:
        return []
    held = _held(item)
    lacking = sorted(s for s in subjects if s not in held)
    picked = draw.sample(lacking, min(count, len(lacking)))  # before any words are drawn: the same sounds either way
    return [(draw.choice(subjects[s]), f"The {s} is not heard.") for s in picked]


class BalancedQuestions:
    """Question turns whose words do not give the answer away.

    Asking every absent subject in one question form while the present ones spread over several
    teaches the form, not the audio: on the real-speech world "When is the paper heard?" was a
    present question 4 times and an absent one 79 times, and a warm start taught so answered "not
    heard" to every sound on every held-out clip (docs/real.md). Here each clip's ``per_clip``
    present turns ask subjects it holds (drawn evenly over its subjects, so six effect subjects are
    not drowned by the speaker's many questions), each in one of its own question forms; a subject
    it lacks is asked with the probability that makes the split's absent turns about each subject
    ``absent_ratio`` times its present ones, in a form drawn from that subject's present forms.
    Draws are seeded by the item id: an item shows the same turns every time.
    """

    def __init__(self, items: Sequence[Mapping[str, Any]], per_clip: int, absent_ratio: float):
        self.per_clip, self.absent_ratio = per_clip, absent_ratio
        present: dict[str, float] = {}
        holding: dict[str, int] = {}
        for item in items:
            held = _held(item)
            for subject in held:
                holding[subject] = holding.get(subject, 0) + 1
                present[subject] = present.get(subject, 0.0) + min(per_clip, len(held)) / len(held)
        #: each subject's question forms, the words its absent turns are drawn from
        self.forms = subject_questions(items, "all") if absent_ratio else {}
        lacking = {s: len(items) - n for s, n in holding.items()}
        #: the probability that a clip lacking the subject is asked about it
        self.rates = {s: min(1.0, absent_ratio * present[s] / lacking[s]) if lacking[s] else 0.0 for s in holding}

    def turns(self, item: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The item's (question, target answer) turns: present ones, then absent ones."""
        draw = random.Random(zlib.crc32(str(item["id"]).encode()))
        held = _held(item)
        subjects = sorted(held)
        pairs = [draw.choice(held[s]) for s in draw.sample(subjects, min(self.per_clip, len(subjects)))]
        for subject in sorted(set(self.forms) - set(held)):
            if draw.random() < self.rates[subject]:
                pairs.append((draw.choice(self.forms[subject]), f"The {subject} is not heard."))
        return pairs
