"""Every audio check that passes at load also decodes: zero frames, truncated MP3s and files cut
at ``max_seconds`` are named, never passed on silently (issue 11, cases 1, 3 and 8)."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
import soundfile

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.core.manifests import (
    AudioDecodeError,
    ManifestError,
    TruncationWarning,
    check_audio,
    decoded_duration,
    load_audio,
)

RATE = 16000


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("audio")
    soundfile.write(out / "whole.mp3", tone(6.0), RATE, format="MP3")
    soundfile.write(out / "whole.ogg", tone(6.0), RATE, format="OGG", subtype="VORBIS")
    soundfile.write(out / "zero.wav", np.zeros(0, np.float32), RATE)
    # the first kilobyte of a 6 s MP3: its header still says 6 s, the decoder gives ~0.15 s
    (out / "truncated.mp3").write_bytes((out / "whole.mp3").read_bytes()[:1000])
    soundfile.write(out / "long.wav", tone(10.0), RATE)
    return out


def test_whole_mp3_and_vorbis_decode_to_their_header_length(files):
    for name in ("whole.mp3", "whole.ogg"):
        assert decoded_duration(str(files / name)) == pytest.approx(6.0, abs=0.05)
        assert len(load_audio(str(files / name), RATE)) == pytest.approx(6 * RATE, abs=0.05 * RATE)


def test_truncated_mp3_is_refused_naming_both_lengths(files):
    assert soundfile.info(str(files / "truncated.mp3")).duration == pytest.approx(6.0)  # what the header claims
    with pytest.raises(AudioDecodeError, match=r"m.jsonl:3: field 'audio'.*truncated.mp3.*decodes to \d+ frames.*header says 96000"):
        check_audio({"audio": str(files / "truncated.mp3")}, "audio", "m.jsonl:3")


def test_zero_frame_wav_is_refused_at_load(files):
    assert soundfile.info(str(files / "zero.wav")).frames == 0  # opens fine: the old check let it through
    with pytest.raises(ManifestError, match=r"m.jsonl:1: field 'audio'.*zero.wav.*has no audio frames"):
        check_audio({"audio": str(files / "zero.wav")}, "audio", "m.jsonl:1")


def manifest_with(tmp_path, toy_soundscapes, audio: str, **fields) -> str:
    row = json.loads((toy_soundscapes / "train.jsonl").read_text().splitlines()[0])
    row.update(audio=audio, **fields)
    row.pop("duration", None)
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


def test_duration_is_the_decoded_length(tmp_path, toy_soundscapes, files):
    env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest_with(tmp_path, toy_soundscapes, str(files / "whole.mp3")))
    assert env.unwrapped.items[0]["duration"] == pytest.approx(6.0, abs=0.05)
    with pytest.raises(AudioDecodeError, match="m.jsonl:1"):
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest_with(tmp_path, toy_soundscapes, str(files / "truncated.mp3")))


def test_clips_longer_than_max_seconds_are_counted_in_a_warning(tmp_path, toy_soundscapes, files):
    manifest = manifest_with(tmp_path, toy_soundscapes, str(files / "long.wav"))
    with pytest.warns(TruncationWarning, match=r"1 of 1 clips are longer than max_seconds=2.0 .*longest 10.0 s"):
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest, max_seconds=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncationWarning)
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest, max_seconds=30.0)


def test_raw_audio_items_are_checked_like_manifest_rows(tmp_path, toy_soundscapes, files):
    env = gym.make("agentcap/ClozeCaption-v0", manifest=str(toy_soundscapes / "val.jsonl")).unwrapped
    assert env.item_from_audio(str(files / "whole.ogg"))["duration"] == pytest.approx(6.0, abs=0.05)
    for name, problem in (("zero.wav", "no audio frames"), ("missing.wav", "not found")):
        with pytest.raises(ManifestError, match=problem):
            env.item_from_audio(str(files / name))
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(ManifestError, match="is empty"):
        env.item_from_audio(str(tmp_path / "empty.wav"))
