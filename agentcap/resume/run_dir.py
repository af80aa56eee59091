"""Who may write a run_dir: one training process at a time, and only a folder that can be written.

Two ``fit`` processes on one run_dir would both append every sample row and overwrite each other's
checkpoints, so the process that trains holds ``<run_dir>/.lock``: an ``flock`` on the file (the
kernel drops it when the process dies, however it dies) and a JSON body naming the holder's pid and
host, so that a refused command can say who holds it. A body left behind without the lock is a
holder that ended without releasing it (killed): it is taken over, saying so.

``filelock`` (installed with torch) wraps the same ``flock`` but records no holder on its native lock,
so the few lines here do it directly.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from errno import EACCES, EAGAIN, EWOULDBLOCK
from typing import Any


class RunLock:
    """``<run_dir>/.lock``, held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    NAME = ".lock"

    def __init__(self, run_dir: str, command: str = "agentcap fit"):
        self.run_dir, self.command = run_dir, command
        self.path = os.path.join(run_dir, self.NAME)
        self._fd: int | None = None

    def acquire(self, report=None) -> "RunLock":
        """Take the lock or refuse (``SystemExit`` naming the holder's pid and host)."""
        report = report or (lambda message: print(message, file=sys.stderr))
        os.makedirs(self.run_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # never O_TRUNC: the holder's body stays
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read(fd)
            os.close(fd)
            if err.errno not in (EACCES, EAGAIN, EWOULDBLOCK):
                raise SystemExit(f"{self.command}: cannot lock {self.path} ({err.strerror})") from None
            who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}" if holder else "another process"
            since = f" since {holder['started']}" if holder.get("started") else ""
            raise SystemExit(
                f"{self.command}: {self.run_dir} is in use by {who}{since} ({self.path}); "
                "wait for it to end, stop it, or choose another --model.run_dir"
            ) from None
        previous = _read(fd)
        if previous:  # a body without a lock: its holder ended without releasing it
            state = "no longer running" if _dead_here(previous) else "its lock was released"
            report(f"agentcap: {self.path}: taking over the stale lock of pid {previous.get('pid', '?')} "
                   f"on {previous.get('host', '?')} ({state})")
        body = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(body) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Empty the body, then unlock: an empty ``.lock`` is a run nobody trains. The file stays (a
        process waiting on it holds the same inode; removing it would let a third lock another one)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing drops the flock


def _read(fd: int) -> dict[str, Any]:
    """The lock file's body; {} when empty or unreadable (an old or foreign file)."""
    text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    try:
        body = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _dead_here(holder: dict[str, Any]) -> bool:
    """Whether ``holder`` names a process of this host that no longer exists."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, another user's
        return False
    return False


def check_writable(run_dir: str, command: str) -> None:
    """Refuse, in one line, a run_dir that cannot be written, before anything is built or evaluated.

    The run_dir, or the nearest folder above it that exists (``fit`` creates the rest), must take a
    new file: a real write, because permission bits say nothing for root or a read-only mount."""
    folder = os.path.abspath(run_dir)
    while not os.path.isdir(folder):
        if os.path.exists(folder):
            raise SystemExit(f"{command}: --model.run_dir {run_dir}: {folder} is a file, not a folder")
        folder = os.path.dirname(folder)
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise SystemExit(f"{command}: --model.run_dir {run_dir} cannot be written ({folder}: {err.strerror}); "
                         "choose a writable --model.run_dir") from None


#: The W&B run id of a run_dir: every restart of the run logs to the same W&B run.
WANDB_ID = "wandb_id"


def logger_run_id(run_dir: str, name: str = WANDB_ID) -> str:
    """The run_dir's logger run id (``<run_dir>/wandb_id``), made and stored on first use.

    From ``os.urandom``, not ``random``: drawing it must not move a seeded run's random state."""
    path = os.path.join(run_dir, name)
    try:
        with open(path, encoding="utf-8") as handle:
            stored = handle.read().strip()
        if stored:
            return stored
    except FileNotFoundError:
        pass
    run_id = os.urandom(6).hex()
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(run_id + "\n")
    os.replace(path + ".tmp", path)
    return run_id
