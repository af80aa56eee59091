"""What ``agentcap predict`` writes: the test split's captions, ``<run_dir>/predictions.jsonl``."""

from __future__ import annotations

import json
import os
from typing import Any

from agentcap.parallel.distributed import world


def write_predictions(run_dir: str, rows: list[dict[str, Any]]) -> str:
    """``<run_dir>/predictions.jsonl`` (``predictions.rank<R>.jsonl`` per process under data parallel)."""
    rank, size = world()
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "predictions.jsonl" if size == 1 else f"predictions.rank{rank}.jsonl")
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return path
