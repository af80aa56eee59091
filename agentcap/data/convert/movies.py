"""Movie audio-description releases (MAD, CMD-AD, TV-AD) → ADClip manifests (READ).

Each output row is one AD: ``{"id", "movie", "position", "start", "end", "duration", "features",
"characters", "ad", "context"}`` as the toy movie world writes them. ``features`` is a per-clip
``.npy`` cut from the movie's frame features (``--features``: a folder of ``<movie>.npy`` arrays
``[frames, dim]`` or one ``.h5`` file with a dataset per movie, at ``--fps`` frames per second) and
written under ``<out folder>/features/``. ``position`` orders a movie's kept ADs by start time and
``context`` holds the ``--context`` ADs before it (READ's context-aware prompts).

Release layouts:
- MAD ``MAD_train.json`` / ``MAD_val.json`` / ``MAD_test.json`` (checked against the MAD baselines'
  loader): ``{ad_id: {"movie", "movie_duration", "ext_timestamps" or "timestamps": [start, end],
  "sentence", …}}``; features ``CLIP_frames_features_5fps.h5`` (a dataset per movie, 5 fps).
- CMD-AD and TV-AD: CSV files of ADs; their column names are not written down anywhere we could
  check, so the defaults (``movie,start,end,text``) are a guess to be confirmed against your file's
  header and renamed with ``--map movie=imdbid,start=start_time,end=end_time,text=ad``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections import defaultdict
from typing import Any

import numpy as np

from agentcap.core.manifests import ManifestError
from agentcap.data.convert.common import (
    AD_FIELDS, Options, Result, check_row, columns, csv_rows, json_object, manifest_path, number_field, text_field,
    under_root,
)

MAD = {"movie": "movie", "timestamps": "ext_timestamps", "text": "sentence", "characters": "characters"}
AD_CSV = {"id": "id", "movie": "movie", "start": "start", "end": "end", "text": "text", "characters": "characters"}

#: How far (in frames) a clip may run past the end of its movie's features before it is refused:
#: the last AD of a movie often ends on the credits' last frame.
FRAME_SLACK = 1


def mad(sources: list[str], options: Options) -> Result:
    cols = columns(MAD, options.columns, "mad")
    result, ads = Result(inputs=list(sources)), []
    for source in sources:
        with open(source, encoding="utf-8") as handle:
            data = json.load(handle)
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected MAD's {{ad_id: annotation}} object, got {type(data).__name__}")
        for ident, record in data.items():
            where = f"{source}[{ident!r}]"
            try:
                record = json_object(where, record)
                key = cols["timestamps"] if cols["timestamps"] in record else "timestamps"
                span = record.get(key)
                if not isinstance(span, list) or len(span) != 2:
                    raise ManifestError(f"{where}: field {key!r} must be [start, end] in seconds, got {span!r}")
                ads.append(_ad(record, where, ident, cols, {"start": span[0], "end": span[1]}, "start", "end"))
            except ManifestError as err:
                result.refuse(err, where)
    return _clips(ads, options, result, "mad")


def cmdad(sources: list[str], options: Options) -> Result:
    return _csv(sources, options, "cmdad")


def tvad(sources: list[str], options: Options) -> Result:
    return _csv(sources, options, "tvad")


def _csv(sources: list[str], options: Options, name: str) -> Result:
    cols = columns(AD_CSV, options.columns, name)
    result, ads = Result(inputs=list(sources)), []
    for source in sources:
        stem = os.path.splitext(os.path.basename(source))[0]  # ids of rows without one: <file stem>-<line>
        for where, record in csv_rows(source, [cols["movie"], cols["start"], cols["end"], cols["text"]]):
            try:
                ident = (record.get(cols["id"]) or "").strip() or f"{stem}-{where.rsplit(':', 1)[1]}"
                ads.append(_ad(record, where, ident, cols, record, cols["start"], cols["end"]))
            except ManifestError as err:
                result.refuse(err, where)
    return _clips(ads, options, result, name)


def _ad(record, where, ident, cols, times, start_key, end_key) -> dict[str, Any]:
    """The parts of one AD every format has: checked text, movie and time span."""
    start, end = number_field(times, start_key, where), number_field(times, end_key, where)
    if end <= start:
        raise ManifestError(f"{where}: the AD must end after it starts, got start {start} s, end {end} s")
    characters = record.get(cols["characters"], [])
    if isinstance(characters, str):  # a CSV cell: names separated by ';' or ','
        characters = [c.strip() for c in re.split(r"[;,]", characters) if c.strip()]
    if not isinstance(characters, list) or not all(isinstance(c, str) for c in characters):
        raise ManifestError(f"{where}: field {cols['characters']!r} must be a list of names, got {characters!r}")
    return {"id": ident, "where": where, "movie": text_field(record, cols["movie"], where, "movie"),
            "ad": text_field(record, cols["text"], where, "text"), "start": start, "end": end,
            "characters": characters}


def _clips(ads: list[dict[str, Any]], options: Options, result: Result, source: str) -> Result:
    """Cut each AD's frames out of its movie's features, then number and contextualise each movie's ADs."""
    if not options.features:
        raise ValueError(f"{source}: --features is required (a folder of <movie>.npy, or an .h5 file)")
    folder = os.path.join(options.out_dir, "features")
    by_movie: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ad in ads:
        by_movie[ad["movie"]].append(ad)
    with _Features(options) as features:
        for movie, clips in by_movie.items():
            try:
                frames = features.movie(movie, clips[0]["where"])
            except ManifestError as err:  # every AD of the movie is refused, each under its own line
                reason = str(err).removeprefix(f"{clips[0]['where']}: ")
                for clip in clips:
                    result.refuse(f"{clip['where']}: {reason}", clip["where"])
                continue
            kept = []
            for clip in sorted(clips, key=lambda c: (c["start"], c["end"])):
                try:
                    cut = _cut(frames, clip, options.fps, features.name(movie))
                except ManifestError as err:
                    result.refuse(err, clip["where"])
                    continue
                if not result.add_id(clip["id"], clip["where"]):
                    continue
                path = os.path.join(folder, _file_name(clip["id"]))
                if os.path.realpath(path) in {os.path.realpath(p) for p in result.inputs}:
                    raise ValueError(f"--out: writing {path} would overwrite an input; choose another --out folder")
                os.makedirs(folder, exist_ok=True)
                np.save(path, cut)
                kept.append((clip, path))
            for position, (clip, path) in enumerate(kept):
                before = [c["ad"] for c, _ in kept[max(0, position - options.context):position]]
                row = {"id": clip["id"], "movie": movie, "position": position, "start": clip["start"],
                       "end": clip["end"], "duration": round(clip["end"] - clip["start"], 3),
                       "features": manifest_path(path, options), "characters": clip["characters"],
                       "ad": clip["ad"], "context": before, "source": source}
                check_row(row, AD_FIELDS, clip["where"])  # built here: a failure is a bug, not a bad row
                result.rows.append(row)
    return result


def _cut(frames, clip: dict[str, Any], fps: float, name: str) -> np.ndarray:
    """Frames ``floor(start·fps)`` … ``ceil(end·fps)`` of the movie, as float32 ``[frames, dim]``."""
    first = math.floor(clip["start"] * fps)
    last = max(math.ceil(clip["end"] * fps), first + 1)  # a clip shorter than a frame still gets one
    if last > len(frames) + FRAME_SLACK:
        raise ManifestError(
            f"{clip['where']}: the AD ends at {clip['end']} s (frame {last} at {fps} fps) but {name} has "
            f"{len(frames)} frames ({len(frames) / fps:.1f} s); check --fps or the movie id"
        )
    cut = np.asarray(frames[first:min(last, len(frames))], dtype=np.float32)
    if cut.ndim != 2 or not len(cut):
        raise ManifestError(f"{clip['where']}: {name} gives no [frames, dim] features for "
                            f"{clip['start']}–{clip['end']} s (got shape {cut.shape})")
    if not np.isfinite(cut).all():
        raise ManifestError(f"{clip['where']}: {name} has non-finite features in {clip['start']}–{clip['end']} s")
    return cut


def _file_name(ident: str) -> str:
    """A file name for an AD id: the id itself when it is safe, else a cleaned one plus a hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", ident)
    if safe != ident or safe.startswith("."):
        safe = f"{safe.lstrip('.')}-{hashlib.sha1(ident.encode()).hexdigest()[:8]}"
    return f"{safe}.npy"


class _Features:
    """A movie's frame features, one movie at a time: ``<folder>/<movie>.npy`` (memory-mapped) or a
    dataset of an ``.h5`` file (read with h5py, sliced without loading the whole movie)."""

    def __init__(self, options: Options):
        self.root, self.path = options.root, options.features
        self._h5 = None

    def __enter__(self) -> _Features:
        if self.path.endswith((".h5", ".hdf5")):
            full = under_root(self.root, self.path, "--features", "features")
            try:
                import h5py
            except ImportError:
                raise ValueError("--features: reading an .h5 file needs h5py (pip install h5py)") from None
            self._h5 = h5py.File(full, "r")
        return self

    def __exit__(self, *exc) -> None:
        if self._h5 is not None:
            self._h5.close()

    def name(self, movie: str) -> str:
        return f"{self.path}[{movie!r}]" if self._h5 is not None else os.path.join(self.path, f"{movie}.npy")

    def movie(self, movie: str, where: str):
        if self._h5 is not None:
            if movie not in self._h5:
                raise ManifestError(f"{where}: field 'movie': {movie!r} has no dataset in {self.path}")
            return self._h5[movie]
        path = under_root(self.root, os.path.join(self.path, f"{movie}.npy"), where, "movie")
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ManifestError(f"{where}: field 'movie': features {path!r} are unreadable ({err})") from None
