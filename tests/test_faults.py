"""Faults named in one line (issue 34): checkpoint settings, a full disk, SIGINT (test_signals.py), …"""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pytest

from agentcap.cli import main
from agentcap.core.settings import ConfigError
from agentcap.resume.checkpoints import TickCheckpoint
from agentcap.resume.disk import OutOfSpace, is_full, no_space


# --- checkpoint settings ------------------------------------------------------------------------
@pytest.mark.parametrize("flag, value", [("--checkpoint_keep", 0), ("--checkpoint_every", 0), ("--checkpoint_every", -3)])
def test_checkpoint_settings_out_of_range_are_refused_in_one_line(flag, value, tmp_path, toy_movie, make_read_config,
                                                                  capsys):
    with pytest.raises(ConfigError, match=rf"^{flag} must be ≥ 1, got {value} \("):
        TickCheckpoint(**{flag.removeprefix("--checkpoint_"): value})
    config = make_read_config(tmp_path / "run", toy_movie, [{"name": "e", "kind": "evaluate", "split": "val"}])
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), flag, str(value)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"agentcap: {flag} must be ≥ 1, got {value}")
    assert "Traceback" not in err and not (tmp_path / "run" / "tokenizers").exists()  # refused before building


# --- a full disk --------------------------------------------------------------------------------
class FullDiskTrainer:
    """``save_checkpoint`` writes half a file, then fails as torch's stream writer does on a full disk."""

    is_global_zero = True
    strategy = SimpleNamespace(barrier=lambda name: None)

    def save_checkpoint(self, path, weights_only=False):
        with open(path, "wb") as handle:
            handle.write(b"PK\x03\x04 half a zip")
        raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file "
                           "data/3: file write failed")


def test_a_full_disk_names_the_checkpoint_and_leaves_no_partial_tmp(tmp_path):
    module = SimpleNamespace(run_dir=str(tmp_path / "run"), tick=4)
    with pytest.raises(OutOfSpace) as error:
        TickCheckpoint(every=1).save(FullDiskTrainer(), module)
    message = str(error.value)
    path = TickCheckpoint.tick_path(module.run_dir, 4)
    assert message.startswith(f"saving the checkpoint {path} (") and "MB free in" in message
    assert "\n" not in message and "no space left on device" in message.lower()
    assert os.listdir(tmp_path / "run" / "checkpoints") == []  # no tick-000004.ckpt.tmp


def test_a_full_tmpdir_is_named_when_the_error_names_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    err = OSError(errno.ENOSPC, "No space left on device")  # as tempfile's writes raise it: no filename
    assert is_full(err)
    message = str(no_space(err))
    assert message.startswith(f"writing a temporary file in TMPDIR ({tmp_path};") and "point TMPDIR" in message
    named = str(no_space(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "m.jsonl"))))
    assert named.startswith(f"writing {tmp_path / 'm.jsonl'} (")
    assert not is_full(OSError(errno.ENOENT, "missing")) and not is_full(RuntimeError("other"))


# --- a torn last line in a file agentcap appends to ------------------------------------------------
def test_a_torn_last_sample_line_is_dropped_naming_the_file_and_line(tmp_path, capsys):
    import json

    from agentcap.training.callbacks import SampleTable

    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"tick": t}) + "\n" for t in (0, 1, 2)) + '{"tick": 3, "resp')  # killed mid-write
    SampleTable().on_train_start(SimpleNamespace(is_global_zero=True), SimpleNamespace(run_dir=str(tmp_path), tick=2))
    assert [json.loads(line)["tick"] for line in path.read_text().splitlines()] == [0, 1]
    assert capsys.readouterr().err.strip() == (
        f"agentcap: {path}:4: a torn last line (the process was killed while writing it); dropped")


# --- data convert: a Latin-1 line, a 10 MB cell -----------------------------------------------------
def test_a_latin1_line_and_a_huge_cell_cost_only_their_rows(tmp_path):
    import json
    from pathlib import Path

    from agentcap.commands.data import data_command

    public = Path(__file__).parent / "data" / "public" / "clotho"
    csv = tmp_path / "captions.csv"
    csv.write_bytes(
        b"file_name,caption_1,caption_2,caption_3,caption_4,caption_5\n"
        b"birds.wav,Birds chirp in the trees.,Small birds sing.,,,\n"
        b"birds.wav,Caf\xe9 noise and birds.,,,,\n"                       # line 3: Latin-1
        b"birds.wav,\"" + b"x" * 10_000_000 + b"\",,,,\n"                 # line 4: a 10 MB cell
        b"\"rain, heavy.wav\",Heavy rain falls on leaves.,\"a caption\nover two lines\",,,\n")
    out = tmp_path / "m.jsonl"
    code = data_command(["convert", "--from", "clotho", "--input", str(csv), "--root", str(public / "audio"),
                         "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    refused = [json.loads(line) for line in (tmp_path / "m.refused.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and any("over two lines" in json.dumps(r) for r in rows)  # the rest is kept
    reasons = {r["where"]: r["reason"] for r in refused}
    assert reasons[f"{csv}:3"] == f"{csv}:3: not valid UTF-8 (byte 0xe9 at column 14)"
    assert reasons[f"{csv}:4"].startswith(f"{csv}:4: a line of 10000017 bytes, longer than the 131072")


# --- the resume guard ------------------------------------------------------------------------------
def test_the_resume_guard_names_only_the_changed_leaf_and_compares_precision(tmp_path):
    import yaml

    from agentcap.training.resume_guard import changed_keys

    stages = [{"name": f"s{i}", "kind": "sft", "agent": "policy", "steps": 120, "lr": 3e-3,
               "warmup_steps": 0, "max_duration": None} for i in range(6)]
    saved = {"seed_everything": 0, "trainer": {"precision": None, "strategy": "auto", "devices": 1},
             "model": {"group_size": 8, "stages": stages}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    now = yaml.safe_load(yaml.safe_dump(saved))
    now["trainer"].update(precision="32-true", strategy="ddp", devices=2)  # the same numbers: no change
    assert changed_keys(str(path), now) == []
    now["model"]["stages"][3]["lr"] = 1e-3
    now["trainer"]["precision"] = "bf16-mixed"
    now["trainer"]["deterministic"] = True
    changed = changed_keys(str(path), now)
    assert changed == ["--model.stages[3].lr: 0.003 → 0.001", "--trainer.precision: '32-true' → 'bf16-mixed'",
                       "--trainer.deterministic: None → True"]
    now["model"]["stages"].append({**stages[0], "name": "extra " * 30})  # a stage added: one line, cut short
    added = next(line for line in changed_keys(str(path), now) if "stages[6]" in line)
    assert added.startswith("--model.stages[6]: None → {'name': ") and len(added) < 100
    now["model"].update({f"k{i}": i for i in range(20)})
    assert changed_keys(str(path), now)[-1] == "and 16 more"


# --- two writers of one --out ------------------------------------------------------------------------
def test_a_second_writer_of_one_out_is_refused_naming_the_holder(tmp_path):
    import json

    from agentcap.commands.outputs import JsonlOutput

    out = tmp_path / "captions.jsonl"
    with JsonlOutput(str(out), "agentcap caption") as first:
        first.write({"id": "a"})
        with pytest.raises(SystemExit) as refused:
            JsonlOutput(str(out), "agentcap caption")
        assert str(refused.value) == (f"agentcap caption: --out {out} is being written by pid {os.getpid()} "
                                      f"({out}.partial is locked); wait for it to end, stop it, or choose another --out")
        first.write({"id": "b"})
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]  # no NUL, none lost
    with JsonlOutput(str(out)) as again:  # the lock went with the first writer
        again.write({"id": "c"})
    assert out.read_text().count("\n") == 1 and not (tmp_path / "captions.jsonl.partial").exists()


def test_a_second_caption_writer_exits_2_in_one_line(tmp_path, capsys, monkeypatch):
    from agentcap import launcher
    from agentcap.commands.caption import Outcome
    from agentcap.commands.outputs import JsonlOutput

    out = tmp_path / "captions.jsonl"
    with JsonlOutput(str(out)):
        monkeypatch.setattr(launcher, "run_command", lambda argv: Outcome(str(out), skipping=False))
        with pytest.raises(SystemExit) as refused:
            launcher.main(["caption", "--out", str(out)])
        assert refused.value.code == 2
        assert capsys.readouterr().err == (f"agentcap caption: --out {out} is being written by pid {os.getpid()} "
                                           f"({out}.partial is locked); wait for it to end, stop it, or choose another --out\n")


def test_data_convert_refuses_a_second_writer_of_its_out(tmp_path, capsys):
    from pathlib import Path

    from agentcap.commands.data import data_command
    from agentcap.commands.outputs import lock_output

    public = Path(__file__).parent / "data" / "public" / "clotho"
    out = tmp_path / "m.jsonl"
    held = lock_output("test", "--out", str(out))
    argv = ["convert", "--from", "clotho", "--input", str(public / "clotho_captions_development.csv"),
            "--root", str(public / "audio"), "--out", str(out)]
    assert data_command(argv) == 2 and not out.exists()
    assert f"--out {out} is being written by pid {os.getpid()}" in capsys.readouterr().err
    os.close(held)
    assert data_command(argv) == 0 and out.exists() and not (tmp_path / "m.jsonl.partial").exists()


# --- configs: a size limit, an alias budget ------------------------------------------------------------
def test_a_huge_config_and_an_anchor_bomb_are_refused_before_they_are_expanded(tmp_path):
    from agentcap.resume.configs import MAX_CONFIG_BYTES, read_config

    big = tmp_path / "big.yaml"
    big.write_text("model: {x: '" + "x" * (MAX_CONFIG_BYTES + 10) + "'}\n")
    with pytest.raises(SystemExit, match=r"^agentcap fit: config .*big\.yaml is 1\.0 MB; a config is at most 1 MB"):
        read_config(str(big), "agentcap fit")
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nmodel: *a9\n")
    with pytest.raises(SystemExit, match=r"anchors and aliases expand to more than 100000 values; refused"):
        read_config(str(bomb), "agentcap fit")
    fine = tmp_path / "fine.yaml"  # a few anchors, as recipes use them: read as before
    fine.write_text("defaults: &agent {lr: 0.001}\nmodel: {agents: {a: *agent, b: *agent}}\n")
    assert read_config(str(fine), "agentcap fit")["model"]["agents"]["b"] == {"lr": 0.001}
