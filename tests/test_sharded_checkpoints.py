"""Sharded checkpoints (grpo_fsdp): each rank writes its own shards through torch.distributed.checkpoint,
a resume equals the uninterrupted run (also on 1 process instead of 2), a corrupt or partial folder is
reported by path and the previous one used, and ``agentcap export`` consolidates a folder.

The unit tests run 2 gloo processes on a tiny Llama; the fits are ``agentcap fit`` subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from gloo import process_group, run_in_two_processes

from agentcap.resume import sharded
from agentcap.resume.checkpoints import (
    TickCheckpoint,
    checkpoint_problem,
    checkpoints,
    latest_checkpoint,
    read_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


class _Agent:
    def __init__(self, model):
        self.model = model


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=50)
    return LlamaForCausalLM(config)


def _trained(rank: int):
    """A tiny Llama sharded over the 2 processes, after one AdamW step."""
    from torch.distributed.device_mesh import init_device_mesh

    from agentcap.parallel.sharding import _shard

    model = _shard(_tiny_llama(), init_device_mesh("cpu", (2,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.arange(10).view(1, 10) + rank
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    return model, optimizer


def _save_both(rank: int, port: int, out: str) -> None:
    """The same state written sharded (a folder) and gathered (the old full file, rank 0)."""
    from agentcap.parallel.sharding import model_state, optimizer_state

    with process_group(rank, port):
        model, optimizer = _trained(rank)
        agent = _Agent(model)
        checkpoint = {"state_dict": model_state(model, full=False), "epoch": 0,
                      "agentcap": {"tick": 3, "summary": {}, "optimizer": optimizer_state(agent, optimizer, full=False),
                                   "reference": model_state(model, full=False)}}
        sharded.save(checkpoint, Path(out) / "folder", rank == 0)
        full = {"state_dict": model_state(model), "optimizer": optimizer_state(agent, optimizer)}
        if rank == 0:
            torch.save(full, Path(out) / "full.pt")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """One 2-process save of the same state, sharded (``folder/``) and gathered (``full.pt``)."""
    out = tmp_path_factory.mktemp("saved")
    run_in_two_processes(_save_both, str(out))
    return out


def _one_process_folder(folder: Path) -> Path:
    """A folder one process wrote (no process group): for the tests of damage, rotation and pointers."""
    model = _tiny_llama()
    checkpoint = {"state_dict": model.state_dict(), "agentcap": {"tick": 1, "summary": {}, "optimizer": None}}
    with warnings.catch_warnings():  # DCP: "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        sharded.save(checkpoint, folder, rank_zero=True)
    return folder


@pytest.mark.slow  # 2 gloo processes (the fixture): ~30 s on 2 busy cores
def test_each_rank_writes_its_shards_and_one_process_reads_them_whole(saved):
    tmp_path = saved
    folder = tmp_path / "folder"
    assert sorted(os.listdir(folder)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    # each rank's file holds about half the tensors' bytes, not a full copy
    sizes = [(folder / f"__{r}_0.distcp").stat().st_size for r in (0, 1)]
    assert max(sizes) < 0.75 * sum(sizes), sizes
    assert checkpoint_problem(str(folder)) is None
    got, want = read_checkpoint(str(folder)), torch.load(tmp_path / "full.pt", weights_only=True)
    assert got["agentcap"]["tick"] == 3 and got["epoch"] == 0
    assert got["state_dict"].keys() == want["state_dict"].keys()
    for key, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=0, atol=0, msg=key)
        torch.testing.assert_close(got["agentcap"]["reference"][key], value, rtol=0, atol=0, msg=key)
    optimizer, full = got["agentcap"]["optimizer"], want["optimizer"]
    assert optimizer["param_groups"] == full["param_groups"] and optimizer["state"].keys() == full["state"].keys()
    for key, state in full["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(optimizer["state"][key][name], value, rtol=0, atol=0, msg=f"{key}.{name}")


def _load_one(rank: int, port: int, out: str) -> None:
    """Rank r's shards from the folder (resharded to a fresh model and optimiser) equal the saved state."""
    from agentcap.parallel.sharding import _shard, load_model_state, load_optimizer_state, model_state, optimizer_state

    with process_group(rank, port):
        from torch.distributed.device_mesh import init_device_mesh

        model = _shard(_tiny_llama(), init_device_mesh("cpu", (2,)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        state = sharded.load(Path(out) / "folder", model)
        load_optimizer_state(_Agent(model), optimizer, state["agentcap"]["optimizer"])
        load_model_state(model, state["agentcap"]["reference"])
        full = {"state_dict": model_state(model), "optimizer": optimizer_state(_Agent(model), optimizer)}  # gathered
        if rank == 0:
            torch.save(full, Path(out) / "loaded.pt")


@pytest.mark.slow  # 2 gloo processes, twice
def test_a_folder_loads_back_shard_by_shard(saved, tmp_path):
    shutil.copytree(saved, tmp_path, dirs_exist_ok=True)
    run_in_two_processes(_load_one, str(tmp_path))
    got, want = (torch.load(tmp_path / name, weights_only=True) for name in ("loaded.pt", "full.pt"))
    for key, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=0, atol=0, msg=key)
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    for key, state in want["optimizer"]["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(got["optimizer"]["state"][key][name], value, rtol=0, atol=0)


@pytest.mark.parametrize("damage", ["missing shard", "truncated shard", "no .metadata", "no meta.pt", "doctored index"])
def test_a_partial_or_corrupt_folder_is_named(tmp_path, damage):
    folder = _one_process_folder(tmp_path / "folder")
    assert checkpoint_problem(str(folder)) is None
    if damage == "missing shard":
        (folder / "__0_0.distcp").unlink()
    elif damage == "truncated shard":
        with open(folder / "__0_0.distcp", "r+b") as handle:
            handle.truncate(100)
    elif damage == "no .metadata":
        (folder / ".metadata").unlink()
    elif damage == "no meta.pt":
        (folder / "meta.pt").unlink()
    else:  # an index that would run code when DCP unpickles it
        import pickle

        (folder / ".metadata").write_bytes(pickle.dumps(os.system))
    problem = checkpoint_problem(str(folder))
    expected = {"missing shard": f"shard {folder / '__0_0.distcp'} is missing",
                "truncated shard": f"shard {folder / '__0_0.distcp'} is truncated (100 of",
                "no .metadata": "no .metadata in the checkpoint folder",
                "no meta.pt": "no meta.pt in the checkpoint folder",
                "doctored index": "refused: it calls posix.system"}[damage]
    assert problem is not None and expected in problem, problem


def test_folders_rotate_and_last_points_at_the_newest(tmp_path):
    """TickCheckpoint's pointer and rotation for folders, without a fit: ``last.ckpt`` is a symlink
    swapped by one rename; rotation removes whole folders; a broken newest folder is skipped."""
    from agentcap.resume.checkpoints import _point_last, _remove, _replace

    _one_process_folder(tmp_path / "folder")
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for tick in (2, 4, 6):
        shutil.copytree(tmp_path / "folder", str(folder / f"tick-{tick:06d}.ckpt") + ".tmp")
        _replace(str(folder / f"tick-{tick:06d}.ckpt") + ".tmp", str(folder / f"tick-{tick:06d}.ckpt"))
        _point_last(str(folder / f"tick-{tick:06d}.ckpt"), TickCheckpoint.path(str(tmp_path / "run")))
    last = Path(TickCheckpoint.path(str(tmp_path / "run")))
    assert last.is_symlink() and os.readlink(last) == "tick-000006.ckpt"
    assert [Path(p).name for p in checkpoints(str(tmp_path / "run"))] == [f"tick-00000{t}.ckpt" for t in (6, 4, 2)]
    _remove(str(folder / "tick-000002.ckpt"))
    assert not (folder / "tick-000002.ckpt").exists()
    (folder / "tick-000006.ckpt" / "__0_0.distcp").unlink()
    reports: list[str] = []
    assert latest_checkpoint(str(tmp_path / "run"), reports.append) == str(folder / "tick-000004.ckpt")
    assert f"checkpoint {last} is unreadable (shard {last / '__0_0.distcp'} is missing)" in reports[0]
    assert reports[-1] == f"agentcap: using the previous checkpoint {folder / 'tick-000004.ckpt'}"


# --- fits ------------------------------------------------------------------------------------------
STAGES = [
    {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
    {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 4},
    {"name": "after", "kind": "evaluate", "split": "test", "greedy": False},
]


def fit(config: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), "--checkpoint_keep=10",
               "--trainer.strategy=grpo_fsdp", *extra]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def assert_same_run(a: Path, b: Path) -> None:
    """Same tick, weights and held-out summary."""
    x, y = (read_checkpoint(TickCheckpoint.path(str(run))) for run in (a, b))
    assert x["agentcap"]["tick"] == y["agentcap"]["tick"] == 7
    assert x["state_dict"].keys() == y["state_dict"].keys()
    for key in x["state_dict"]:
        torch.testing.assert_close(x["state_dict"][key], y["state_dict"][key], atol=1e-6, rtol=1e-5, msg=key)
    s1, s2 = (json.loads((run / "summary.json").read_text())["after"] for run in (a, b))
    assert s1.keys() == s2.keys() and all(abs(s1[k] - s2[k]) < 1e-6 for k in s1), (s1, s2)


def resumed_from(source: Path, ticks: list[int], run: Path, world: Path) -> Path:
    """A config for ``run`` (beside it: ``run/config.yaml`` is the run's own record) and ``source``'s
    checkpoints of ``ticks`` in ``run``."""
    from conftest import read_config

    config = read_config(run, world, STAGES, beta=0.05).rename(run.parent / "config.yaml")
    (run / "checkpoints").mkdir(parents=True)
    for tick in ticks:
        name = f"tick-{tick:06d}.ckpt"
        shutil.copytree(source / "checkpoints" / name, run / "checkpoints" / name)
    return config


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory, toy_movie):
    """2 processes under grpo_fsdp with a KL reference (a full fine-tune: the reference is sharded too)."""
    from conftest import read_config

    run = tmp_path_factory.mktemp("sharded") / "run"
    config = read_config(run, toy_movie, STAGES, beta=0.05)
    fit(config, "--trainer.devices=2")
    return run, toy_movie


@pytest.mark.slow  # `agentcap fit`, 2 processes
def test_a_sharded_fit_writes_folders_of_per_rank_shards(sharded_run):
    run, _ = sharded_run
    names = [Path(p).name for p in checkpoints(str(run))]
    assert names == [f"tick-{t:06d}.ckpt" for t in (7, 6, 4, 2)], names
    last = Path(TickCheckpoint.path(str(run)))
    assert last.is_symlink() and os.readlink(last) == "tick-000007.ckpt"
    for name in names:
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt"} <= set(os.listdir(run / "checkpoints" / name))
        assert checkpoint_problem(str(run / "checkpoints" / name)) is None
    inside = read_checkpoint(str(run / "checkpoints" / "tick-000004.ckpt"))["agentcap"]  # mid-GRPO
    assert inside["optimizer"]["state"] and inside["reference"] and inside["stage_index"] == 1
    assert not list((run / "checkpoints").glob("*.tmp"))


@pytest.mark.slow  # `agentcap fit`, 2 processes
def test_a_corrupt_newest_folder_is_skipped_and_the_resume_equals_the_uninterrupted_run(sharded_run, tmp_path):
    source, world = sharded_run
    run = tmp_path / "run"
    config = resumed_from(source, [2, 4], run, world)
    with open(run / "checkpoints" / "tick-000004.ckpt" / "__1_0.distcp", "r+b") as handle:
        handle.truncate(64)  # a rank killed while writing its shard
    result = fit(config, "--trainer.devices=2")
    bad = run / "checkpoints" / "tick-000004.ckpt"
    assert f"checkpoint {bad} is unreadable (shard {bad / '__1_0.distcp'} is truncated" in result.stderr
    assert f"resuming from {run / 'checkpoints' / 'tick-000002.ckpt'}" in result.stderr
    assert_same_run(source, run)


@pytest.mark.slow  # `agentcap fit`, 1 process
@pytest.mark.parametrize("strategy", ["grpo_fsdp", "auto"])
def test_a_two_process_checkpoint_resumes_on_one(sharded_run, tmp_path, strategy):
    """DCP reshards on load: the folder 2 processes wrote inside the GRPO stage (optimiser state and
    KL reference included) resumes in 1 process, sharded or not, and ends where the 2-process run ended."""
    source, world = sharded_run
    run = tmp_path / "run"
    config = resumed_from(source, [4], run, world)
    result = fit(config, "--trainer.devices=1", f"--trainer.strategy={strategy}")
    assert f"resuming from {run / 'checkpoints' / 'tick-000004.ckpt'}" in result.stderr
    newest = run / "checkpoints" / "tick-000007.ckpt"
    if strategy == "grpo_fsdp":
        assert sorted(os.listdir(newest)) == [".metadata", "__0_0.distcp", "meta.pt"]  # one process, one shard file
    else:
        assert newest.is_file()  # a run that is not sharded writes its one file, as always
    assert_same_run(source, run)


@pytest.mark.slow  # `agentcap fit`, 2 processes (the fixture), then export in this process
def test_export_of_a_sharded_checkpoint_equals_export_of_the_full_one(sharded_run, tmp_path):
    from safetensors.torch import load_file

    run, _ = sharded_run
    config = run / "config.yaml"
    folder = run / "checkpoints" / "tick-000007.ckpt"
    full = tmp_path / "full.ckpt"
    torch.save(read_checkpoint(str(folder)), full)  # the one file a gathered checkpoint would be
    outs = {}
    for name, checkpoint in (("sharded", None), ("full", full)):  # the sharded one through last.ckpt
        outs[name] = tmp_path / name
        extra = [] if checkpoint is None else ["--checkpoint", str(checkpoint)]
        result = subprocess.run([sys.executable, "-m", "agentcap.cli", "export", "--config", str(config),
                                 "--out", str(outs[name]), *extra], cwd=ROOT, env=ENV, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(p.relative_to(outs["sharded"]) for p in outs["sharded"].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(outs["full"]) for p in outs["full"].rglob("*") if p.is_file())
    weights = [f for f in files if f.suffix in (".safetensors", ".bin", ".pt")]
    assert weights, files
    trained = read_checkpoint(str(folder))["state_dict"]
    for name in weights:
        a, b = (load_file(outs[k] / name) if name.suffix == ".safetensors" else torch.load(outs[k] / name)
                for k in ("sharded", "full"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        # and they are the trained weights, not the initial ones
        some = next(k for k in a if a[k].is_floating_point())
        assert any(torch.equal(a[some], v) for v in trained.values()), some
