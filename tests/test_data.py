"""Bad input gets an error naming the file, the row, the field and the value."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.core.manifests import ManifestError, load_audio, read_manifest


def write_rows(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def good_row(world):
    return json.loads((world / "val.jsonl").read_text().splitlines()[0])


def test_missing_feature_file_names_file_row_and_field(tmp_path, toy_movie):
    row = good_row(toy_movie)
    row["features"] = str(tmp_path / "nope.npy")
    manifest = write_rows(tmp_path / "m.jsonl", [good_row(toy_movie) | {"features": str(toy_movie / good_row(toy_movie)["features"])}, row])
    with pytest.raises(ManifestError) as err:
        gym.make("agentcap/ADClip-v0", manifest=str(manifest))
    message = str(err.value)
    assert f"{manifest}:2" in message and "'features'" in message and "nope.npy" in message


def test_row_without_reference_ad(tmp_path, toy_movie):
    row = good_row(toy_movie)
    row["features"] = str(toy_movie / row["features"])
    del row["ad"]
    manifest = write_rows(tmp_path / "m.jsonl", [row])
    with pytest.raises(ManifestError, match=rf"{manifest}:1: missing field 'ad'"):
        gym.make("agentcap/ADClip-v0", manifest=str(manifest))
    row["ad"] = "   "
    write_rows(manifest, [row])
    with pytest.raises(ManifestError, match=r":1: field 'ad' \(the reference AD\) is empty"):
        gym.make("agentcap/ADClip-v0", manifest=str(manifest))


def test_wrong_type_and_bad_json(tmp_path):
    manifest = write_rows(tmp_path / "m.jsonl", [{"id": 3}, "{not json"])
    with pytest.raises(ManifestError, match=r"m.jsonl:1: field 'id' must be str, got 3"):
        read_manifest(str(manifest), {"id": str})
    report_rows = read_manifest(str(manifest), {"id": (str, int)}, on_error="skip", max_skip_fraction=0.5)
    assert len(report_rows) == 1
    with pytest.raises(ManifestError, match=r"1 of 2 rows are unusable"):
        read_manifest(str(manifest), {"id": (str, int)}, on_error="skip", max_skip_fraction=0.1)


def test_missing_manifest():
    with pytest.raises(ManifestError, match="no/such.jsonl: manifest not found"):
        read_manifest("no/such.jsonl")


def test_audio_formats_resample_and_mixdown(tmp_path, toy_soundscapes):
    import soundfile

    stereo = np.stack([np.linspace(-1, 1, 8000), np.zeros(8000)], axis=1).astype(np.float32)
    path = tmp_path / "stereo.wav"
    soundfile.write(path, stereo, 8000)
    wave = load_audio(str(path), 16000)
    assert wave.ndim == 1 and abs(len(wave) - 16000) <= 1  # 1 s at 16 kHz, mono
    for ext in ("flac", "ogg"):
        found = list(toy_soundscapes.rglob(f"*.{ext}"))
        assert found, ext
        assert load_audio(str(found[0]), 16000).size > 0
    corrupt = tmp_path / "bad.wav"
    corrupt.write_bytes(b"RIFF not really a wave file")
    with pytest.raises(ManifestError, match="corrupt or unsupported"):
        load_audio(str(corrupt), 16000, where="m.jsonl:7")
