"""A run_dir has one owner (issue 26, cases 2–4): a second ``fit`` is refused naming the holder, a
killed holder's lock is taken over, ``--resume fresh`` moves every old file, and a run_dir that
cannot be written is refused before anything is built."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentcap.cli import main
from agentcap.resume.run_dir import RunLock
from agentcap.training.resume_guard import move_aside

ROOT = Path(__file__).resolve().parents[1]
STAGES = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 1}]
HOLD = "import sys, time; from agentcap.resume.run_dir import RunLock; RunLock(sys.argv[1]).acquire(); " \
       "print('held', flush=True); time.sleep(120)"


@pytest.fixture
def run(tmp_path, toy_movie, make_read_config):
    config = make_read_config(tmp_path / "run", toy_movie, STAGES, sft_batch_size=2)
    shutil.move(config, tmp_path / "config.yaml")
    return tmp_path / "config.yaml", tmp_path / "run"


def holder(run_dir: Path) -> subprocess.Popen:
    """Another process holding ``run_dir``'s lock (it says so before the test goes on)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.mark.slow  # a second process holds the lock
def test_a_second_fit_is_refused_naming_the_holder(run):
    config, run_dir = run
    other = holder(run_dir)
    try:
        with pytest.raises(SystemExit) as refused:
            main(["fit", "--config", str(config)])
    finally:
        other.kill()
        other.wait()
    message = str(refused.value.code)
    assert f"{run_dir} is in use by pid {other.pid} on {socket.gethostname()}" in message and "\n" not in message
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "samples.jsonl").exists()


def test_a_killed_holders_lock_is_taken_over_with_a_message(tmp_path):
    pid = os.fork()  # a holder killed before it could release: its body stays, its flock went with it
    if pid == 0:
        RunLock(str(tmp_path)).acquire()
        os._exit(0)  # no release, no cleanup: as SIGKILL leaves it
    os.waitpid(pid, 0)
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == pid
    reports: list[str] = []
    lock = RunLock(str(tmp_path)).acquire(reports.append)
    assert reports == [f"agentcap: {tmp_path / '.lock'}: taking over the stale lock of pid {pid} "
                       f"on {socket.gethostname()} (no longer running)"]
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    with pytest.raises(SystemExit, match=f"in use by pid {os.getpid()} on"):  # held: a second holder is refused
        RunLock(str(tmp_path)).acquire()
    lock.release()
    assert (tmp_path / ".lock").read_text() == ""  # released: nobody trains here
    RunLock(str(tmp_path)).acquire(reports.append).release()
    assert len(reports) == 1  # an empty lock file is no stale holder


@pytest.mark.slow  # two Trainer fits
def test_fit_releases_the_lock_and_a_refused_fit_too(run):
    """The lock is released when fit ends, and when it is refused (here: a changed config), so the
    next command, in the same process too, may take the run_dir."""
    config, run_dir = run
    main(["fit", "--config", str(config)])
    assert (run_dir / ".lock").read_text() == ""
    with pytest.raises(SystemExit, match="another config"):
        main(["fit", "--config", str(config), "--model.group_size", "2"])
    main(["fit", "--config", str(config), "--resume", "fresh"])
    assert (run_dir / ".lock").read_text() == ""


def test_resume_fresh_moves_every_file_of_the_old_run(tmp_path):
    run_dir = tmp_path
    for name in ("eval/after.jsonl", "lightning_logs/version_0/metrics.csv", "checkpoints/last.ckpt",
                 "summary.json", "samples.jsonl", "tokenizers/policy.json", "downloads/x.ckpt",
                 "replaced-20250101T000000Z/summary.json"):
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(name)
    lock = RunLock(str(run_dir)).acquire()
    try:
        move_aside(str(run_dir))
        aside = [p for p in run_dir.glob("replaced-*") if p.name != "replaced-20250101T000000Z"]
        assert len(aside) == 1
        # the lock of the process now training stays, and so does (a copy of) the vocabulary it was built with
        assert sorted(p.name for p in run_dir.iterdir()) == sorted(
            [".lock", "replaced-20250101T000000Z", aside[0].name, "tokenizers"])
        assert (run_dir / "tokenizers" / "policy.json").read_text() == "tokenizers/policy.json"
        for name in ("eval/after.jsonl", "lightning_logs/version_0/metrics.csv", "checkpoints/last.ckpt",
                     "tokenizers/policy.json", "downloads/x.ckpt"):
            assert (aside[0] / name).read_text() == name
        assert (run_dir / "replaced-20250101T000000Z" / "summary.json").is_file()  # an older run stays where it is
        assert json.loads((run_dir / ".lock").read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def unwritable(tmp_path: Path) -> Path:
    """A folder no file can be created in: read-only bits, or, for root (whom they do not stop),
    /proc, which takes no new files from anyone."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "probe").touch()
    except OSError:
        return folder
    (folder / "probe").unlink()
    return Path("/proc")


@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict"])
def test_a_run_dir_that_cannot_be_written_is_refused_up_front(run, tmp_path, command, capsys):
    config, _ = run
    run_dir = unwritable(tmp_path) / "run"
    with pytest.raises(SystemExit) as refused:
        main([command, "--config", str(config), "--model.run_dir", str(run_dir)])
    message = str(refused.value.code)
    assert message.startswith(f"agentcap {command}: --model.run_dir {run_dir} cannot be written")
    assert "\n" not in message
    assert "Traceback" not in capsys.readouterr().err
    (tmp_path / "read-only").chmod(0o755)
