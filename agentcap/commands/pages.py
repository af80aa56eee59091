"""``agentcap fit --help=full`` and ``--print_config`` answered from a cache of the page a first run printed.

Both pages are jsonargparse's rendering of Lightning's ``Trainer`` and ``GRPOModule`` signatures, which
takes importing Lightning (torch, torchmetrics, transformers, torchvision: 10+ s, minutes on a busy
machine) only to print text that changes when its inputs do. The page is kept under a key of every
input it is made from: the command line and working folder, the bytes of the config files and the size
and time of every file they or the flags name, the installed distributions (their ``*.dist-info``
names), agentcap's sources, the Python, the terminal width and the environment variables jsonargparse,
Lightning and agentcap read. Any change is a miss: the page is rendered as before (by Lightning) and
kept again. A failed run (a refused key, exit status other than 0) keeps nothing.
``AGENTCAP_PAGE_CACHE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from agentcap.commands.menu import LIGHTNING

#: The launcher's spelling of jsonargparse's full help, and the config dump's flag.
PAGE_FLAGS = ("--help=full", "--print_config")
SWITCH = "AGENTCAP_PAGE_CACHE"
#: Environment variables that change a page (jsonargparse's settings, LightningCLI's ``PL_`` variables,
#: agentcap's own, colour and width).
ENV_PREFIXES = ("JSONARGPARSE_", "PL_", "LIGHTNING_", "AGENTCAP_")
ENV_NAMES = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "PYTHON_COLORS")
#: Pages kept; the oldest beyond this are deleted.
KEEP = 64
SOURCES = Path(__file__).resolve().parents[2]  # the folder holding agentcap/ and agentcap_envs/


def wanted(argv: list[str]) -> bool:
    """A Lightning command asking for a page only (no training): ``--help=full`` or ``--print_config[=…]``."""
    return bool(argv) and argv[0] in LIGHTNING and os.environ.get(SWITCH, "1") != "0" and any(
        arg == "--help=full" or arg.split("=", 1)[0] == "--print_config" for arg in argv[1:])


def folder() -> Path:
    return Path(os.environ.get("AGENTCAP_CACHE", Path.home() / ".cache" / "agentcap")) / "pages"


def key(argv: list[str]) -> str:
    """The hash of every input of the page ``argv`` asks for (module docstring)."""
    parts: dict[str, object] = {
        "argv": argv,
        "cwd": os.getcwd(),
        "python": [sys.version, sys.prefix, sys.executable],
        "distributions": _distributions(),
        "sources": _sources(),
        "terminal": [shutil.get_terminal_size().columns, sys.stdout.isatty()],
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES),
    }
    files: dict[str, object] = {}
    for word in argv[1:]:
        _note(word.split("=", 1)[-1], Path.cwd(), files)
    parts["files"] = sorted(files.items())
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _note(value: str, base: Path, files: dict[str, object]) -> None:
    """A word naming a file: its bytes' hash when it is YAML (a config; the strings in it are noted in
    turn, relative to it and to the working folder), else its size and time."""
    if not value or len(value) > 4096 or "\n" in value:
        return
    path = (base / value) if not os.path.isabs(value) else Path(value)
    try:
        if not path.is_file():
            return
        name = str(path.resolve())
        if name in files:
            return
        if path.suffix not in (".yaml", ".yml") or path.stat().st_size > 1 << 20:
            stat = path.stat()
            files[name] = [stat.st_size, stat.st_mtime_ns]
            return
        data = path.read_bytes()
    except (OSError, ValueError):
        return
    files[name] = hashlib.sha256(data).hexdigest()
    import yaml

    try:
        document = yaml.safe_load(data)
    except Exception:  # agentcap.cli names an unreadable config; its key is its bytes
        return
    for text in _strings(document):
        for where in (path.parent, Path.cwd()):
            _note(text, where, files)


def _strings(document: object) -> list[str]:
    if isinstance(document, str):
        return [document]
    if isinstance(document, dict):
        return [s for k, v in document.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(document, list):
        return [s for v in document for s in _strings(v)]
    return []


def _distributions() -> list[str]:
    """Every installed distribution's ``name-version.dist-info`` (or ``.egg-info``) folder on the path."""
    found = []
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found += [f"{entry}/{n}" for n in names if n.endswith((".dist-info", ".egg-info"))]
    return sorted(found)


def _sources() -> list[list[object]]:
    """Size and time of every module of agentcap and agentcap_envs (an edited signature or docstring)."""
    found = []
    for package in ("agentcap", "agentcap_envs"):
        for root, _, names in os.walk(SOURCES / package):
            for name in names:
                if name.endswith(".py"):
                    stat = os.stat(os.path.join(root, name))
                    found.append([os.path.join(root, name), stat.st_size, stat.st_mtime_ns])
    return sorted(found)


def lookup(argv: list[str]) -> str | None:
    """The kept page for ``argv``, or None."""
    try:
        return (folder() / f"{key(argv)}.txt").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


class _Tee(io.TextIOBase):
    """Writes through to the real stdout and keeps a copy."""

    def __init__(self, stream) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


@contextmanager
def recording(argv: list[str]):
    """Run the real page (Lightning), keeping what it prints when it ends with exit status 0."""
    name = key(argv)  # before Lightning loads: its imports must not change the key
    tee, stdout = _Tee(sys.stdout), sys.stdout
    sys.stdout = tee
    try:
        yield
    except SystemExit as done:
        if done.code in (None, 0):
            _keep(name, tee.copy.getvalue())
        raise
    finally:
        sys.stdout = stdout


def _keep(name: str, page: str) -> None:
    """Write the page atomically; delete the oldest beyond :data:`KEEP`. A cache that cannot be
    written is no error."""
    try:
        where = folder()
        where.mkdir(parents=True, exist_ok=True)
        partial = where / f".{name}.{os.getpid()}"
        partial.write_text(page, encoding="utf-8")
        os.replace(partial, where / f"{name}.txt")
        pages = sorted(where.glob("*.txt"), key=lambda p: p.stat().st_mtime_ns)
        for old in pages[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
