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
from collections.abc import Mapping, Sequence
from typing import Any

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


def subject_questions(items: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each subject of the split's ``qa`` ``meta.subject``, asked in its first question's words."""
    subjects: dict[str, str] = {}
    for row in items:
        for pair in row.get("qa", []):
            subject = (pair.get("meta") or {}).get("subject")
            if isinstance(subject, str):
                subjects.setdefault(subject, pair["question"])
    if not subjects:
        raise ValueError("demo_absent asks about subjects a clip lacks; no item of the split names one "
                         "(field 'qa', 'meta.subject')")
    return subjects


def absent_pairs(item: Mapping[str, Any], subjects: Mapping[str, str], draw: random.Random,
                 count: int) -> list[tuple[str, str]]:
    """Up to ``count`` (question, "The <subject> is not heard.") pairs about subjects the clip lacks,
    which ones drawn by ``draw`` (seed it by the item, so an item shows the same ones every time)."""
    if not count:
        return []
    held = {(pair.get("meta") or {}).get("subject") for pair in item.get("qa", [])}
    lacking = sorted(s for s in subjects if s not in held)
    return [(subjects[s], f"The {s} is not heard.") for s in draw.sample(lacking, min(count, len(lacking)))]
