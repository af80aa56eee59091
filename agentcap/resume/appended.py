"""Reading back a JSONL file agentcap appends to (``samples.jsonl``): a kill mid-write leaves a torn
last line, which is dropped, naming the file and the line, instead of a bare ``JSONDecodeError``."""

from __future__ import annotations

import json
import sys
from typing import Any


def read_appended(path: str, report=None) -> list[tuple[str, dict[str, Any]]]:
    """Every whole row of ``path`` as ``(line, row)``; rows that do not parse (a torn last line, a
    line of other bytes) are left out and named in one line each: ``samples.jsonl:7: …; dropped``."""
    report = report or (lambda message: print(message, file=sys.stderr))
    rows: list[tuple[str, dict[str, Any]]] = []
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
            if not isinstance(row, dict):
                raise ValueError(f"a {type(row).__name__}, not a row")
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            torn = number - 1 == last
            what = "a torn last line (the process was killed while writing it)" if torn else f"not a JSON row ({err})"
            report(f"agentcap: {path}:{number}: {what}; dropped")
            continue
        rows.append((raw.decode("utf-8") + "\n", row))
    return rows
