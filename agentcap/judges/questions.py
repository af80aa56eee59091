"""Cloze / MCQ questions as every judge reads them: the record, bank validation, pairing helpers.

The evidence rewards (AudioMap ESR, ACE-Cap G2P) ask one question per (caption, question) pair and
expect a letter A–E; E is "Not given" and never the gold. Banks come from manifests, so every
problem is reported naming the row, the field and the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentcap.core.manifests import ManifestError

LETTERS = ("A", "B", "C", "D", "E")
GOLD_LETTERS = LETTERS[:4]
NOT_GIVEN = "Not given"
#: A cloze blank: three or more underscores.
BLANK = re.compile(r"_{3,}")


# --- the record ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    """One cloze / MCQ item: a passage with a blank, options A–E (E is "Not given"), a gold in A–D.

    ``meta`` is free-form (the toy worlds put ``subject`` / ``attribute`` / ``event`` there); it
    takes part in equality but not in the hash, so a question stays usable as a dict key.
    """

    passage: str
    options: tuple[str, ...]
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        check_question(self.passage, self.options, self.answer, self.meta, "Question")

    @classmethod
    def from_row(cls, row: Mapping[str, Any], where: str = "") -> "Question":
        """Build from a manifest row; a bad row raises ``ManifestError`` naming ``where``, field, value."""
        where = where or "question"
        if not isinstance(row, Mapping):
            raise ManifestError(f"{where}: a question must be a JSON object, got {row!r}")
        for name in ("passage", "options", "answer"):
            if name not in row:
                raise ManifestError(f"{where}: question is missing field {name!r} (has {sorted(row)})")
        options = row["options"]
        if not isinstance(options, (list, tuple)):
            raise ManifestError(f"{where}: field 'options' must be a list of 5 strings, got {options!r}")
        answer = row["answer"]
        if isinstance(answer, str):
            answer = answer.strip().upper()
        meta = row.get("meta") or {}
        check_question(row["passage"], tuple(options), answer, meta, where)
        return cls(row["passage"], tuple(options), answer, dict(meta))

    def prompt_text(self) -> str:
        """The passage followed by the lettered options, as the examiner reads it."""
        lines = [self.passage] + [f"{letter}. {text}" for letter, text in zip(LETTERS, self.options)]
        return "\n".join(lines)


def question_bank(item: Mapping[str, Any], field: str = "cloze") -> list[Question]:
    """The item's parsed question bank (``field``: ``cloze`` for AudioMap, ``mcq`` for ACE-Cap): parsed
    on load from a manifest (``_questions``), parsed here from ``item[field]`` (and kept under a key
    of that field) for items handed over directly (``items=``); empty for an unlabelled item."""
    questions = item.get("_questions")
    if questions is None:
        cache = f"_questions:{field}"
        questions = item.get(cache)
        if questions is None:
            where = str(item.get("_where") or item.get("id", "item"))
            rows = item.get(field) or []
            questions = [Question.from_row(q, f"{where}: {field}[{j}]") for j, q in enumerate(rows)]
            if isinstance(item, dict):
                item[cache] = questions
    return list(questions)


def question_problems(passage: Any, options: Sequence[Any], answer: Any, meta: Any = None) -> list[str]:
    """Every reason a cloze / MCQ item is unusable, each naming the field and the bad value."""
    problems = []
    if not isinstance(passage, str) or not passage.strip():
        problems.append(f"field 'passage' must be a non-empty string, got {passage!r}")
    if len(options) != 5:
        problems.append(
            f"field 'options' must hold exactly 5 options (A–D and E='{NOT_GIVEN}'), "
            f"got {len(options)}: {list(options)!r}"
        )
    texts = [t.strip().lower() if isinstance(t, str) else None for t in options]
    for letter, text, raw in zip(LETTERS, texts, options):
        if not text:
            problems.append(f"field 'options' option {letter} must be a non-empty string, got {raw!r}")
    if len(options) == 5 and texts[4] is not None and texts[4] != NOT_GIVEN.lower():
        problems.append(f"field 'options' option E must be {NOT_GIVEN!r}, got {options[4]!r}")
    seen: dict[str, str] = {}
    for letter, text, raw in zip(LETTERS, texts, options):
        if text and text in seen:
            problems.append(f"field 'options' has a duplicate option {raw!r} (options {seen[text]} and {letter})")
        elif text:
            seen[text] = letter
    if answer == "E":
        problems.append(
            f"field 'answer' is 'E', but E is '{NOT_GIVEN}' and can never be the gold answer; "
            "the gold must be one of A, B, C, D"
        )
    elif answer not in GOLD_LETTERS:
        problems.append(f"field 'answer' must be one of A, B, C, D, got {answer!r}")
    if meta is not None and not isinstance(meta, Mapping):
        problems.append(f"field 'meta' must be an object, got {meta!r}")
    return problems


def check_question(passage: Any, options: Sequence[Any], answer: Any, meta: Any, where: str) -> None:
    problems = question_problems(passage, options, answer, meta)
    if problems:
        raise ManifestError(f"{where}: " + "; ".join(problems))


# --- pairing helpers ---------------------------------------------------------------------------
def check_pairs(captions: Sequence[str], others: Sequence[Any], what: str) -> None:
    if len(captions) != len(others):
        raise ValueError(f"examiner is pairwise: got {len(captions)} captions but {len(others)} {what}")
    for i, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise TypeError(f"caption {i} must be a string, got {type(caption).__name__}: {caption!r}")


def unique(keys: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """Distinct keys in first-seen order, and for each input the index of its distinct key."""
    index: dict[Any, int] = {}
    inverse = [index.setdefault(k, len(index)) for k in keys]
    return list(index), inverse


def distinct_pairs(
    captions: Sequence[str], questions: Sequence[Question]
) -> tuple[list[tuple[str, Question]], torch.Tensor]:
    """The distinct (caption, question) pairs in first-seen order, and for each input pair the index
    of its distinct pair: a letter examiner asks each distinct pair once. A question's ``meta`` never
    reaches the prompt, so it does not split otherwise identical pairs."""
    keys = [(c, q.passage, q.options) for c, q in zip(captions, questions)]
    distinct, inverse = unique(keys)
    pair_of = dict(zip(keys, zip(captions, questions)))
    return [pair_of[key] for key in distinct], torch.tensor(inverse, dtype=torch.long)



_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*;\s*|\n+")


def sentences(text: str) -> list[str]:
    """Sentences (and ";"-separated parts) of a caption; a decimal point ("0.5 s") ends none."""
    return [text[start:end].strip() for start, end in sentence_spans(text)]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Where each of :func:`sentences` lies in ``text``: (start, end) character offsets, the
    separators left out (so a caption's sentences can be credited, or removed, one at a time)."""
    spans, start = [], 0
    for match in [*_SENTENCE_END.finditer(text), None]:
        end = len(text) if match is None else match.start()
        if text[start:end].strip():
            spans.append((start, end))
        if match is not None:
            start = match.end()
    return spans
