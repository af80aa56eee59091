"""Environments share one loaded dataset, and audio is decoded once."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import soundfile

import agentcap.core.manifests as data
from agentcap.core.env import CaptionEnv
from agentcap.core.manifests import check_audio, load_audio


class Clips(CaptionEnv):
    required_fields = {"id": str, "audio": str}

    def check_item(self, row, where):
        row["duration"] = check_audio(row, "audio", where)


@pytest.fixture
def manifest(tmp_path):
    rows = []
    for i in range(3):
        path = tmp_path / f"clip{i}.wav"
        soundfile.write(path, np.full(800, 0.1 * (i + 1), dtype=np.float32), 8000)
        rows.append({"id": f"c{i}", "audio": str(path)})
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_envs_of_one_manifest_share_its_rows_and_read_it_once(manifest, monkeypatch):
    reads = []
    real = data._read_rows
    monkeypatch.setattr(data, "_read_rows", lambda *a, **k: reads.append(1) or real(*a, **k))
    probes = []
    real_duration = data.decoded_duration  # the load check decodes each file (issue 11)
    monkeypatch.setattr(data, "decoded_duration", lambda *a, **k: probes.append(1) or real_duration(*a, **k))
    envs = [Clips(manifest=str(manifest)) for _ in range(8)]  # a rollout pool: one env per trajectory
    assert len(reads) == 1 and len(probes) == 3  # one read, each audio file probed once
    assert all(env.items[0] is envs[0].items[0] for env in envs)
    assert envs[0].items[0]["duration"] == pytest.approx(0.1)
    # a changed manifest is read again
    text = manifest.read_text().splitlines()
    manifest.write_text(text[0] + "\n")
    os.utime(manifest, ns=(1, 1))
    assert len(Clips(manifest=str(manifest)).items) == 1 and len(reads) == 2


def test_audio_is_decoded_once(manifest, monkeypatch):
    decodes = []
    real = data._decode_audio
    monkeypatch.setattr(data, "_decode_audio", lambda *a, **k: decodes.append(1) or real(*a, **k))
    path = str(manifest.parent / "clip0.wav")
    first = load_audio(path, 16000)
    again = load_audio(path, 16000)  # another rollout of the item, or the next turn
    assert len(decodes) == 1 and np.array_equal(again, first)
    assert again is not first and first.shape == (1600,)  # every observation owns its samples
    load_audio(path, 8000)  # another rate is another decoding
    assert len(decodes) == 2
    with pytest.raises(data.ManifestError, match="not found"):
        load_audio(str(manifest.parent / "missing.wav"), 16000, where="train.jsonl:4")
