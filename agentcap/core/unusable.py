"""Manifest rows found unusable when they are used, not at load (``on_error: skip``).

Audio is checked by its header at load and decoded when an item is used (``agentcap.core.manifests``),
so a clip with NaN samples or a truncated stream is only found by the reset that shows it. Under
``on_error: skip`` that row is marked on the row itself (every environment of a rollout pool shares
the loaded row dicts, so the G rollouts of a group and later steps pass it by without decoding it
again), named once on stderr, and counted per manifest for ``data/<split>/skipped_rows``; the
environment then takes the next usable row, so the choice depends only on the data, not on which
rollout or rank found the row first.
"""

from __future__ import annotations

import sys
from typing import Any

#: The row key that holds why a row was found unusable at use.
MARK = "_unusable"

#: Per manifest (None: an environment built from items), the reason of each row found unusable at
#: use, by its ``file:line`` (process-wide: the environments of a pool are built apart).
_FOUND: dict[str | None, dict[str, str]] = {}


def reason(row: dict[str, Any]) -> str | None:
    """Why ``row`` was found unusable when used, or None."""
    return row.get(MARK)


def mark(row: dict[str, Any], manifest: str | None, message: str) -> None:
    """Mark ``row`` unusable; the first time a row is marked, say so in one line and count it."""
    if MARK in row:
        return
    row[MARK] = message
    found = _FOUND.setdefault(manifest, {})
    where = str(row.get("_where") or message)
    if where not in found:
        found[where] = message
        print(f"agentcap: skipped when used (on_error: skip): {message}", file=sys.stderr, flush=True)


def found(manifest: str | None) -> dict[str, str]:
    """The rows of ``manifest`` found unusable at use so far: ``{file:line: reason}``."""
    return dict(_FOUND.get(manifest, {}))
