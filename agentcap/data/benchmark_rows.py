"""The benchmark manifest row (MMAU, MMAR, MMSU, … after ``agentcap data convert``), checked in one place.

Why one function: the converters write these rows and ``agentcap evaluate --benchmark`` reads them;
both call :func:`check_benchmark_row`, so a row one accepts the other can use. One JSONL row per
question::

    {"id": str, "audio": path (relative to the manifest's folder, or absolute), "question": str,
     "choices": [str, ...] (2-10, distinct), "answer": "A".."J" (index into choices),
     "answer_text": str (== choices[answer]), "benchmark": str, "task": str|null,
     "category": str|null, "subcategory": str|null, "layer": str|null, "duration": float|null}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentcap.core.manifests import ManifestError

#: Option letters, one per choice; a benchmark question has 2 to 10 choices.
LETTERS = "ABCDEFGHIJ"
MIN_CHOICES, MAX_CHOICES = 2, len(LETTERS)

#: Every field of a row; those in ``OPTIONAL`` may be null.
FIELDS = ("id", "audio", "question", "choices", "answer", "answer_text", "benchmark",
          "task", "category", "subcategory", "layer", "duration")
OPTIONAL = ("task", "category", "subcategory", "layer", "duration")


def check_benchmark_row(row: Any, where: str) -> None:
    """Raise :class:`ManifestError` (naming ``where`` and the field) unless ``row`` follows the schema."""
    if not isinstance(row, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [name for name in FIELDS if name not in row]
    if missing:
        raise ManifestError(f"{where}: missing field(s) {missing} (row has {sorted(k for k in row if k[:1] != '_')})")
    for name in ("id", "audio", "question", "answer_text", "benchmark"):
        if not isinstance(row[name], str) or not row[name].strip():
            raise ManifestError(f"{where}: field {name!r} must be a non-empty string, got {row[name]!r}")
    for name in ("task", "category", "subcategory", "layer"):
        if row[name] is not None and not isinstance(row[name], str):
            raise ManifestError(f"{where}: field {name!r} must be a string or null, got {row[name]!r}")
    choices = row["choices"]
    if not isinstance(choices, list) or not MIN_CHOICES <= len(choices) <= MAX_CHOICES:
        raise ManifestError(
            f"{where}: field 'choices' must be a list of {MIN_CHOICES}-{MAX_CHOICES} strings, got {choices!r}"
        )
    for j, choice in enumerate(choices):
        if not isinstance(choice, str) or not choice.strip():
            raise ManifestError(f"{where}: field 'choices'[{j}] must be a non-empty string, got {choice!r}")
    if len({c.strip().lower() for c in choices}) != len(choices):
        raise ManifestError(f"{where}: field 'choices' repeats an option: {choices!r}")
    answer = row["answer"]
    letters = LETTERS[: len(choices)]
    if not isinstance(answer, str) or len(answer) != 1 or answer not in letters:
        raise ManifestError(f"{where}: field 'answer' must be one letter of {letters!r}, got {answer!r}")
    if choices[letters.index(answer)] != row["answer_text"]:
        raise ManifestError(
            f"{where}: field 'answer_text' {row['answer_text']!r} is not choice {answer} "
            f"({choices[letters.index(answer)]!r})"
        )
    duration = row["duration"]
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not math.isfinite(duration) or duration < 0):
        raise ManifestError(f"{where}: field 'duration' must be a number of seconds >= 0 or null, got {duration!r}")


def check_unique_ids(rows: Sequence[Mapping[str, Any]], where: str) -> None:
    """Raise :class:`ManifestError` naming how many rows repeat an earlier row's ``id`` (a question
    counted twice would weigh double in the accuracy), and the first few ids with their row numbers."""
    seen: dict[str, list[int]] = {}
    for number, row in enumerate(rows, 1):
        seen.setdefault(row["id"], []).append(number)
    repeated = {i: numbers for i, numbers in seen.items() if len(numbers) > 1}
    if repeated:
        extra = sum(len(numbers) - 1 for numbers in repeated.values())
        shown = "; ".join(f"{i!r} at rows {', '.join(map(str, numbers[:5]))}" for i, numbers in list(repeated.items())[:3])
        raise ManifestError(f"{where}: {extra} of {len(rows)} rows repeat an earlier row's id ({len(repeated)} ids: "
                            f"{shown}{'; …' if len(repeated) > 3 else ''}); every question needs its own id")
