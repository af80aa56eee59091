"""Resume is explicit and safe (issue 11, cases 4, 5, 6 and the samples table of case 8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from agentcap.cli import main
from agentcap.resume import numerics
from agentcap.resume.checkpoints import TickCheckpoint, checkpoints, latest_checkpoint
from agentcap.training.callbacks import SampleTable

STAGES = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 3}]


@pytest.fixture
def run(tmp_path, toy_movie, make_read_config):
    """A tiny READ config kept outside its run_dir (``--resume fresh`` moves the run's files)."""
    config = make_read_config(tmp_path / "run", toy_movie, STAGES, sft_batch_size=2)
    moved = tmp_path / "config.yaml"
    shutil.move(config, moved)
    return moved, tmp_path / "run"


def fit(config: Path, *extra: str) -> None:
    main(["fit", "--config", str(config), "--checkpoint_every", "1", "--checkpoint_keep", "2", *extra])


@pytest.mark.slow  # Trainer fits
def test_checkpoints_keep_the_newest_n_and_last_points_at_the_newest(run):
    config, run_dir = run
    fit(config)
    names = [os.path.basename(p) for p in checkpoints(str(run_dir))]
    assert names == ["tick-000003.ckpt", "tick-000002.ckpt"]  # tick 1 was pruned (keep 2)
    last = Path(TickCheckpoint.path(str(run_dir)))
    assert last.read_bytes() == (run_dir / "checkpoints" / "tick-000003.ckpt").read_bytes()
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert (run_dir / "config.yaml").is_file()  # the run remembers the config it was started with
    starts = json.loads((run_dir / "numerics.json").read_text())  # and the numerics it ran on
    assert [start["torch_threads"] for start in starts] == [torch.get_num_threads()]


def test_numerics_are_appended_at_every_start_and_a_change_is_named(tmp_path):
    first = numerics.current()
    assert first["cpu_capability"] and first["cpu"] and first["torch"] == torch.__version__
    assert set(first["env"]) == set(numerics.PINNED)
    lines: list[str] = []
    assert numerics.record(str(tmp_path), report=lines.append, numerics=first) == [] and lines == []
    again = {**first, "started": "later", "host": "elsewhere"}  # when and where may differ freely
    assert numerics.record(str(tmp_path), report=lines.append, numerics=again) == [] and lines == []
    other = {**first, "torch_threads": first["torch_threads"] + 1, "env": {**first["env"], "MKL_CBWR": "AVX512"}}
    changed = numerics.record(str(tmp_path), report=lines.append, numerics=other)
    assert changed == [f"torch_threads: {first['torch_threads']} → {first['torch_threads'] + 1}",
                       f"MKL_CBWR: {first['env']['MKL_CBWR']} → AVX512"]
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "torch_threads" in lines[0]
    assert len(json.loads((tmp_path / numerics.NAME).read_text())) == 3


@pytest.mark.parametrize("body", ["{not json", '{"torch_threads": 2}', "[1, 2]"])
def test_an_unreadable_numerics_record_is_set_aside_not_lost(tmp_path, body):
    (tmp_path / numerics.NAME).write_text(body)
    lines: list[str] = []
    assert numerics.record(str(tmp_path), report=lines.append) == []
    assert (tmp_path / f"{numerics.NAME}.bad").read_text() == body
    assert len(lines) == 1 and str(tmp_path / numerics.NAME) in lines[0] and "numerics.json.bad" in lines[0]
    assert len(json.loads((tmp_path / numerics.NAME).read_text())) == 1


@pytest.mark.slow  # Trainer fits
def test_changed_config_is_refused_naming_the_keys(run, capsys):
    config, run_dir = run
    fit(config)
    with pytest.raises(SystemExit) as refused:
        fit(config, "--model.group_size", "2", "--model.sft_batch_size", "3")
    message = str(refused.value)
    assert "--model.group_size: 4 → 2" in message and "--model.sft_batch_size: 2 → 3" in message
    assert "--resume anyway" in message and "--resume fresh" in message
    before = (run_dir / "summary.json").read_bytes() if (run_dir / "summary.json").exists() else None
    fit(config, "--model.group_size", "2", "--resume", "anyway")
    assert "continuing" in capsys.readouterr().err
    if before is not None:
        assert (run_dir / "summary.json").read_bytes() == before
    fit(config, "--resume", "fresh")
    aside = list(run_dir.glob("replaced-*"))
    assert len(aside) == 1 and (aside[0] / "checkpoints").is_dir()
    assert torch.load(TickCheckpoint.path(str(run_dir)), weights_only=True)["agentcap"]["tick"] == 3
    with pytest.raises(SystemExit):  # a typo in the choice is refused by the parser
        fit(config, "--resume", "anyhow")


@pytest.mark.slow  # Trainer fits
def test_a_corrupt_newest_checkpoint_is_reported_and_the_previous_one_used(run, capsys):
    config, run_dir = run
    fit(config)
    newest = run_dir / "checkpoints" / "tick-000003.ckpt"
    with open(TickCheckpoint.path(str(run_dir)), "r+b") as handle:  # truncate last.ckpt (and its link)
        handle.truncate(1000)
    reports: list[str] = []
    assert latest_checkpoint(str(run_dir), reports.append) == str(run_dir / "checkpoints" / "tick-000002.ckpt")
    assert any(TickCheckpoint.path(str(run_dir)) in r for r in reports)
    assert any(str(newest) in r and "unreadable" in r for r in reports)
    capsys.readouterr()
    fit(config)  # resumes from tick 2 and redoes tick 3
    err = capsys.readouterr().err
    assert f"resuming from {run_dir / 'checkpoints' / 'tick-000002.ckpt'}" in err
    assert torch.load(newest, weights_only=True)["agentcap"]["tick"] == 3


def test_garbage_and_missing_checkpoints(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert latest_checkpoint(str(tmp_path), print) is None
    (folder / "last.ckpt").write_bytes(b"not a zip at all")
    torch.save({"no": "state"}, folder / "tick-000004.ckpt")
    torch.save({"state_dict": {}}, folder / "tick-000002.ckpt")
    reports: list[str] = []
    assert latest_checkpoint(str(tmp_path), reports.append) == str(folder / "tick-000002.ckpt")
    assert len(reports) == 3 and "no 'state_dict'" in reports[1]


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluation_refuses_a_run_without_checkpoint(run, command):
    config, run_dir = run
    with pytest.raises(SystemExit, match=rf"agentcap {command}: no checkpoint in {run_dir / 'checkpoints'}"):
        main([command, "--config", str(config)])
    assert not (run_dir / "predictions.jsonl").exists()


@pytest.mark.slow  # a Trainer fit and a test run
def test_test_on_a_new_manifest_reuses_the_run_vocabulary(run, toy_movie, tmp_path, capsys):
    config, run_dir = run
    fit(config)
    saved = json.loads((run_dir / "tokenizers" / "policy.json").read_text())
    rows = [json.loads(line) for line in (toy_movie / "test.jsonl").read_text().splitlines()]
    for row in rows:
        row["features"] = str(toy_movie / row["features"])
        row["ad"] = "Zyxwv quietly unfolds a crimson parasol ."  # words the run has never seen
        row["characters"] = ["Zyxwv"]
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    main(["test", "--config", str(config), f"--model.env.test={{manifest: {other}}}"])
    assert f"test with {run_dir / 'checkpoints' / 'last.ckpt'}" in capsys.readouterr().err
    assert "test" in json.loads((run_dir / "summary.json").read_text())
    assert json.loads((run_dir / "tokenizers" / "policy.json").read_text()) == saved


@pytest.mark.slow  # `agentcap fit` in a subprocess
def test_logger_files_land_in_the_run_dir(run, tmp_path):
    config, run_dir = run
    shared = tmp_path / "shared"
    result = subprocess.run(  # a process of its own: W&B keeps global state
        [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config),
         "--trainer.logger=lightning.pytorch.loggers.WandbLogger", f"--trainer.logger.save_dir={shared}",
         "--trainer.logger.offline=true"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((run_dir / "wandb").glob("offline-run-*"))
    assert (run_dir / "config.yaml").is_file()
    assert not shared.exists() or not any(shared.rglob("*"))


def test_samples_written_after_the_checkpoint_are_dropped_on_resume(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"tick": t, "response": f"r{t}"}) + "\n" for t in (0, 0, 1, 2, 3)))
    module = SimpleNamespace(run_dir=str(tmp_path), tick=2)  # resumed from a checkpoint taken after tick 1
    SampleTable().on_train_start(SimpleNamespace(is_global_zero=True), module)
    assert [json.loads(line)["tick"] for line in path.read_text().splitlines()] == [0, 0, 1]


def test_a_setting_added_by_a_newer_agentcap_is_no_change_at_its_default(tmp_path):
    """config.yaml holds every setting; one it lacks came with a newer agentcap and must not refuse
    the resume while it sits at its default. A free-form key it lacks (an env kwarg) still counts."""
    from agentcap.training.resume_guard import changed_keys

    saved = {"model": {"group_size": 4, "agents": {"policy": {"lr": 1e-3}}, "env": {"kwargs": {"budget": 2}}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    now = {"model": {"group_size": 4, "agents": {"policy": {"lr": 1e-3, "share_prompts": True}},
                     "env": {"kwargs": {"budget": 2}}}}
    assert changed_keys(str(path), now) == []
    now["model"]["agents"]["policy"]["share_prompts"] = False  # not the default: a change
    now["model"]["env"]["kwargs"]["extra"] = 1
    assert changed_keys(str(path), now) == [
        "--model.agents.policy.share_prompts: None → False", "--model.env.kwargs.extra: None → 1"]


@pytest.mark.slow  # Trainer fits
@pytest.mark.parametrize("policy", ["full", "lora_stage_start"])
def test_resuming_inside_a_grpo_stage_with_a_kl_reference_equals_an_uninterrupted_run(tmp_path, toy_movie,
                                                                                      make_read_config, policy):
    """The stage's frozen reference comes back from the checkpoint's own entry: a checkpoint taken
    mid-stage loads, also one written when the reference was a submodule whose weights it held as
    well (they once refused to load), and the run ends with the uninterrupted run's weights and summary.
    A LoRA agent's stage-start reference (its adapter after the SFT stage) comes back the same way."""
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 1},
              {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 5},
              {"name": "after", "kind": "evaluate", "split": "test"}]
    runs = {}
    for name in ("whole", "killed"):
        extra = {} if policy == "full" else {"kl_reference": "stage_start"}
        config = make_read_config(tmp_path / name, toy_movie, stages, sft_batch_size=2, beta=0.05, **extra)
        document = yaml.safe_load(config.read_text())
        document["model"]["agents"]["policy"]["max_new_tokens"] = 32  # room to end: rewards with spread, a moving policy
        if policy != "full":
            document["model"]["agents"]["policy"]["peft"] = {"r": 8, "alpha": 16}
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        shutil.move(config, tmp_path / f"{name}.yaml")
        main(["fit", "--config", str(tmp_path / f"{name}.yaml"), "--checkpoint_every", "1", "--checkpoint_keep", "9"])
        runs[name] = tmp_path / name
    folder = runs["killed"] / "checkpoints"
    for path in [folder / "last.ckpt", *(folder / f"tick-{t:06d}.ckpt" for t in (5, 6, 7))]:
        path.unlink()  # as a kill after the third GRPO step (the first with spread: the policy has moved) leaves it
    (runs["killed"] / "summary.json").unlink()
    saved = torch.load(folder / "tick-000004.ckpt", weights_only=True)
    assert saved["agentcap"]["reference"] is not None
    if policy != "full":  # the adapter as the GRPO stage began, not a copy of the model
        assert all(".lora_" in k for k in saved["agentcap"]["reference"])
    assert not any(k.startswith("_reference.") for k in saved["state_dict"])  # saved once, as stage state
    # as checkpoints written before agentcap 0.1.1 hold it: also as module weights
    saved["state_dict"].update({f"_reference.model.{k}": v for k, v in saved["agentcap"]["reference"].items()})
    torch.save(saved, folder / "tick-000004.ckpt")
    main(["fit", "--config", str(tmp_path / "killed.yaml"), "--checkpoint_every", "1", "--checkpoint_keep", "9"])
    a, b = (torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for run in runs.values())
    assert a.keys() == b.keys() and not any(k.startswith("_reference.") for k in a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    s1, s2 = (json.loads((run / "summary.json").read_text()) for run in runs.values())
    assert s1 == s2
