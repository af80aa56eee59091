"""The files the commands write: never one of their inputs, never a half-written result.

An output path is checked before any work starts (not an input, its folder can be created and
written), so a mistyped ``--out`` costs nothing. A result file is written to ``<out>.partial``
(each row flushed as it is written) and renamed onto ``<out>`` only when the command finishes, so
a run that stops early leaves the earlier ``<out>`` whole and its own rows in ``<out>.partial``.
"""

from __future__ import annotations

import errno
import fcntl
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


def _lock_holder(fd: int) -> str:
    """``pid 1234`` of the process holding an flock on ``fd``'s file (from /proc/locks), or ``another process``."""
    inode = os.fstat(fd).st_ino
    try:
        with open("/proc/locks", encoding="ascii") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
                    return f"pid {parts[4]}"
    except OSError:
        pass
    return "another process"


class OutputBusy(SystemExit):
    """Another process writes this output: a usage error (exit status 2, as for a refused flag), which
    ``agentcap.launcher`` prints in one line; ``str()`` is the message."""

    exit_code = 2


def lock_output(command: str, flag: str, path: str) -> int:
    """An open descriptor of ``<path>.partial``, emptied and held under an exclusive ``flock`` (dropped
    when it is closed, or the process ends however it ends); :class:`OutputBusy` naming ``path`` and
    the holder's pid when another process writes it (two writers left NUL bytes and lost the first
    one's rows). The file is opened without truncating: a refused second writer changes nothing."""
    partial = path + ".partial"
    while True:
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _lock_holder(fd)
            os.close(fd)
            if err.errno not in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK):
                raise SystemExit(f"{command}: cannot lock {partial} ({err.strerror})") from None
            raise OutputBusy(f"{command}: {flag} {path} is being written by {holder} ({partial} is locked); "
                             f"wait for it to end, stop it, or choose another {flag}") from None
        try:
            same = os.stat(partial).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file the previous holder renamed onto ``path`` meanwhile
            os.ftruncate(fd, 0)
            return fd
        os.close(fd)


class JsonlOutput:
    """JSON lines written to ``<path>.partial`` and flushed one by one; ``commit`` renames the file onto
    ``path``. Closed without ``commit`` (an exception in a ``with`` block), ``path`` is left as it was.
    The partial file is locked while it is written: a second process writing ``path`` is refused."""

    def __init__(self, path: str, command: str = "agentcap", flag: str = "--out"):
        self.path, self.partial, self.command = path, path + ".partial", command
        self.handle = open(lock_output(command, flag, path), "w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        try:
            self.handle.write(json.dumps(row) + "\n")
            self.handle.flush()
        except OSError as err:
            from agentcap.resume.disk import is_full, no_space

            if not is_full(err):
                raise
            # a full disk: one line naming the file (was: two ENOSPC tracebacks and a torn .partial left)
            try:
                self.handle.close()
            except OSError:
                pass  # its last flush fails the same way
            os.unlink(self.partial)  # half written; ``path`` keeps what it held
            raise SystemExit(f"{self.command}: {no_space(err, self.partial)}") from None

    def commit(self) -> None:
        self.handle.flush()
        os.replace(self.partial, self.path)  # renamed while still locked: no second writer can take it over
        self.handle.close()

    def __enter__(self) -> JsonlOutput:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None and not self.handle.closed:
            self.commit()
        self.handle.close()
