"""`agentcap caption` never loses work (issue 11, cases 1 and 2): rows are written as they are
produced, an unusable item gets a row with its error, the exit status says some failed, and a last
line counts captioned, failed and skipped items."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
import yaml

from agentcap.commands.caption import caption_command


def cloze_config(tmp_path, world, **kwargs) -> str:
    model = {
        "run_dir": str(tmp_path / "run"),
        "env": {
            "id": "agentcap/ClozeCaption-v0",
            "kwargs": {"prompt": "compact", **kwargs},
            "train": {"manifest": str(world / "train.jsonl")},
            "test": {"manifest": str(world / "test.jsonl")},
        },
        "agents": {"policy": {
            "toy": {"media": "audio", "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
            "build_tokenizer_from": [str(world / "texts.txt")], "max_new_tokens": 4,
        }},
        "stages": [{"name": "e", "kind": "evaluate", "split": "test"}],
        "generation_batch_size": 2,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"model": model}))
    return str(path)


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bad_audio_files_get_error_rows_and_a_failed_exit(tmp_path, toy_soundscapes, capsys):
    good = sorted((toy_soundscapes / "audio").glob("test-*.wav"))[:2]
    soundfile.write(tmp_path / "zero.wav", np.zeros(0, np.float32), 16000)
    (tmp_path / "empty.wav").write_bytes(b"")
    files = [str(good[0]), str(tmp_path / "zero.wav"), str(tmp_path / "empty.wav"), str(tmp_path / "gone.wav"), str(good[1])]
    out = tmp_path / "captions.jsonl"
    code = caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--audio", *files, "--out", str(out)])
    assert code == 1
    written = rows(out)
    assert len(written) == 5
    captioned = [r for r in written if r.get("error") is None]
    assert sorted(r["id"] for r in captioned) == sorted(p.split("/")[-1] for p in (files[0], files[4]))
    errors = {r["id"]: r["error"] for r in written if r.get("error")}
    assert "no audio frames" in errors["zero.wav"] and "is empty" in errors["empty.wav"] and "not found" in errors["gone.wav"]
    assert "2 captioned, 3 failed, 0 skipped" in capsys.readouterr().err


@pytest.mark.parametrize("on_error, code, counts", [("skip", 0, "1 captioned, 0 failed, 5 skipped"),
                                                    ("raise", 1, "1 captioned, 5 failed, 0 skipped")])
def test_refused_manifest_rows_are_listed_and_counted(tmp_path, toy_soundscapes, capsys, on_error, code, counts):
    out = tmp_path / "captions.jsonl"
    config = cloze_config(tmp_path, toy_soundscapes, on_error=on_error)
    assert caption_command(["--config", config, "--manifest", str(toy_soundscapes / "bad.jsonl"), "--out", str(out)]) == code
    written = rows(out)
    assert len(written) == 6
    refused = [r for r in written if r.get("error")]
    assert len(refused) == 5 and all(r["where"].startswith(str(toy_soundscapes / "bad.jsonl")) for r in refused)
    assert counts in capsys.readouterr().err


def test_a_failing_item_costs_only_its_row(tmp_path, toy_soundscapes, monkeypatch, capsys):
    from agentcap_envs.cloze_caption import ClozeCaptionEnv

    advance = ClozeCaptionEnv.advance
    test_ids = [json.loads(line)["id"] for line in (toy_soundscapes / "test.jsonl").read_text().splitlines()]

    def failing_advance(self, episode, action):
        if episode.item["id"] == test_ids[1]:
            raise RuntimeError("the decoder gave up")
        return advance(self, episode, action)

    monkeypatch.setattr(ClozeCaptionEnv, "advance", failing_advance)
    out = tmp_path / "captions.jsonl"
    assert caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--out", str(out)]) == 1
    written = {r["id"]: r for r in rows(out)}
    assert set(written) == set(test_ids)
    assert written[test_ids[1]]["error"] == "RuntimeError: the decoder gave up"
    assert all(written[i]["caption"] is not None for i in test_ids if i != test_ids[1])
    assert f"{len(test_ids) - 1} captioned, 1 failed, 0 skipped" in capsys.readouterr().err


def test_captions_are_on_disk_before_the_run_ends(tmp_path, toy_soundscapes, monkeypatch):
    from agentcap.core.env import CaptionEnv

    caption, calls = CaptionEnv.caption, []

    def interrupted(self, driver, items):
        calls.append(len(items))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user stops the run in the second batch
        return caption(self, driver, items)

    monkeypatch.setattr(CaptionEnv, "caption", interrupted)
    out = tmp_path / "captions.jsonl"
    with pytest.raises(KeyboardInterrupt):
        caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--out", str(out)])
    assert len(rows(out)) == calls[0] == 2  # the first batch's captions were kept
