"""Audio-caption releases (AudioCaps, Clotho, WavCaps) → caption manifests for the bank builder.

Each output row is one audio clip: ``{"id", "audio", "duration", "caption", "captions", "source",
…}``. ``caption`` (the first reference) and ``audio`` are what ``agentcap data bank`` reads to write
the clip's cloze bank; ``captions`` keeps every reference for ``agentcap evaluate``. The cloze and
anchor fields that ClozeCaption needs come from the bank builder, not from these releases.

Release layouts (checked against the public files):
- AudioCaps ``train.csv`` / ``val.csv`` / ``test.csv``: ``audiocap_id,youtube_id,start_time,caption``,
  one row per caption (five per clip in val / test). The audio is not in the release; name your
  files with ``--audio-name`` (default ``{youtube_id}_{start_time}.wav``).
- Clotho ``clotho_captions_<split>.csv``: ``file_name,caption_1,…,caption_5``; the audio file is
  ``file_name``.
- WavCaps ``json_files/<source>/*.json``: ``{"data": [{"id", "caption", "duration", …}]}`` (or a bare
  list); the audio file is named by ``--audio-name`` (default ``{stem}.flac``: the id without an
  audio extension, as the released archives name them).
"""

from __future__ import annotations

import os
from typing import Any

from agentcap.core.manifests import ManifestError
from agentcap.data.convert.common import (
    CAPTION_FIELDS, Options, Result, audio_name, audio_seconds, check_row, columns, csv_rows, json_object,
    json_records, manifest_path, text_field, under_root,
)

AUDIOCAPS = {"id": "audiocap_id", "youtube_id": "youtube_id", "start_time": "start_time", "caption": "caption"}
CLOTHO = {"file_name": "file_name", **{f"caption_{i}": f"caption_{i}" for i in range(1, 6)}}
WAVCAPS = {"id": "id", "caption": "caption"}


def audiocaps(sources: list[str], options: Options) -> Result:
    cols = columns(AUDIOCAPS, options.columns, "audiocaps")
    template = options.audio_name or "{youtube_id}_{start_time}.wav"
    clips: dict[str, dict[str, Any]] = {}
    result = Result(inputs=list(sources))
    for source in sources:
        for where, record in csv_rows(source, [cols["youtube_id"], cols["start_time"], cols["caption"]]):
            try:
                caption = text_field(record, cols["caption"], where, "caption")
                fields = {"youtube_id": text_field(record, cols["youtube_id"], where, "youtube_id"),
                          "start_time": text_field(record, cols["start_time"], where, "start_time"),
                          "audiocap_id": record.get(cols["id"])}
                name = audio_name(template, {**record, **fields}, where)
            except ManifestError as err:
                result.refuse(err, where)
                continue
            clip = clips.setdefault(name, {"where": [], "captions": [], "extra": fields})
            clip["where"].append(where)
            clip["captions"].append(caption)
    for name, clip in clips.items():
        extra = {"youtube_id": clip["extra"]["youtube_id"], "start_time": clip["extra"]["start_time"]}
        _add_clip(result, options, name, clip["captions"], ", ".join(clip["where"]), "audiocaps", extra)
    return result


def clotho(sources: list[str], options: Options) -> Result:
    cols = columns(CLOTHO, options.columns, "clotho")
    result = Result(inputs=list(sources))
    for source in sources:
        for where, record in csv_rows(source, [cols["file_name"], cols["caption_1"]]):
            try:
                name = text_field(record, cols["file_name"], where, "file_name")
            except ManifestError as err:
                result.refuse(err, where)
                continue
            captions = [record[cols[f"caption_{i}"]].strip() for i in range(1, 6)
                        if (record.get(cols[f"caption_{i}"]) or "").strip()]
            _add_clip(result, options, name, captions, where, "clotho", {})
    return result


def wavcaps(sources: list[str], options: Options) -> Result:
    cols = columns(WAVCAPS, options.columns, "wavcaps")
    template = options.audio_name or "{stem}.flac"
    result = Result(inputs=list(sources))
    for source in sources:
        for where, record in json_records(source, key="data"):
            try:
                record = json_object(where, record)
                ident = text_field(record, cols["id"], where, "id")
                caption = text_field(record, cols["caption"], where, "caption")
                name = audio_name(template, {**record, "id": ident}, where)
            except ManifestError as err:
                result.refuse(err, where)
                continue
            _add_clip(result, options, name, [caption], where, "wavcaps", {"wavcaps_id": ident})
    return result


def _add_clip(result: Result, options: Options, name: str, captions: list[str], where: str, source: str,
              extra: dict[str, Any]) -> None:
    """One manifest row for an audio file under ``--root``, or one refusal naming why not."""
    try:
        if not captions:
            raise ManifestError(f"{where}: field 'caption': the clip has no non-empty caption")
        path = under_root(options.root, name, where, "audio")
        duration = audio_seconds(path, where, "audio", options.decode)
    except ManifestError as err:
        result.refuse(err, where)
        return
    ident = os.path.splitext(os.path.basename(name))[0]
    row = {"id": ident, "audio": manifest_path(path, options), "duration": round(duration, 3),
           "caption": captions[0], "captions": captions, "source": source, **extra}
    try:
        check_row(row, CAPTION_FIELDS, where)
    except ManifestError as err:
        result.refuse(err, where)
        return
    if result.add_id(ident, where):
        result.rows.append(row)

