"""A full disk in one line: which file could not be written, and how much room its folder has.

``torch.save`` on a full disk raises ``RuntimeError: PytorchStreamWriter failed writing file
data/3: file write failed`` (no path); Python's own writes raise ``OSError(ENOSPC)``, a temporary
file's without the folder (a full ``TMPDIR``). :func:`no_space` turns either into
:class:`OutOfSpace`, naming the path (or ``TMPDIR`` and where it points) and the free bytes there;
the caller removes what it half-wrote.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

#: the errors of a write that found no room (ENOSPC; EDQUOT: a quota; EFBIG: a file size limit)
FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}


class OutOfSpace(OSError):
    """A write that found no room, named by its path (``agentcap`` prints it as one line, exit 1)."""

    def __str__(self) -> str:
        return str(self.strerror)


def is_full(err: BaseException) -> bool:
    """Whether ``err`` is a write that found no room (torch's stream writer included)."""
    if isinstance(err, OSError) and err.errno in FULL:
        return True
    return isinstance(err, RuntimeError) and "file write failed" in str(err)


def free(path: str) -> str:
    """``12.3 MB free on /mnt/runs`` for the nearest existing folder of ``path``."""
    folder = os.path.abspath(path)
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        left = shutil.disk_usage(folder).free
    except OSError:
        return f"{folder}: free space unknown"
    return f"{left / 1e6:.1f} MB free in {folder}"


def no_space(err: BaseException, path: str | None = None, what: str = "writing") -> OutOfSpace:
    """The one-line error for a full disk while ``what`` ``path`` (None: the error's own file, else TMPDIR)."""
    path = path or getattr(err, "filename", None)
    if path is None:
        where = f"a temporary file in TMPDIR ({tempfile.gettempdir()}; {free(tempfile.gettempdir())})"
        hint = "free space there or point TMPDIR at a folder with room"
    else:
        where = f"{path} ({free(os.path.dirname(os.path.abspath(path)))})"
        hint = "free space there or choose another folder"
    reason = os.strerror(err.errno) if isinstance(err, OSError) and err.errno else "no space left on device"
    return OutOfSpace(err.errno if isinstance(err, OSError) and err.errno else errno.ENOSPC,
                      f"{what} {where}: {reason}; {hint}")


def remove_partial(path: str) -> None:
    """Remove what a failed write left at ``path`` (a file or a folder of shards); never raises."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)
    except OSError:
        pass
