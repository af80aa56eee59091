"""Audio QA benchmarks (MMAU, MMAR, MMSU) → the benchmark manifest of ``agentcap evaluate --benchmark``.

One row per question, checked by :func:`agentcap.data.benchmark_rows.check_benchmark_row`. The
answer is stored as the letter of the right choice and its text; a release answer that is neither a
choice's text nor a letter is refused, never guessed.

Release layouts:
- MMAU ``mmau-test-mini.json`` / ``mmau-test.json`` (checked): a list of ``{"id"?, "audio_id" (path,
  e.g. ``./test-mini-audios/<uuid>.wav``), "question", "choices", "answer" (the choice's text),
  "dataset", "task" (sound / music / speech), "split", "category", "sub-category", "difficulty"}``.
  Without ``id`` the audio file's stem is the id (``#2``, ``#3`` … for later questions on it).
- MMAR ``MMAR-meta.json`` (checked against its evaluation script and the Hugging Face card): a list of
  ``{"id", "audio_path", "question", "choices", "answer" (text), "modality", "category" (Signal /
  Perception / Semantic / Cultural Layer), "sub-category", "language", …}`` → ``task`` = modality,
  ``layer`` = category.
- MMSU (the Hugging Face card's columns; the audio is embedded there, so export it to files and give
  the path column): ``{"id", "task_name", "audio", "question", "choice_a"…"choice_d", "answer_gt",
  "category", "sub-category", …}``; ``audio`` may be a path or ``{"path": …}``.
"""

from __future__ import annotations

import ast
import json
import os
from collections import Counter
from typing import Any

from agentcap.core.manifests import ManifestError
from agentcap.data.benchmark_rows import check_benchmark_row
from agentcap.data.convert.common import (
    Options, Result, answer_letter, audio_seconds, columns, json_object, json_records, manifest_path, text_field,
    under_root,
)

MMAU = {"id": "id", "audio": "audio_id", "question": "question", "choices": "choices", "answer": "answer",
        "task": "task", "category": "category", "subcategory": "sub-category"}
MMAR = {"id": "id", "audio": "audio_path", "question": "question", "choices": "choices", "answer": "answer",
        "task": "modality", "layer": "category", "subcategory": "sub-category"}
MMSU = {"id": "id", "audio": "audio", "question": "question", "answer": "answer_gt", "task": "task_name",
        "category": "category", "subcategory": "sub-category",
        **{f"choice_{c}": f"choice_{c}" for c in "abcd"}}


def mmau(sources: list[str], options: Options) -> Result:
    return _convert(sources, options, "mmau", columns(MMAU, options.columns, "mmau"))


def mmar(sources: list[str], options: Options) -> Result:
    return _convert(sources, options, "mmar", columns(MMAR, options.columns, "mmar"))


def mmsu(sources: list[str], options: Options) -> Result:
    return _convert(sources, options, "mmsu", columns(MMSU, options.columns, "mmsu"))


def _convert(sources: list[str], options: Options, benchmark: str, cols: dict[str, str]) -> Result:
    result = Result(inputs=list(sources))
    per_audio: Counter[str] = Counter()
    for source in sources:
        for where, record in json_records(source, key="data"):
            try:
                record = json_object(where, record)
                row = _row(record, where, benchmark, cols, options)
                if record.get(cols["id"]) in (None, ""):  # MMAU test-mini has no ids: the audio names the question
                    stem = os.path.splitext(os.path.basename(row["audio"]))[0]
                    per_audio[stem] += 1
                    row["id"] = stem if per_audio[stem] == 1 else f"{stem}#{per_audio[stem]}"
                check_benchmark_row(row, where)
            except ManifestError as err:
                result.refuse(err, where)
                continue
            if result.add_id(row["id"], where):
                result.rows.append(row)
    return result


def _row(record: dict[str, Any], where: str, benchmark: str, cols: dict[str, str], options: Options) -> dict:
    question = text_field(record, cols["question"], where, "question")
    if "choices" in cols:
        choices = _choices(record.get(cols["choices"]), where, cols["choices"])
    else:  # MMSU: choice_a … choice_d, the empty ones left out
        choices = [str(record[cols[f"choice_{c}"]]).strip() for c in "abcd"
                   if record.get(cols[f"choice_{c}"]) not in (None, "") and str(record[cols[f"choice_{c}"]]).strip()]
    letter = answer_letter(record.get(cols["answer"]), choices, where, cols["answer"])
    audio = record.get(cols["audio"])
    if isinstance(audio, dict):  # a Hugging Face Audio column exported to JSON
        audio = audio.get("path")
    path = under_root(options.root, audio, where, cols["audio"])
    ident = record.get(cols["id"])
    return {
        "id": str(ident).strip() if ident not in (None, "") else "",
        "audio": manifest_path(path, options),
        "question": question,
        "choices": choices,
        "answer": letter,
        "answer_text": choices["ABCDEFGHIJ".index(letter)],
        "benchmark": benchmark,
        "task": _optional(record, cols.get("task")),
        "category": _optional(record, cols.get("category")),
        "subcategory": _optional(record, cols.get("subcategory")),
        "layer": _optional(record, cols.get("layer")),
        "duration": round(audio_seconds(path, where, cols["audio"], options.decode), 3),
    }


def _choices(value: Any, where: str, column: str) -> list[str]:
    """A list of choice strings; a list written as text (some exports) is parsed as a literal."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                pass
    if not isinstance(value, list) or not all(isinstance(c, str) and c.strip() for c in value):
        raise ManifestError(f"{where}: field {column!r} must be a list of non-empty strings, got {value!r}")
    return [c.strip() for c in value]


def _optional(record: dict[str, Any], column: str | None) -> str | None:
    value = record.get(column) if column else None
    return str(value).strip() if value not in (None, "") and str(value).strip() else None
