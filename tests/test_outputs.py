"""Output paths of `agentcap evaluate` and `agentcap export` are checked before any work (issue 26):
never an input, their folder created or refused up front; results are renamed into place whole."""

from __future__ import annotations

import json
import os

import pytest

from agentcap.commands import evaluate
from agentcap.commands.export import export_command
from agentcap.commands.outputs import JsonlOutput, check_output


@pytest.fixture
def predictions(tmp_path, toy_movie):
    rows = [json.loads(line) for line in (toy_movie / "test.jsonl").read_text().splitlines()]
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "caption": r["ad"]}) + "\n" for r in rows))
    return path


def evaluate_argv(toy_movie, predictions, out) -> list[str]:
    return ["--env", "agentcap/ADClip-v0", "--manifest", str(toy_movie / "test.jsonl"),
            "--predictions", str(predictions), "--no-meteor", "--out", str(out)]


@pytest.fixture
def no_metrics(monkeypatch):
    """The refusals below must come before any metric is computed."""

    def computed(*args, **kwargs):
        raise AssertionError("metrics were computed before --out was checked")

    monkeypatch.setattr("agentcap.evaluation.tasks.task_metrics", computed)


def test_evaluate_refuses_an_out_that_is_an_input(tmp_path, toy_movie, predictions, no_metrics):
    before = predictions.read_bytes()
    with pytest.raises(SystemExit, match=r"--out .*predictions.jsonl' is the --predictions .*; writing there would destroy it"):
        evaluate.evaluate_command(evaluate_argv(toy_movie, predictions, predictions))
    assert predictions.read_bytes() == before
    with pytest.raises(SystemExit, match=r"--out .* is the --manifest"):
        evaluate.evaluate_command(evaluate_argv(toy_movie, predictions, toy_movie / "test.jsonl"))


def test_evaluate_refuses_an_out_folder_it_cannot_create(tmp_path, toy_movie, predictions, no_metrics):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit, match=r"--out .*a-file/sub/out.jsonl': cannot create its folder .*a-file/sub"):
        evaluate.evaluate_command(evaluate_argv(toy_movie, predictions, tmp_path / "a-file" / "sub" / "out.jsonl"))
    with pytest.raises(SystemExit, match=r"--out .* is a folder; give a file name"):
        evaluate.evaluate_command(evaluate_argv(toy_movie, predictions, tmp_path))


@pytest.mark.slow  # every metric of the toy movie's test split, ~20 s
def test_evaluate_out_into_a_missing_folder_is_written(tmp_path, toy_movie, predictions):
    out = tmp_path / "missing" / "deeper" / "scored.jsonl"
    assert evaluate.evaluate_command(evaluate_argv(toy_movie, predictions, out)) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == len(predictions.read_text().splitlines()) and all(r["reference"] for r in written)
    assert not out.with_name("scored.jsonl.partial").exists()


def test_export_refuses_an_out_folder_that_is_an_input(tmp_path):
    config, checkpoint = tmp_path / "c.yaml", tmp_path / "w.ckpt"
    config.write_text("model: {}\n")
    checkpoint.write_bytes(b"weights")
    with pytest.raises(SystemExit, match=r"agentcap export: --out .*c.yaml' is the --config"):
        export_command(["--config", str(config), "--out", str(config)])
    with pytest.raises(SystemExit, match=r"--out .*w.ckpt' is the --checkpoint"):
        export_command(["--config", str(config), "--checkpoint", str(checkpoint), "--out", str(checkpoint)])
    assert config.read_text() == "model: {}\n" and checkpoint.read_bytes() == b"weights"


def test_a_hard_link_to_an_input_is_that_input(tmp_path):
    source = tmp_path / "m.jsonl"
    source.write_text("{}\n")
    os.link(source, tmp_path / "alias.jsonl")
    with pytest.raises(SystemExit, match="is the manifest"):
        check_output("cmd", "--out", str(tmp_path / "alias.jsonl"), {"manifest": str(source)})
    check_output("cmd", "--out", str(tmp_path / "other.jsonl"), {"manifest": str(source)})


def test_an_interrupted_write_leaves_the_earlier_file(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("earlier\n")
    with pytest.raises(KeyboardInterrupt), JsonlOutput(str(path)) as out:
        out.write({"id": 1})
        raise KeyboardInterrupt
    assert path.read_text() == "earlier\n" and (tmp_path / "out.jsonl.partial").read_text() == '{"id": 1}\n'
    with JsonlOutput(str(path)) as out:
        out.write({"id": 2})
    assert path.read_text() == '{"id": 2}\n' and not (tmp_path / "out.jsonl.partial").exists()


def test_a_full_disk_under_out_is_one_line_naming_the_file(tmp_path):
    """ENOSPC while a row is written (tools/repro_faults.py case 13a2: a full tmpfs under `caption --out`):
    one line naming the partial file and the room there, the partial removed, the earlier --out whole."""
    import errno

    out = tmp_path / "captions.jsonl"
    out.write_text('{"id": "earlier"}\n')

    class Full:
        closed = False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = lambda self: None

    writer = JsonlOutput(str(out), "agentcap caption")
    writer.handle.close()
    writer.handle = Full()
    with pytest.raises(SystemExit) as stopped:
        with writer:
            writer.write({"id": "a"})
    assert str(stopped.value).startswith(f"agentcap caption: writing {out}.partial (") and "MB free in" in str(stopped.value)
    assert "\n" not in str(stopped.value) and not (tmp_path / "captions.jsonl.partial").exists()
    assert out.read_text() == '{"id": "earlier"}\n'
