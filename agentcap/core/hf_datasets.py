"""Manifests that are Hugging Face datasets, read through ``datasets`` and then checked row by row
exactly as JSONL rows are (``agentcap.core.manifests.read_manifest``).

A manifest is a dataset when it is

* ``hf://org/name``: a dataset on the Hub (``datasets.load_dataset``; ``HF_HUB_OFFLINE=1`` reads
  the cache only),
* a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``,
* ``.parquet``, ``.json`` or ``.csv`` files (a glob such as ``data/train-*.parquet`` works);
  ``.jsonl`` stays with agentcap's own reader (its errors name the line),

optionally followed by ``?split=NAME`` (needed when the dataset has several splits) and
``map=FIELD:COLUMN,…`` (the task's field ← the dataset's column, e.g. ``map=caption:text,audio:file``).
Errors name ``<manifest>:row N`` (N counts from 0, as ``dataset[N]``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

PREFIX = "hf://"
#: Data-file suffixes read through ``datasets`` and the builder that reads each.
DATA_FILES = {".parquet": "parquet", ".json": "json", ".csv": "csv"}
OPTIONS = ("split", "map")


@dataclass(frozen=True)
class DatasetSource:
    """A parsed dataset manifest; ``spec`` is the string as written (it names rows in errors)."""

    spec: str
    location: str
    kind: Literal["hub", "disk", "files"]
    split: str | None = None
    columns: tuple[tuple[str, str], ...] = ()

    @property
    def manifest(self) -> str | None:
        """What relative media paths resolve against (its folder): the files or folder; none on the Hub."""
        return None if self.kind == "hub" else self.location


def parse_source(manifest: str) -> DatasetSource | None:
    """The dataset ``manifest`` names, or None for a JSONL file (agentcap's own reader)."""
    location, _, query = manifest.partition("?")
    if location.startswith(PREFIX):
        kind, location = "hub", location[len(PREFIX):].removeprefix("datasets/")
    elif os.path.isdir(location):
        kind = "disk"
    elif Path(location).suffix.lower() in DATA_FILES:
        kind = "files"
    elif query:
        raise ValueError(f"{manifest}: `?{query}` options are for Hugging Face datasets (hf://org/name, a "
                         f"save_to_disk folder or {'/'.join(DATA_FILES)} files); {location!r} is none of them")
    else:
        return None
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"{manifest}: unknown option(s) {unknown}; expected {list(OPTIONS)}")
    if not location:
        raise ValueError(f"{manifest}: no dataset named before `?`")
    split = options["split"][-1] if "split" in options else None
    columns = _columns(options["map"][-1], manifest) if "map" in options else ()
    return DatasetSource(manifest, location, kind, split, columns)


def _columns(text: str, manifest: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in filter(None, text.split(",")):
        field, sep, column = item.partition(":")
        if not sep or not field.strip() or not column.strip():
            raise ValueError(f"{manifest}: map entry {item!r} must be FIELD:COLUMN (e.g. map=caption:text,audio:file)")
        pairs.append((field.strip(), column.strip()))
    return tuple(pairs)


def stamp(source: DatasetSource) -> tuple | None:
    """What changes when a local dataset is rewritten (every file's name, mtime, size); a Hub
    dataset is read once per process (None)."""
    if source.kind == "hub":
        return None
    if source.kind == "disk":
        paths = [p for p in Path(source.location).rglob("*") if p.is_file()]
    else:
        import glob

        paths = [Path(p) for p in glob.glob(source.location)]
    return tuple(sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths))


def dataset_rows(source: DatasetSource) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for every row, columns renamed by ``map`` and media columns as file paths."""
    table = _load(source)
    missing = [column for _, column in source.columns if column not in table.column_names]
    if missing:
        raise ValueError(f"{source.spec}: map names column(s) {missing} the dataset lacks "
                         f"(it has {table.column_names})")
    media = [name for name, feature in table.features.items() if hasattr(feature, "decode")]
    for name in media:  # Audio / Image / Video: the stored bytes or path, not decoded arrays
        table = table.cast_column(name, type(table.features[name])(decode=False))
    for index, record in enumerate(table):
        for name in media:
            record[name] = _media_path(record[name], source, name)
        renamed = {field: record[column] for field, column in source.columns}
        for _, column in source.columns:
            record.pop(column, None)
        record.update(renamed)
        yield f"{source.spec}:row {index}", record


def _load(source: DatasetSource):
    import datasets

    try:
        if source.kind == "disk":
            loaded = datasets.load_from_disk(source.location)
        elif source.kind == "files":
            builder = DATA_FILES[Path(source.location).suffix.lower()]
            loaded = datasets.load_dataset(builder, data_files=source.location)
        else:
            loaded = datasets.load_dataset(source.location)
    except Exception as err:  # datasets raises many kinds (FileNotFoundError, DatasetNotFoundError, …)
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"{source.spec}: cannot load the dataset {source.location!r} ({type(err).__name__}: {first})") from None
    if not isinstance(loaded, datasets.DatasetDict):
        if source.split is not None and source.kind == "disk":
            raise ValueError(f"{source.spec}: split={source.split!r} given, but the folder holds one Dataset")
        return loaded
    splits = list(loaded)
    if source.split is None and len(splits) == 1:
        return loaded[splits[0]]
    if source.split not in loaded:
        raise ValueError(f"{source.spec}: {'pick a split with ?split=NAME' if source.split is None else f'no split {source.split!r}'}"
                         f" (the dataset has {splits})")
    return loaded[source.split]


def _media_path(value: Any, source: DatasetSource, column: str) -> Any:
    """An undecoded Audio / Image value as a file path: its own path when that file exists, else its
    bytes written once (by content) under the datasets cache."""
    if not isinstance(value, dict):
        return value
    path, data = value.get("path"), value.get("bytes")
    if data is None:
        return path
    if path and os.path.isabs(path) and os.path.isfile(path):
        return path
    import datasets

    folder = Path(datasets.config.HF_DATASETS_CACHE) / "agentcap_media"
    suffix = Path(path).suffix if path else ""
    target = folder / f"{hashlib.sha256(data).hexdigest()[:32]}{suffix or '.bin'}"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")  # concurrent readers write the same bytes
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return str(target)
