"""Per-item held-out values of an evaluate stage, one JSONL row per item.

Why: a stage's means in ``summary.json`` hide how much they vary. Paired differences per item
(after − before on the same clip) and correlations over items (ACE-Cap's questions per episode
against a clip's event count) need the values of every item; ``tools/seed_stats.py`` reads them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any


def eval_items_path(run_dir: str, stage: str, rank: int = 0, world: int = 1) -> str:
    """``<run_dir>/eval/<stage>.jsonl`` (``.rank<r>`` before the suffix when several ranks write)."""
    suffix = "" if world == 1 else f".rank{rank}"
    return os.path.join(run_dir, "eval", f"{stage}{suffix}.jsonl")


def write_eval_items(run_dir: str, stage: str, rows: Sequence[dict[str, Any]], rank: int = 0, world: int = 1) -> str:
    """Write this rank's rows (``id`` plus every numeric value the stage averaged); returns the path."""
    path = eval_items_path(run_dir, stage, rank, world)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(path + ".tmp", path)
    return path


def read_eval_items(run_dir: str, stage: str) -> dict[str, dict[str, float]]:
    """Every rank's rows of one stage, keyed by item id."""
    folder = os.path.join(run_dir, "eval")
    names = sorted(n for n in os.listdir(folder) if n == f"{stage}.jsonl" or (n.startswith(f"{stage}.rank") and n.endswith(".jsonl")))
    if not names:
        raise FileNotFoundError(f"{folder}: no per-item rows for stage {stage!r}")
    rows: dict[str, dict[str, float]] = {}
    for name in names:
        with open(os.path.join(folder, name)) as handle:
            for line in handle:
                row = json.loads(line)
                rows[row.pop("id")] = row
    return rows
