"""Manifests and media loading: the rows a task reads, checked as they load.

Every error names the file, the row and the field, so a user can fix a bad manifest in one go.
Rows that cannot be used are either refused at load (``on_error="raise"``) or skipped and counted
(``on_error="skip"``); a load that loses more than ``max_skip_fraction`` of its rows stops.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from agentcap.core.hf_datasets import DatasetSource, dataset_rows, parse_source
from agentcap.core.hf_datasets import stamp as dataset_stamp


class ManifestError(ValueError):
    """A manifest row, or a file it points to, is unusable. The message names file, row and field."""


def audio_id(path: str) -> str:
    """The id of an audio file's item: its file name without the extension (``clips/birds.wav`` →
    ``birds``), as ``agentcap data convert`` names converted clips and ``agentcap caption --audio``
    names its rows, so predictions match a converted manifest."""
    return os.path.splitext(os.path.basename(path))[0]


def resolve(path: str, manifest: str | None) -> str:
    """Media paths in a manifest are relative to the manifest's folder unless absolute."""
    if manifest is None or os.path.isabs(path):
        return path
    return str(Path(manifest).parent / path)


@dataclass
class SkipReport:
    """How many rows a load refused, and why; logged by the module so nothing is lost silently."""

    total: int = 0
    skipped: list[str] = field(default_factory=list)
    #: The ``id`` of each refused row (None where the row has none), parallel to ``skipped``.
    ids: list[Any] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return len(self.skipped) / max(self.total, 1)

    def refuse(self, message: str, row_id: Any = None) -> None:
        self.skipped.append(message)
        self.ids.append(row_id)


class NoUsableRows(ManifestError):
    """Every row of a manifest was refused; ``report`` holds each reason and row id."""

    def __init__(self, message: str, report: SkipReport):
        super().__init__(message)
        self.report = report


def read_manifest(
    path: str,
    required: dict[str, type | tuple[type, ...]] | None = None,
    check: Callable[[dict[str, Any], str], None] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    max_skip_fraction: float = 0.1,
    report: SkipReport | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Read a JSONL manifest or a Hugging Face dataset (``agentcap.core.hf_datasets``: ``hf://org/name``,
    a save_to_disk folder, parquet / json / csv files); each row is checked for ``required`` fields
    and by ``check``.

    Streamed: with ``limit``, reading stops at the ``limit``-th usable row, so ``--limit 10`` of a
    million-row manifest reads and checks a prefix, not the file (rows refused on the way are
    refused or counted as without a limit; ``max_skip_fraction`` counts the rows read).

    Loaded once per process and manifest version: a rollout pool builds one environment per
    trajectory, and each would otherwise re-read and re-validate every row (and probe every media
    file). The cache key is the file's path, modification time and size plus the checks (``check``
    by its class and name, and the instance attributes it names in ``check_settings``: an
    environment's ``check_item`` reads the row and those), and ``limit``; later callers get the same
    row dicts and the same skip report.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an int >= 1 or None, got {limit!r}")
    try:
        source = parse_source(path)  # a Hugging Face dataset (agentcap.core.hf_datasets), or None: JSONL
    except ValueError as err:
        raise ManifestError(str(err)) from None
    if source is None and not os.path.isfile(path):
        raise ManifestError(f"{path}: manifest not found")
    report = report if report is not None else SkipReport()
    key = _manifest_key(path, required, check, on_error, max_skip_fraction, source, limit)
    if key is not None and key in _MANIFESTS:
        rows, skipped, ids, total = _MANIFESTS[key]
        report.total += total
        report.skipped.extend(skipped)
        report.ids.extend(ids)
        return list(rows)
    before_total, before_skipped = report.total, len(report.skipped)
    if source is None:
        rows = _read_rows(path, required, check, on_error, report, limit)
    else:
        rows = _read_dataset(source, required, check, on_error, report, limit)
    if report.fraction > max_skip_fraction:
        shown = "\n  ".join(report.skipped[:5])
        raise ManifestError(
            f"{path}: {len(report.skipped)} of {report.total} rows are unusable "
            f"(more than max_skip_fraction={max_skip_fraction}); first ones:\n  {shown}"
        )
    refused = SkipReport(report.total - before_total, report.skipped[before_skipped:], report.ids[before_skipped:])
    if not rows and refused.skipped:  # say why, not only that nothing is left
        shown = "\n  ".join(refused.skipped[:5])
        raise NoUsableRows(f"{path}: all {len(refused.skipped)} rows are refused; the first "
                           f"{min(5, len(refused.skipped))}:\n  {shown}", refused)
    if key is not None:
        _MANIFESTS[key] = (rows, refused.skipped, refused.ids, refused.total)
    return list(rows)


#: Loaded manifests by (path, mtime, size, checks, limit): see ``read_manifest``.
_MANIFESTS: dict[tuple, tuple[list[dict[str, Any]], list[str], list[Any], int]] = {}


def _manifest_key(path, required, check, on_error, max_skip_fraction, source=None, limit=None) -> tuple | None:
    owner = getattr(check, "__self__", None)
    if check is not None and owner is None:
        return None  # a free function may close over anything: not cached
    if source is None:
        stat = os.stat(path)
        version: tuple = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    else:
        version = (path, dataset_stamp(source))
    fields = tuple(sorted((name, _type_name(kind)) for name, kind in (required or {}).items()))
    settings = tuple(repr(getattr(owner, name, None)) for name in getattr(owner, "check_settings", ()))
    checker = None if check is None else (type(owner).__module__, type(owner).__qualname__, check.__name__, settings)
    return (*version, fields, checker, on_error, max_skip_fraction, limit)


def _read_dataset(source: DatasetSource, required, check, on_error, report: SkipReport,
                  limit: int | None = None) -> list[dict[str, Any]]:
    """A Hugging Face dataset's rows, through the same ``check_row`` as a JSONL line (the first
    ``limit`` usable ones)."""
    rows: list[dict[str, Any]] = []
    try:
        for where, row in dataset_rows(source):
            report.total += 1
            try:
                check_row(row, where, source.manifest, required, check)
            except ManifestError as err:
                if on_error == "raise":
                    raise
                report.refuse(str(err), row.get("id"))
                continue
            rows.append(row)
            if len(rows) == limit:
                break  # streamed: the rows past the limit are not read
    except ValueError as err:
        if isinstance(err, ManifestError):
            raise
        raise ManifestError(str(err)) from None  # the dataset itself: not found, no such split or column
    return rows


def _read_rows(path, required, check, on_error, report: SkipReport, limit: int | None = None) -> list[dict[str, Any]]:
    """A JSONL manifest's rows, line by line, up to the ``limit``-th usable one."""
    rows: list[dict[str, Any]] = []
    with open(path, "rb") as handle:  # bytes: one undecodable line must cost only that line
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            report.total += 1
            where = f"{path}:{number}"
            row: Any = None
            try:
                line = decode_line(raw, where)
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ManifestError(f"{where}: not valid JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise ManifestError(f"{where}: expected a JSON object, got {type(row).__name__}")
                check_row(row, where, path, required, check)
            except ManifestError as err:
                if on_error == "raise":
                    raise
                report.refuse(str(err), _row_id(row, raw))
                continue
            rows.append(row)
            if len(rows) == limit:
                break  # streamed: the lines past the limit are not read
    return rows


def check_row(row: dict[str, Any], where: str, manifest: str | None, required, check) -> None:
    """The checks every row gets, from JSONL or a Hugging Face dataset: ``required`` fields and
    types, then the task's ``check``; ``_where`` / ``_manifest`` let later errors and media paths
    name and find their source."""
    for name, kind in (required or {}).items():
        if name not in row:
            raise ManifestError(f"{where}: missing field {name!r} (row has {sorted(row)})")
        if not isinstance(row[name], kind):
            raise ManifestError(f"{where}: field {name!r} must be {_type_name(kind)}, got {row[name]!r}")
    row["_where"] = where
    row["_manifest"] = manifest
    if check is not None:
        check(row, where)


def decode_line(raw: bytes, where: str) -> str:
    """One line of a UTF-8 text file; a bad byte is named with its 1-based column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManifestError(
            f"{where}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
        ) from None


def _row_id(row: Any, raw: bytes) -> Any:
    """The ``id`` of a refused row, so its error row can be matched; read past bad bytes if need be."""
    if row is None:
        try:
            row = json.loads(raw.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:
            return None
    return row.get("id") if isinstance(row, dict) else None


def _type_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def load_features(path: str, where: str = "") -> np.ndarray:
    """Precomputed clip features (``.npy``), as float32."""
    if not os.path.isfile(path):
        raise ManifestError(f"{where}: feature file {path!r} not found")
    try:
        return np.load(path, allow_pickle=False).astype(np.float32)
    except (ValueError, OSError) as err:
        raise ManifestError(f"{where}: feature file {path!r} is unreadable ({err})") from None


#: Decoded waveforms kept for reuse (most recently used last); see ``load_audio``.
_WAVEFORMS: OrderedDict[tuple, np.ndarray] = OrderedDict()
WAVEFORM_CACHE_SIZE = 128


def load_audio(path: str, sample_rate: int, where: str = "", max_seconds: float | None = None) -> np.ndarray:
    """Mono float32 waveform at ``sample_rate``; any format soundfile reads (wav, flac, ogg, mp3).

    Only the first ``max_seconds`` are decoded and resampled, so memory follows the kept length,
    not the file's (a 2 GB WAV cut at 30 s took 8.7 GB when it was decoded whole). Decoded once:
    the G rollouts of an item and every turn of an episode that shows the audio again get a copy of
    the cached samples (a memcpy; Gymnasium wants every observation to own its data), until the
    file changes or ``WAVEFORM_CACHE_SIZE`` newer clips push it out.
    """
    if not os.path.isfile(path):
        raise ManifestError(f"{where}: audio file {path!r} not found")
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size, sample_rate, max_seconds)
    wave = _WAVEFORMS.get(key)
    if wave is None:
        wave = _decode_audio(path, sample_rate, where, max_seconds)
        wave.flags.writeable = False
        _WAVEFORMS[key] = wave
        while len(_WAVEFORMS) > WAVEFORM_CACHE_SIZE:
            _WAVEFORMS.popitem(last=False)
    _WAVEFORMS.move_to_end(key)
    return wave.copy()


def _decode_audio(path: str, sample_rate: int, where: str, max_seconds: float | None) -> np.ndarray:
    import soundfile
    import torchaudio.functional as AF

    if not os.path.isfile(path):
        raise ManifestError(f"{where}: audio file {path!r} not found")
    if os.path.getsize(path) == 0:
        raise ManifestError(f"{where}: audio file {path!r} is empty")
    try:
        with soundfile.SoundFile(path) as handle:  # read only the kept part: memory follows max_seconds
            rate, header = handle.samplerate, handle.frames
            wanted = header if max_seconds is None else min(header, _kept_frames(max_seconds, rate))
            wave = handle.read(wanted, dtype="float32", always_2d=True)
    except Exception as err:  # soundfile raises its own LibsndfileError and RuntimeError kinds
        raise ManifestError(f"{where}: audio file {path!r} is corrupt or unsupported ({err})") from None
    if wave.shape[0] == 0:
        raise ManifestError(f"{where}: audio file {path!r} has no samples")
    check_samples(wave, 0, rate, where, path)  # NaN / Inf / absurd values: refused, not captioned as ""
    expected = min(header, int(max_seconds * rate)) if max_seconds is not None else header
    if expected - wave.shape[0] > _allowance(expected, rate):
        raise AudioDecodeError(
            f"{where}: audio file {path!r} decodes to {wave.shape[0]} frames ({wave.shape[0] / rate:.3f} s) but "
            f"its header says {header} ({header / rate:.3f} s): truncated or damaged; re-encode or drop it"
        )
    mono = torch.from_numpy(wave.mean(axis=1))
    del wave  # a multichannel file's frames are not needed past the mix
    if rate != sample_rate:
        mono = AF.resample(mono, rate, sample_rate)
    if max_seconds is not None:
        mono = mono[: int(max_seconds * sample_rate)]
    return mono.numpy().astype(np.float32, copy=False)


def _kept_frames(max_seconds: float, rate: int) -> int:
    """Frames read for ``max_seconds`` at ``rate``: the cut plus 20 ms, so the resampler's filter
    sees the samples just past the cut as it did when the whole file was decoded."""
    return int(max_seconds * rate) + rate // 50


#: How far a decoded length may fall short of (or exceed) the header's: 2 % or 0.1 s, whichever is
#: larger (MP3 / Vorbis headers count encoder padding; a truncated file misses far more).
DECODE_TOLERANCE = (0.02, 0.1)


class AudioDecodeError(ManifestError):
    """The audio file opens but does not decode to what its header promises (truncated, zero frames)."""


def _allowance(frames: int, rate: float) -> float:
    """How many frames a decoded length may be off ``frames`` (see ``DECODE_TOLERANCE``)."""
    relative, seconds = DECODE_TOLERANCE
    return max(relative * frames, seconds * rate)


def check_audio(row: dict[str, Any], field: str, where: str, max_seconds: float | None = None,
                decode: bool = True) -> float:
    """Refuse a row whose audio is missing, empty, unreadable, does not decode, or decodes to NaN /
    Inf / out-of-range samples (``check_samples``); returns its duration.

    The duration is the *decoded* length: a truncated MP3's header still announces the whole clip,
    and the duration curriculum must not believe it. ``max_seconds``: the part ``load_audio`` will
    keep, decoded in full (the rest is checked at its end only; see ``decoded_duration``).

    ``decode=False``: the load check of a streamed manifest, without decoding (a header read, not
    ~2 ms a row): missing, empty and unreadable files and headers announcing no frames are refused;
    the header's duration is returned. What only decoding finds (a truncated file, bad samples) is
    then found when the item is used: ``load_audio`` with ``where=audio_where(...)`` names the
    manifest file, row and field as this check does.
    """
    path = resolve(row[field], row.get("_manifest"))
    if not os.path.isfile(path):
        raise ManifestError(f"{where}: field {field!r}: file {path!r} not found")
    if os.path.getsize(path) == 0:
        raise ManifestError(f"{where}: field {field!r}: file {path!r} is empty")
    if decode:
        return decoded_duration(path, f"{where}: field {field!r}", max_seconds)
    seconds = audio_duration(path, f"{where}: field {field!r}")
    if seconds <= 0:
        raise AudioDecodeError(f"{where}: field {field!r}: audio file {path!r} has no audio frames (header: 0 frames)")
    return seconds


def audio_where(item: dict[str, Any], field: str, path: str) -> str:
    """How errors of an item's audio at use name it: ``file:line: field 'audio'`` for a manifest row
    (as the load checks do), the file itself for an item made from a raw audio file."""
    where = item.get("_where")
    return f"{where}: field {field!r}" if where else path


def audio_duration(path: str, where: str = "") -> float:
    """The header's duration (cheap; does not decode). ``decoded_duration`` is the checked one."""
    import soundfile

    try:
        info = soundfile.info(path)
    except Exception as err:
        raise ManifestError(f"{where}: audio file {path!r} is unreadable ({err})") from None
    return float(info.frames) / float(info.samplerate)


def decoded_duration(path: str, where: str = "", max_seconds: float | None = None) -> float:
    """Check that a file decodes to its header's length, in bounded memory; returns the seconds decoded.

    The first ``max_seconds`` (what ``load_audio`` keeps; all of it when None) are decoded in full.
    Of the rest only the stretch where the header says the file ends is decoded, after a seek: a
    truncated file has nothing there, a whole one ends within ``DECODE_TOLERANCE`` of the header.
    Memory is one block of frames whatever the file's length.
    """
    import soundfile

    at_most = False  # True: nothing decodes past the seek, so the file ends at or before it
    try:
        with soundfile.SoundFile(path) as handle:
            rate, header = handle.samplerate, handle.frames
            allowance = _allowance(header, rate)
            limit = header + int(allowance) + 1  # a file that decodes this far is refused: stop there
            head = header if max_seconds is None else min(header, _kept_frames(max_seconds, rate))
            end = _decode_until(handle, head if head < header else limit, where=where, path=path)
            if end == head < header:  # the kept part is whole; now where the header says it ends
                start = max(head, header - int(allowance))
                try:
                    handle.seek(start)
                except RuntimeError:  # libsndfile refuses a seek past what it can decode
                    end, at_most = start, True
                else:
                    end = _decode_until(handle, limit, where=where, path=path)
                    at_most = end == start
    except AudioDecodeError:  # bad samples (check_samples)
        raise
    except Exception as err:  # soundfile raises its own LibsndfileError and RuntimeError kinds
        raise ManifestError(f"{where}: audio file {path!r} is unreadable ({err})") from None
    if end == 0:
        raise AudioDecodeError(f"{where}: audio file {path!r} has no audio frames (header: {header} frames)")
    if at_most or abs(end - header) > allowance:
        raise AudioDecodeError(
            f"{where}: audio file {path!r} decodes to {'at most ' if at_most else ''}{end} frames "
            f"({end / rate:.3f} s) but its header says {header} ({header / rate:.3f} s): truncated or damaged; "
            f"re-encode or drop it"
        )
    return end / rate


def _decode_until(handle: Any, stop: int, block: int = 1 << 16, where: str = "", path: str = "") -> int:
    """Decode from the handle's position to frame ``stop`` or the end, a block at a time (the
    samples are checked by ``check_samples``, then dropped); returns the frame reached."""
    position = handle.tell()
    while position < stop and len(samples := handle.read(min(block, stop - position), dtype="float32")):
        check_samples(samples, position, handle.samplerate, where, path)
        position += len(samples)
    return position


#: The largest sample magnitude accepted after decoding (full scale is ±1: integer formats decode
#: within it; a float file may run hot, but 12 dB past full scale is damage or a wrong scale).
MAX_SAMPLE = 4.0


def check_samples(samples: np.ndarray, first: int, rate: float, where: str, path: str) -> None:
    """Refuse decoded samples that are NaN / Inf or beyond ±``MAX_SAMPLE`` (:class:`AudioDecodeError`
    naming the file and the time of the first bad sample); ``first``: the frame of ``samples[0]``."""
    finite = np.isfinite(samples)
    if not finite.all():
        frame = first + int(np.argmin(finite.all(axis=1) if samples.ndim == 2 else finite))
        raise AudioDecodeError(f"{where}: audio file {path!r} has non-finite samples (NaN or Inf) from "
                               f"{frame / rate:.3f} s: damaged; re-encode or drop it")
    loud = np.abs(samples) > MAX_SAMPLE
    if loud.any():
        frame = first + int(np.argmax(loud.any(axis=1) if samples.ndim == 2 else loud))
        raise AudioDecodeError(f"{where}: audio file {path!r} has samples of magnitude up to "
                               f"{float(np.abs(samples).max()):.3g} from {frame / rate:.3f} s, beyond ±{MAX_SAMPLE:g} "
                               f"(full scale is ±1): damaged or wrongly scaled; re-encode or drop it")


def check_duration(row: dict[str, Any], where: str) -> None:
    """A ``duration`` given in the manifest must be a finite number of seconds ≥ 0."""
    value = row.get("duration")
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
        raise ManifestError(f"{where}: field 'duration' must be a number of seconds ≥ 0, got {value!r}")


def warn_truncation(items: list[dict[str, Any]], max_seconds: float | None, name: str) -> int:
    """Log how many clips ``load_audio`` will cut at ``max_seconds`` (never silently); returns the count."""
    if max_seconds is None:
        return 0
    long = [float(i["duration"]) for i in items if isinstance(i.get("duration"), (int, float))
            and float(i["duration"]) > max_seconds]
    if long:  # a warning, not a log record: it shows whatever logging configuration the program has
        warnings.warn(
            f"{name}: {len(long)} of {len(items)} clips are longer than max_seconds={max_seconds} and are cut "
            f"to it (longest {max(long):.1f} s)",
            TruncationWarning,
            stacklevel=2,
        )
    return len(long)


class TruncationWarning(UserWarning):
    """Audio will be cut at ``max_seconds``."""
