"""Where the real recordings live: Debian's Asterisk prompts (speech) and a freedesktop sound theme.

Nothing here is downloaded at run time. ``tools/setup.sh`` unpacks the Debian packages into the
project's ``.assets/`` folder (``apt-get download`` + ``dpkg -x``, no install, ignored by git); an
installed package under ``/usr/share`` is found as well. Each locator looks in ``.assets/`` first,
then the system paths, and raises :class:`AssetError` with one line naming what is missing and the
command that provides it.

* ``asterisk-core-sounds-en-wav``: 568 prompts (8 kHz mono 16-bit WAV) read by Allison Smith,
  CC-BY-SA-3.0;
* ``asterisk-core-sounds-en``: their transcripts, ``name: text`` lines in ``core-sounds-en.txt.gz``;
* ``sound-theme-freedesktop``: short desktop sound effects (.oga), the ones used are CC-BY-3.0 or
  CC-BY-SA-3.0 (see ``agentcap_envs.real.speech.EFFECTS``).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

#: The project-local unpack folder (``dpkg -x PACKAGE.deb .assets``); ``AGENTCAP_ASSETS`` overrides it.
ASSETS = Path(os.environ.get("AGENTCAP_ASSETS", Path(__file__).resolve().parents[2] / ".assets"))

SPEECH_PACKAGE = "asterisk-core-sounds-en-wav"
TRANSCRIPT_PACKAGE = "asterisk-core-sounds-en"
EFFECTS_PACKAGE = "sound-theme-freedesktop"

_RECORDINGS = ("usr/share/asterisk/sounds/en_US_f_Allison", "usr/share/asterisk/sounds/en")
_TRANSCRIPTS = ("usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz",)
_EFFECTS = ("usr/share/sounds/freedesktop/stereo",)


class AssetError(FileNotFoundError):
    """A real-world asset is missing or unreadable; the message is one line naming it and the fix."""


def _fix(package: str) -> str:
    return (f"run `bash tools/setup.sh`, or `apt-get download {package} && dpkg -x {package}_*.deb {ASSETS}` "
            f"(or `apt-get install {package}`)")


def _candidates(relative: tuple[str, ...]) -> list[Path]:
    return [ASSETS / r for r in relative] + [Path("/") / r for r in relative]


def _find(relative: tuple[str, ...], want_dir: bool, what: str, package: str) -> Path:
    for path in _candidates(relative):
        if (path.is_dir() and any(path.iterdir())) if want_dir else path.is_file():
            return path
    looked = ", ".join(str(p) for p in _candidates(relative))
    raise AssetError(f"{what} not found (looked in {looked}); {_fix(package)}")


def recordings_dir() -> Path:
    """The folder of Allison's WAV prompts (``name.wav`` and ``digits/1.wav`` style sub-folders)."""
    return _find(_RECORDINGS, True, "Asterisk speech recordings", SPEECH_PACKAGE)


def transcripts_file() -> Path:
    """``core-sounds-en.txt.gz`` (or a plain-text copy of it)."""
    return _find(_TRANSCRIPTS, False, "Asterisk prompt transcripts (core-sounds-en.txt.gz)", TRANSCRIPT_PACKAGE)


def effects_dir() -> Path:
    """The freedesktop sound theme's ``stereo`` folder of .oga effects."""
    return _find(_EFFECTS, True, "freedesktop sound effects", EFFECTS_PACKAGE)


def read_transcripts(path: str | os.PathLike | None = None) -> dict[str, str]:
    """``{name: text}`` from ``name: text`` lines (``;`` starts a comment); names keep sub-folders
    (``digits/1``). A file that is not such a list raises :class:`AssetError` naming it and the line."""
    path = Path(path) if path is not None else transcripts_file()
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8", errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise AssetError(f"transcripts {path}: cannot read ({error}); {_fix(TRANSCRIPT_PACKAGE)}") from None
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise AssetError(f"transcripts {path}:{number}: expected 'name: text', got {line[:80]!r}")
        out[name.strip()] = value.strip()
    if not out:
        raise AssetError(f"transcripts {path}: no 'name: text' lines; {_fix(TRANSCRIPT_PACKAGE)}")
    return out


def transcripts() -> dict[str, str]:
    """``{recording name: transcript}`` from the located transcripts file."""
    return read_transcripts(transcripts_file())
