"""`agentcap caption` never loses work (issue 11, cases 1 and 2): rows are written as they are
produced, an unusable item gets a row with its error, the exit status says some failed, and a last
line counts captioned, failed and skipped items. Its inputs are never overwritten, a run without a
checkpoint needs ``--untrained``, and a refused row keeps its id (issue 26)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import yaml

from agentcap.commands import caption


def caption_command(argv):
    """The toy runs have no checkpoint: caption with their untrained weights."""
    return caption.caption_command([*argv, "--untrained"])


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
    # ids are the files' stems, as `data convert` names rows: predictions and manifests agree
    assert sorted(r["id"] for r in captioned) == sorted(Path(p).stem for p in (files[0], files[4]))
    errors = {r["id"]: r["error"] for r in written if r.get("error")}
    assert "no audio frames" in errors["zero"] and "is empty" in errors["empty"] and "not found" in errors["gone"]
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
    out.write_text('{"id": "earlier", "caption": "an earlier run"}\n')
    with pytest.raises(KeyboardInterrupt):
        caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--out", str(out)])
    assert len(rows(tmp_path / "captions.jsonl.partial")) == calls[0] == 2  # the first batch's captions were kept
    assert rows(out) == [{"id": "earlier", "caption": "an earlier run"}]  # and the earlier output is whole


def test_a_finished_run_replaces_the_earlier_output(tmp_path, toy_soundscapes):
    out = tmp_path / "captions.jsonl"
    out.write_text("an earlier run, much longer than this one would be\n" * 100)
    assert caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--out", str(out), "--limit", "1"]) == 0
    assert len(rows(out)) == 1 and not (tmp_path / "captions.jsonl.partial").exists()


@pytest.mark.parametrize("flag", ["--manifest", "--config", "--checkpoint", "a link to --manifest"])
def test_an_output_that_is_an_input_is_refused_before_it_is_opened(tmp_path, toy_soundscapes, flag):
    config = cloze_config(tmp_path, toy_soundscapes)
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes((toy_soundscapes / "test.jsonl").read_bytes())
    checkpoint = tmp_path / "w.ckpt"
    checkpoint.write_bytes(b"weights")
    out = {"--manifest": manifest, "--config": config, "--checkpoint": checkpoint}.get(flag, tmp_path / "link.jsonl")
    if flag.startswith("a link"):
        (tmp_path / "link.jsonl").symlink_to(manifest)
    argv = ["--config", config, "--manifest", str(manifest), "--out", str(out)]
    if flag == "--checkpoint":
        argv += ["--checkpoint", str(checkpoint)]
        runner = caption.caption_command  # --checkpoint and --untrained exclude each other
    else:
        runner = caption_command
    before = {p: open(p, "rb").read() for p in (manifest, config, checkpoint)}
    with pytest.raises(SystemExit, match=r"--out .* is the .*; writing there would destroy it"):
        runner(argv)
    assert {p: open(p, "rb").read() for p in before} == before
    assert not list(tmp_path.glob("*.partial"))


def test_a_run_without_checkpoint_is_refused_unless_untrained(tmp_path, toy_soundscapes):
    out = tmp_path / "captions.jsonl"
    argv = ["--config", cloze_config(tmp_path, toy_soundscapes), "--out", str(out), "--limit", "1"]
    with pytest.raises(SystemExit, match=r"no checkpoint in .*run \(train first: agentcap fit --config .*--untrained"):
        caption.caption_command(argv)
    assert not out.exists()
    assert caption.caption_command([*argv, "--untrained"]) == 0 and len(rows(out)) == 1


def test_a_non_utf8_byte_costs_only_its_line(tmp_path, toy_soundscapes, capsys):
    lines = (toy_soundscapes / "test.jsonl").read_bytes().splitlines(keepends=True)
    second = json.loads(lines[1])
    column = lines[1].index(b'"', lines[1].index(b'"caption": ') + 11) + 2  # the caption's first character
    lines[1] = lines[1][: column - 1] + b"\xff" + lines[1][column - 1 :]
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b"".join(lines))
    (tmp_path / "audio").symlink_to(toy_soundscapes / "audio")  # the rows' audio paths are relative
    out = tmp_path / "captions.jsonl"
    assert caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--manifest", str(manifest),
                            "--out", str(out)]) == 1
    written = rows(out)
    refused = [r for r in written if r.get("error")]
    assert refused == [{"id": second["id"], "where": f"{manifest}:2", "caption": None, "failed": True,
                        "error": f"{manifest}:2: not valid UTF-8 (byte 0xff at column {column})"}]
    assert sum(r["caption"] is not None for r in written) == len(lines) - 1
    assert f"{len(lines) - 1} captioned, 1 failed, 0 skipped" in capsys.readouterr().err


def test_refused_rows_keep_their_id(tmp_path, toy_soundscapes):
    out = tmp_path / "captions.jsonl"
    bad = toy_soundscapes / "bad.jsonl"
    assert caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--manifest", str(bad),
                            "--out", str(out)]) == 1
    ids = [json.loads(line)["id"] for line in bad.read_text().splitlines()]
    refused = {r["where"]: r["id"] for r in rows(out) if r.get("error")}
    assert refused == {f"{bad}:{n}": i for n, i in enumerate(ids, start=1) if i != "bad-valid"}


def test_every_row_refused_prints_the_first_reasons_and_their_count(tmp_path, toy_soundscapes, capsys):
    bad = toy_soundscapes / "bad.jsonl"
    lines = [line for line in bad.read_text().splitlines() if json.loads(line)["id"] != "bad-valid"]
    manifest = tmp_path / "all-bad.jsonl"
    (tmp_path / "audio").symlink_to(toy_soundscapes / "audio")  # refused for their own faults
    manifest.write_text("".join(line + "\n" for line in lines) + "not a row\n")
    out = tmp_path / "captions.jsonl"
    assert caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--manifest", str(manifest),
                            "--out", str(out)]) == 1
    err = capsys.readouterr().err
    written = rows(out)
    assert len(written) == 6 and all(r["error"] for r in written)
    assert f"{manifest}: all 6 rows are refused; the first 5:\n  {written[0]['error']}" in err
    assert "0 captioned, 6 failed, 0 skipped" in err
