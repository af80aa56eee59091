"""The files the commands write: never one of their inputs, never a half-written result.

An output path is checked before any work starts (not an input, its folder can be created and
written), so a mistyped ``--out`` costs nothing. A result file is written to ``<out>.partial``
(each row flushed as it is written) and renamed onto ``<out>`` only when the command finishes, so
a run that stops early leaves the earlier ``<out>`` whole and its own rows in ``<out>.partial``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any


def same_path(a: str, b: str) -> bool:
    """``a`` and ``b`` name one file: the same inode when both exist (hard links), else the same real path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(command: str, flag: str, path: str, inputs: dict[str, str | Iterable[str] | None],
                 folder: bool = False) -> None:
    """Refuse ``path`` (given as ``flag``) when it is one of ``inputs`` (name → path(s)), or when it
    cannot be written; a file output's folder is created here."""
    for name, value in inputs.items():
        for given in [value] if isinstance(value, str) else value or []:
            if same_path(path, given):
                raise SystemExit(f"{command}: {flag} {path!r} is the {name} {given!r}; writing there would "
                                 f"destroy it: choose another {flag}")
    if folder:
        if os.path.exists(path) and not os.path.isdir(path):
            raise SystemExit(f"{command}: {flag} {path!r} is a file, not a folder")
        return
    if os.path.isdir(path):
        raise SystemExit(f"{command}: {flag} {path!r} is a folder; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise SystemExit(f"{command}: {flag} {path!r}: cannot create its folder {parent!r} ({err.strerror})") from None
    if not os.access(parent, os.W_OK):
        raise SystemExit(f"{command}: {flag} {path!r}: its folder {parent!r} is not writable")


class JsonlOutput:
    """JSON lines written to ``<path>.partial`` and flushed one by one; ``commit`` renames the file onto
    ``path``. Closed without ``commit`` (an exception in a ``with`` block), ``path`` is left as it was."""

    def __init__(self, path: str):
        self.path, self.partial = path, path + ".partial"
        self.handle = open(self.partial, "w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self.handle.write(json.dumps(row) + "\n")
        self.handle.flush()

    def commit(self) -> None:
        self.handle.close()
        os.replace(self.partial, self.path)

    def __enter__(self) -> JsonlOutput:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None and not self.handle.closed:
            self.commit()
        self.handle.close()
