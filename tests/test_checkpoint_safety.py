"""Checkpoints never run code (issue 26, case 1): every way a checkpoint comes in (``--ckpt_path`` of
fit / validate, a URL, ``--checkpoint`` of caption / evaluate / export) loads tensors only, and a
pickle that would run code is refused in one line naming the file."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest
import torch

from agentcap.cli import main
from agentcap.resume.checkpoints import latest_checkpoint, usable_checkpoint
from agentcap.training.loading import load_module

STAGES = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 1}]


class CreatesAFile:
    """Unpickled without ``weights_only``, this object is ``open(marker, "w")``: the marker appears."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def setup(tmp_path, toy_movie, make_read_config):
    """A tiny READ config (outside its run_dir), a hostile checkpoint, and the file it would create."""
    config = make_read_config(tmp_path / "run", toy_movie, STAGES, sft_batch_size=2)
    shutil.move(config, tmp_path / "config.yaml")
    marker = tmp_path / "code-ran"
    evil = tmp_path / "served" / "evil.ckpt"
    evil.parent.mkdir()
    torch.save({"state_dict": {}, "agentcap": CreatesAFile(marker)}, evil)
    return tmp_path / "config.yaml", tmp_path / "run", evil, marker


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server of ``tmp_path/served``, in a thread; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_hostile_checkpoint_runs_code_when_loaded_without_weights_only(setup):
    """The fixture is a real attack: a plain ``torch.load`` creates the marker."""
    _, _, evil, marker = setup
    torch.load(evil, weights_only=False)
    assert marker.exists()


def refused(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    message = str(exit_info.value.code)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("command", ["fit", "validate"])
@pytest.mark.parametrize("remote", [False, True], ids=["file", "url"])
def test_ckpt_path_that_would_run_code_is_refused(setup, server, command, remote):
    config, run_dir, evil, marker = setup
    given = f"{server}/evil.ckpt" if remote else str(evil)
    message = refused([command, "--config", str(config), "--ckpt_path", given])
    loaded = run_dir / "downloads" / "evil.ckpt" if remote else evil  # a URL is fetched into the run first
    assert message.startswith(f"agentcap {command}: --ckpt_path {loaded}: refused: loading it would run code")
    assert "io.open" in message
    assert not marker.exists()


@pytest.mark.parametrize("command", ["caption", "evaluate", "export"])
@pytest.mark.parametrize("remote", [False, True], ids=["file", "url"])
def test_checkpoint_of_the_commands_that_would_run_code_is_refused(setup, server, tmp_path, command, remote):
    config, run_dir, evil, marker = setup
    given = f"{server}/evil.ckpt" if remote else str(evil)
    extra = {"caption": ["--out", str(tmp_path / "captions.jsonl")], "evaluate": [],
             "export": ["--out", str(tmp_path / "exported")]}[command]
    message = refused([command, "--config", str(config), "--checkpoint", given, *extra])
    loaded = run_dir / "downloads" / "evil.ckpt" if remote else evil
    assert message.startswith(f"agentcap {command}: --checkpoint {loaded}: refused: loading it would run code "
                              "(it calls io.open)")
    assert not marker.exists()


def test_a_checkpoint_url_is_downloaded_into_the_run_and_loaded(setup, server):
    config, run_dir, _, _ = setup
    trained = load_module(str(config), None)
    with torch.no_grad():
        for weight in trained.parameters():
            weight.add_(1.0)  # differs from the freshly built module's weights
    torch.save({"state_dict": trained.state_dict()}, Path(setup[2]).parent / "good.ckpt")
    module = load_module(str(config), f"{server}/good.ckpt")
    assert (run_dir / "downloads" / "good.ckpt").is_file()
    for name, weight in trained.state_dict().items():
        torch.testing.assert_close(module.state_dict()[name], weight, rtol=0, atol=0, msg=name)


def test_an_unreachable_url_is_one_line(setup):
    config, _, _, _ = setup
    message = refused(["validate", "--config", str(config), "--ckpt_path", "http://127.0.0.1:9/missing.ckpt"])
    assert message.startswith("agentcap validate: --ckpt_path http://127.0.0.1:9/missing.ckpt: download failed")


def test_the_runs_own_checkpoint_that_would_run_code_is_skipped(setup):
    """Resume and validate / test / predict without --ckpt_path read the run's newest checkpoint the
    same way: one that would run code is reported and the previous one used."""
    _, run_dir, evil, marker = setup
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copyfile(evil, folder / "last.ckpt")
    torch.save({"state_dict": {}}, folder / "tick-000001.ckpt")
    reports: list[str] = []
    assert latest_checkpoint(str(run_dir), reports.append) == str(folder / "tick-000001.ckpt")
    assert "refused: loading it would run code (it calls io.open)" in reports[0]
    assert not marker.exists()


def test_other_urls_are_refused_where_agentcap_loads_and_left_to_lightning_with_weights_only(tmp_path):
    with pytest.raises(SystemExit, match=r"^agentcap export: --checkpoint s3://b/x.ckpt: only local files and http"):
        usable_checkpoint("s3://b/x.ckpt", str(tmp_path), "--checkpoint", "agentcap export")
    given = usable_checkpoint("s3://b/x.ckpt", str(tmp_path), "--ckpt_path", "agentcap fit", lightning=True)
    assert given == "s3://b/x.ckpt"  # the Trainer loads it, told weights_only=True
