"""The per-item rows of an evaluate stage, ``<run_dir>/eval/<stage>.jsonl``: one JSONL row per
held-out item, in item order.

A row holds what a reader of the captions needs (id, caption, reference; READ's context, ACE-Cap's
evidence trace) and every value the stage averaged, under its ``summary.json`` name (reward, each
component, each numeric episode extra). Why per item: a stage's means hide how much they vary.
Paired differences per item (after − before on the same clip) and correlations over items
(ACE-Cap's questions per episode against a clip's event count) need the values of every item;
``tools/seed_stats.py`` reads them, and the stage's benchmark questions
(``<run_dir>/benchmarks/<stage>/benchmark_items.jsonl``, ``read_benchmark_items``) the same way: a
gain of a few questions in 37 is only visible paired question by question. The file is also a
predictions file for ``agentcap evaluate --predictions`` (it has ``id``, ``caption`` and READ's
``context``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any


def eval_items_path(run_dir: str, stage: str) -> str:
    """``<run_dir>/eval/<stage>.jsonl``."""
    return os.path.join(run_dir, "eval", f"{stage}.jsonl")


def write_eval_items(run_dir: str, stage: str, rows: Sequence[dict[str, Any]]) -> str:
    """Write every item's row (rank 0 only under data parallel: the rows are already gathered),
    replacing the file atomically; returns the path."""
    path = eval_items_path(run_dir, stage)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(path + ".tmp", path)
    return path


def read_eval_items(run_dir: str, stage: str) -> dict[str, dict[str, Any]]:
    """One stage's rows keyed by item id (in item order), without the id."""
    path = eval_items_path(run_dir, stage)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no per-item rows for stage {stage!r}")
    rows: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                rows[row.pop("id")] = row
    return rows


def read_benchmark_rows(run_dir: str, stage: str) -> dict[str, dict[str, Any]]:
    """One stage's ``benchmarks/<stage>/benchmark_items.jsonl`` rows keyed by question id (each with
    ``correct``, the judge's ``letter``, ``category``…). Empty when the stage asked no benchmark."""
    path = os.path.join(run_dir, "benchmarks", stage, "benchmark_items.jsonl")
    if not os.path.isfile(path):
        return {}
    rows: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows[row["id"]] = {**row, "correct": bool(row["correct"])}
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}, line {number}: not a benchmark item with 'id' and 'correct' ({err})") from None
    return rows


def read_benchmark_items(run_dir: str, stage: str) -> dict[str, dict[str, float]]:
    """The per-item values of a stage's benchmark metrics, keyed ``benchmark:<question id>``:
    ``benchmark/accuracy`` and ``benchmark/<category>``, 1.0 when the judge chose the answer, else 0.0."""
    items: dict[str, dict[str, float]] = {}
    for question, row in read_benchmark_rows(run_dir, stage).items():
        items[f"benchmark:{question}"] = {"benchmark/accuracy": float(row["correct"])}
        if row.get("category"):
            items[f"benchmark:{question}"][f"benchmark/{row['category']}"] = float(row["correct"])
    return items
