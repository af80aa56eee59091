"""Word error rate of a caption's quoted speech against the recordings' transcripts.

Real-speech worlds (``agentcap_envs.real.speech``) quote what is said (``From 2.0 s to 2.9 s, a
woman says "I'm sorry".``) and keep each speech event's ``transcript`` in the item's ``events``.
The hypothesis is every quoted span of the caption in order of appearance, the reference every
transcript in time order; words are compared lower-cased with punctuation other than the apostrophe
removed. WER is corpus-level: the sum of word edits (substitutions + deletions + insertions, a plain
Levenshtein distance over words) over the sum of reference words, so a caption that quotes nothing
scores every reference word as a deletion.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

#: Straight or curly double quotes around a span with no double quote inside.
QUOTED = re.compile(r"[\"\u201c]([^\"\u201c\u201d]*)[\"\u201d]")
_NOT_WORD = re.compile(r"[^\w']+")


def words(text: str) -> list[str]:
    """Lower-cased words, punctuation (not the apostrophe) as spaces."""
    return [w.strip("'") for w in _NOT_WORD.sub(" ", text.lower()).split() if w.strip("'")]


def quoted_spans(caption: str) -> list[str]:
    """Every ``"…"`` span of the caption, in order."""
    return [m.group(1) for m in QUOTED.finditer(caption)]


def edit_distance(hypothesis: Sequence[str], reference: Sequence[str]) -> int:
    """Levenshtein distance between two word sequences (each edit costs 1)."""
    previous = list(range(len(reference) + 1))
    for i, h in enumerate(hypothesis, 1):
        current = [i]
        for j, r in enumerate(reference, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (h != r)))
        previous = current
    return previous[-1]


def transcripts_of(item: Mapping[str, Any]) -> list[str] | None:
    """The item's speech transcripts in time order; None when it has no event list with transcripts
    (not a real-speech item), [] for a clip without speech."""
    events = item.get("events")
    if not isinstance(events, list) or not any(isinstance(e, Mapping) and "transcript" in e for e in events):
        return None
    spoken = [e for e in events if isinstance(e, Mapping) and e.get("transcript")]
    return [str(e["transcript"]) for e in sorted(spoken, key=lambda e: float(e.get("onset", 0.0)))]


def quoted_wer(captions: Sequence[str], transcripts: Sequence[Sequence[str]]) -> tuple[float, int, int]:
    """(corpus WER, word edits, reference words) of the captions' quoted speech."""
    edits = total = 0
    for caption, spoken in zip(captions, transcripts, strict=True):
        reference = [w for t in spoken for w in words(t)]
        hypothesis = [w for q in quoted_spans(caption) for w in words(q)]
        edits += edit_distance(hypothesis, reference)
        total += len(reference)
    return (edits / total if total else float("nan")), edits, total


def speech_metrics(items: Sequence[Mapping[str, Any]], captions: Sequence[str]) -> dict[str, float]:
    """``wer`` (quoted speech vs transcripts) when every item carries transcripts; else nothing."""
    transcripts = [transcripts_of(item) for item in items]
    if not items or any(t is None for t in transcripts):
        return {}
    value, _, total = quoted_wer(captions, transcripts)
    return {"wer": value} if total else {}
