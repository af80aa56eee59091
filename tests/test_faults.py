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
