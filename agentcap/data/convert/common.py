"""What every adapter shares: refusals with file:line:field reasons, paths kept under ``--root``,
column maps, and writing the manifest beside its ``*.refused.jsonl``.

Why one place: a row refused by one adapter for a path that escapes the root must be refused by
all of them for the same reason, and no adapter may write over the files it reads.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentcap.core.manifests import ManifestError, audio_duration, check_duration, decoded_duration

#: Letters of the answer choices (the benchmark schema allows up to ten).
LETTERS = "ABCDEFGHIJ"


@dataclass
class Options:
    """The command line, as every adapter reads it."""

    root: str
    out: str
    columns: dict[str, str] = field(default_factory=dict)  # source field → column of the file (--map)
    audio_name: str | None = None  # template of an audio file name (--audio-name)
    features: str | None = None  # per-movie features: a folder of <movie>.npy or an .h5 (--features)
    fps: float = 5.0
    context: int = 3
    decode: bool = False

    @property
    def out_dir(self) -> str:
        return os.path.dirname(os.path.abspath(self.out))


@dataclass
class Result:
    """Rows that passed every check, and one ``{"where", "reason"}`` per refused source row or clip."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    #: Every file the adapter read (never written over).
    inputs: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)

    def add_id(self, ident: str, where: str) -> bool:
        """Claim an output id; a repeated one is refused (ids key captions, caches and banks)."""
        if ident in self.ids:
            self.refuse(ManifestError(f"{where}: field 'id': {ident!r} repeats an earlier row's id"), where)
            return False
        self.ids.add(ident)
        return True

    def refuse(self, err: ManifestError | str, where: str | None = None) -> None:
        reason = str(err)
        self.refused.append({"where": where or reason.split(": ", 1)[0], "reason": reason})


def columns(defaults: Mapping[str, str], given: Mapping[str, str], fmt: str) -> dict[str, str]:
    """The adapter's default column names with ``--map`` applied; an unknown field is refused."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"--map: {fmt} has no field(s) {unknown}; its fields are {sorted(defaults)}")
    return {**defaults, **given}


def parse_map(text: str | None) -> dict[str, str]:
    """``"audio=path,caption=text"`` → ``{"audio": "path", "caption": "text"}``."""
    mapping: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, column = part.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ValueError(f"--map: expected field=column, got {part!r}")
        mapping[name.strip()] = column.strip()
    return mapping


# --- reading -----------------------------------------------------------------------------------------
#: the longest CSV line read (Python's csv field limit): a longer one is refused by line, the rest kept
CSV_LINE_BYTES = csv.field_size_limit()


class RefusedRow(dict):
    """A CSV row that could not be read (a line not UTF-8, or too long): reading any field raises
    its :class:`ManifestError`, so each adapter refuses it by line as it refuses a bad field."""

    def __init__(self, error: ManifestError):
        super().__init__()
        self.error = error

    def __getitem__(self, key: Any) -> Any:
        raise self.error

    def get(self, key: Any, default: Any = None) -> Any:
        raise self.error


def _csv_lines(path: str, handle: Any, bad: dict[int, str]) -> Iterator[str]:
    """The file's lines decoded one by one; one that is not UTF-8 or longer than ``CSV_LINE_BYTES``
    is recorded in ``bad`` by its number and read as an empty line (never held whole in memory)."""
    number = 0
    while True:
        raw = handle.readline(CSV_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > CSV_LINE_BYTES and not raw.endswith(b"\n"):
            size = len(raw)
            while raw and not raw.endswith(b"\n"):  # skip the rest of the line, a block at a time
                raw = handle.readline(1 << 20)
                size += len(raw)
            bad[number] = f"a line of {size} bytes, longer than the {CSV_LINE_BYTES} a CSV row may have"
            yield "\n"
            continue
        try:
            yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            bad[number] = f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
            yield "\n"


def csv_rows(path: str, needed: list[str]) -> Iterator[tuple[str, dict[str, str]]]:
    """(``file:line``, row) of a CSV with a header; a header without a needed column stops the read.

    Read as bytes, line by line: a line that is not UTF-8 or too long costs only its row (a
    :class:`RefusedRow` naming the line), the rest of the file is kept."""
    bad: dict[int, str] = {}
    with open(path, "rb") as handle:
        reader = csv.reader(_csv_lines(path, handle, bad))
        header = next(reader, [])
        if bad:
            raise ValueError(f"{path}:1: the header is {bad[1]}")
        missing = [c for c in needed if c not in header]
        if missing:
            raise ValueError(
                f"{path}:1: column(s) {missing} not in the header {header}; name them with --map field=column"
            )
        first = reader.line_num + 1
        for fields in reader:
            where = f"{path}:{reader.line_num}"
            problems = [f"line {n}: {bad.pop(n)}" for n in range(first, reader.line_num + 1) if n in bad]
            first = reader.line_num + 1
            if problems:
                reason = problems[0].split(": ", 1)[1] if len(problems) == 1 else "; ".join(problems)
                yield where, RefusedRow(ManifestError(f"{where}: {reason}"))
                continue
            if not fields:
                continue  # a blank line, as csv.DictReader skips it
            row: dict[Any, Any] = dict(zip(header, fields))
            if len(fields) > len(header):
                row[None] = fields[len(header):]  # csv.DictReader's restkey
            for column in header[len(fields):]:
                row[column] = None  # and its restval
            yield where, row


def json_records(path: str, key: str | None = None) -> Iterator[tuple[str, Any]]:
    """(``file[index]`` or ``file[key]``, record) of a JSON list, a ``{key: [...]}`` wrapper, an
    id → record dict, or JSON Lines (``file:line``)."""
    with open(path, encoding="utf-8-sig") as handle:
        text = handle.read()
    data = None
    if not path.endswith(".jsonl"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}:{err.lineno}: not valid JSON ({err.msg}); JSON Lines files must end in .jsonl"
            ) from None
    if data is None:
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                where = f"{path}:{number}"
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError as err:
                    yield where, ManifestError(f"{where}: not valid JSON ({err.msg})")
        return
    if isinstance(data, dict) and key is not None and isinstance(data.get(key), list):
        data = data[key]
    if isinstance(data, list):
        for index, record in enumerate(data):
            yield f"{path}[{index}]", record
    elif isinstance(data, dict):
        for name, record in data.items():
            yield f"{path}[{name!r}]", record
    else:
        raise ValueError(f"{path}: expected a JSON list or object, got {type(data).__name__}")


def json_object(where: str, record: Any) -> dict[str, Any]:
    """A record of :func:`json_records` that is a JSON object, else the :class:`ManifestError` refusing it."""
    if isinstance(record, ManifestError):  # a line that is not JSON
        raise record
    if not isinstance(record, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


def text_field(record: Mapping[str, Any], column: str, where: str, name: str | None = None) -> str:
    """A non-empty string from ``record[column]`` (numbers are written as text), else refused."""
    value = record.get(column) if isinstance(record, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        label = f"field {name or column!r}" + (f" (column {column!r})" if name and name != column else "")
        raise ManifestError(f"{where}: {label} must be a non-empty string, got {value!r}")
    return value.strip()


def number_field(record: Mapping[str, Any], column: str, where: str) -> float:
    """A finite number of seconds ≥ 0 from ``record[column]`` (numeric strings too)."""
    value = record.get(column)
    try:
        number = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        number = float("nan")
    if not number == number or number in (float("inf"), float("-inf")) or number < 0:
        raise ManifestError(f"{where}: field {column!r} must be a number of seconds >= 0, got {value!r}")
    return number


#: The fields and types the target environments require of a row (ADClip's ``required_fields``; the
#: caption fields the bank builder reads before it adds ``cloze``); agentcap does not import its envs.
AD_FIELDS = {"id": str, "duration": (int, float), "characters": list, "ad": str, "context": list, "features": str}
CAPTION_FIELDS = {"id": str, "audio": str, "caption": str, "duration": (int, float)}


def check_row(row: Mapping[str, Any], required: Mapping[str, Any], where: str) -> None:
    """A built row against its target's required fields and types, as ``read_manifest`` checks them."""
    for name, kind in required.items():
        if name not in row or not isinstance(row[name], kind) or isinstance(row[name], bool):
            raise ManifestError(f"{where}: field {name!r} must be {kind}, got {row.get(name)!r}")
    check_duration(dict(row), where)


# --- paths -------------------------------------------------------------------------------------------
def under_root(root: str, path: str, where: str, name: str) -> str:
    """The absolute path of an existing file named by ``path`` (relative to ``root`` unless absolute)
    that resolves — ``..`` and symlinks followed — inside ``root``; else refused, naming both."""
    if not isinstance(path, str) or not path.strip():
        raise ManifestError(f"{where}: field {name!r} must name a file, got {path!r}")
    full = os.path.abspath(path if os.path.isabs(path) else os.path.join(root, path))
    real, real_root = os.path.realpath(full), os.path.realpath(root)
    if os.path.commonpath([real, real_root]) != real_root:
        raise ManifestError(
            f"{where}: field {name!r}: {path!r} resolves to {real!r}, outside --root {real_root!r}; refused"
        )
    if not os.path.isfile(real):
        raise ManifestError(f"{where}: field {name!r}: file {full!r} not found")
    return full


def manifest_path(path: str, options: Options) -> str:
    """``path`` as the manifest writes it: relative to the manifest's folder (absolute when the two
    share nothing but the filesystem root, where a relative path would only climb to ``/``)."""
    if os.path.dirname(os.path.commonpath([path, options.out_dir])) == os.path.commonpath([path, options.out_dir]):
        return path
    return os.path.relpath(path, options.out_dir)


def audio_seconds(path: str, where: str, name: str, decode: bool) -> float:
    """The clip's duration: its header's (cheap), or with ``--decode`` the decoded length (every
    frame read; a truncated file is refused here rather than at training load)."""
    try:
        if os.path.getsize(path) == 0:
            raise ManifestError(f"{where}: field {name!r}: file {path!r} is empty")
        return decoded_duration(path, f"{where}: field {name!r}") if decode else audio_duration(
            path, f"{where}: field {name!r}")
    except ManifestError:
        raise
    except Exception as err:  # soundfile's own error kinds
        raise ManifestError(f"{where}: field {name!r}: audio file {path!r} is unreadable ({err})") from None


def audio_name(template: str, record: Mapping[str, Any], where: str) -> str:
    """An audio file name from a ``str.format`` template over the record's fields (``{stem}`` is
    ``{id}`` without an audio extension)."""
    fields = {k.replace("-", "_"): v for k, v in record.items() if isinstance(k, str)}
    ident = str(record.get("id", ""))
    fields.setdefault("stem", os.path.splitext(ident)[0] if ident.lower().endswith(AUDIO_EXTENSIONS) else ident)
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as err:
        raise ManifestError(
            f"{where}: --audio-name {template!r} names a field the row lacks ({err}); row has {sorted(fields)}"
        ) from None


AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a")


# --- answers -----------------------------------------------------------------------------------------
def answer_letter(answer: Any, choices: list[str], where: str, name: str = "answer") -> str:
    """The letter of ``answer`` among ``choices``: the choice's text (exact, then case-insensitive),
    or a letter such as ``B``, ``(B)`` or ``B.``; anything else is refused."""
    letters = LETTERS[: len(choices)]
    if isinstance(answer, str) and answer.strip():
        text = answer.strip()
        stripped = [c.strip() for c in choices]
        if text in stripped:
            return letters[stripped.index(text)]
        folded = [c.lower() for c in stripped]
        if folded.count(text.lower()) == 1:
            return letters[folded.index(text.lower())]
        bare = text.strip("().: ").upper()
        if len(bare) == 1 and bare in letters:
            return bare
    raise ManifestError(f"{where}: field {name!r} {answer!r} is neither one of the choices {choices!r} nor a letter")


# --- writing -----------------------------------------------------------------------------------------
def refused_path(out: str) -> str:
    """``train.jsonl`` → ``train.refused.jsonl``."""
    stem, ext = os.path.splitext(out)
    return f"{stem}.refused{ext or '.jsonl'}"


def check_outputs(out: str, inputs: list[str]) -> None:
    """Refuse an output (manifest or its refusals) that is one of the inputs."""
    taken = {os.path.realpath(p) for p in inputs if os.path.exists(p)}
    for path in (out, refused_path(out)):
        if os.path.realpath(path) in taken:
            raise ValueError(f"--out: {path} is one of the input files; refusing to overwrite it")


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    """All rows or none: written beside ``path`` and renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=folder, prefix=".convert-", suffix=".jsonl")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            for row in rows:
                stream.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
