"""A frozen or dead rank is named (issue 34 cases 10 and 13): agentcap's collective timeout, the
heartbeat watchdog's line while a rank waits, and one line when the collective fails."""

from __future__ import annotations

import datetime
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo import free_port

from agentcap.parallel import watchdog

WHERE = (3, "grpo")


def test_the_strategies_pass_agentcaps_collective_timeout(monkeypatch):
    from agentcap.parallel.strategies import GRPODDPStrategy, GRPOFSDPStrategy

    monkeypatch.delenv(watchdog.TIMEOUT_ENV, raising=False)
    assert GRPODDPStrategy()._timeout == GRPOFSDPStrategy()._timeout == datetime.timedelta(seconds=600)
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, "7")
    assert GRPODDPStrategy()._timeout == GRPOFSDPStrategy()._timeout == datetime.timedelta(seconds=7)
    assert GRPODDPStrategy(timeout=3)._timeout == datetime.timedelta(seconds=3)
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, "-1")
    with pytest.raises(ValueError, match="AGENTCAP_COLLECTIVE_TIMEOUT must be > 0"):
        watchdog.collective_timeout()


def _peer(rank: int, port: int, folder: str, fate: str) -> None:
    """Rank 1: joins, beats, then stops itself (SIGSTOP) or dies (SIGKILL) before the collective."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2,
                            timeout=datetime.timedelta(seconds=60))  # a spawned interpreter's imports take seconds
    dist.new_group(timeout=datetime.timedelta(seconds=4))
    watchdog.Heartbeat(folder, 1, 2, "run", lambda: WHERE, after=1.0, every=0.2).start()
    time.sleep(0.6)
    os.kill(os.getpid(), signal.SIGSTOP if fate == "freeze" else signal.SIGKILL)
    os._exit(0)  # continued by the test: leave without touching the group


def _two_ranks(tmp_path, fate: str):
    """Rank 0 here waits in an all-reduce rank 1 never joins; returns (error, seconds, watchdog output,
    the failure's line while rank 1 is still stopped or dead, rank 1's pid)."""
    folder = str(tmp_path / "heartbeats")
    port = free_port()
    context = mp.get_context("spawn")
    peer = context.Process(target=_peer, args=(1, port, folder, fate), daemon=True)
    peer.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    group = dist.new_group(timeout=datetime.timedelta(seconds=4))  # the collective timeout under test
    out = io.StringIO()
    beat = watchdog.Heartbeat(folder, 0, 2, "run", lambda: WHERE, after=1.0, every=0.2, out=out).start()
    try:
        deadline = time.monotonic() + 20
        while beat.peers()[1] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.monotonic()
        with pytest.raises(RuntimeError) as failed:
            dist.all_reduce(torch.ones(1), group=group)
        seconds = time.monotonic() - start
        diagnosed, line = beat.failure(failed.value, "runs/x/checkpoints/tick-000002.ckpt")
        assert diagnosed
        return failed.value, seconds, out.getvalue(), line, peer.pid
    finally:
        beat.stop()
        if peer.is_alive():
            os.kill(peer.pid, signal.SIGKILL)
        peer.join(timeout=10)
        dist.destroy_process_group()


@pytest.mark.slow  # two gloo processes; about 6 s
def test_a_frozen_rank_is_named_while_the_others_wait_and_when_the_timeout_ends_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, "4")
    error, seconds, said, line, pid = _two_ranks(tmp_path, "freeze")
    assert 3.5 < seconds < 15, seconds  # the group's timeout, not Lightning's 30 minutes
    assert watchdog.is_collective_error(error), error
    lines = said.splitlines()
    assert len(lines) == 1, said  # one line, once
    assert lines[0].startswith(f"agentcap: rank 0 has waited 1 s in all_reduce at tick 3 of stage 'grpo'; not arrived: "
                               f"rank 1 (pid {pid}) is stopped (SIGSTOP or a debugger; last heard"), said
    assert "the collective times out after 4 s" in lines[0]
    assert line.startswith(f"agentcap: rank 1 (pid {pid}) is stopped (SIGSTOP or a debugger; last heard"), line
    assert "did not arrive within the 4 s collective timeout at tick 3 of stage 'grpo'; rank 0 stopped; " \
           "the newest checkpoint runs/x/checkpoints/tick-000002.ckpt is kept" in line, line
    print(f"frozen rank: {seconds:.1f} s; watchdog: {lines[0]}\nfailure: {line}")


@pytest.mark.slow  # two gloo processes; about 2 s
def test_a_dead_peer_is_named_with_the_checkpoint_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, "4")
    error, seconds, _, line, pid = _two_ranks(tmp_path, "die")
    assert watchdog.is_collective_error(error), error
    assert seconds < 4, seconds  # the closed connection, not the timeout
    assert line.startswith(f"agentcap: rank 1 (pid {pid}) died (last heard"), line
    assert line.endswith("broke the collective at tick 3 of stage 'grpo'; rank 0 stopped; the newest checkpoint "
                         "runs/x/checkpoints/tick-000002.ckpt is kept; rerun the same command to resume from it"), line
    print(f"dead rank: {seconds:.1f} s; gloo said {str(error).splitlines()[0][:120]!r}\nfailure: {line}")


def test_a_failure_that_is_no_peers_fault_keeps_its_traceback(tmp_path):
    beat = watchdog.Heartbeat(str(tmp_path), 0, 2, "run", lambda: WHERE)
    beat.beat()
    other = watchdog.Heartbeat(str(tmp_path), 1, 2, "run", lambda: WHERE)
    other.beat()  # alive (this very process) and heard from just now
    assert beat.failure(RuntimeError("gloo: some other error"), None) == (False, None)
    stale = watchdog.Heartbeat(str(tmp_path), 1, 2, "an earlier run", lambda: WHERE)
    stale.beat()  # a file of another run is no heartbeat of this one
    assert beat.peers() == {1: None}


def _fit(config, *extra: str, env: dict | None = None):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "tests"), **(env or {})}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config),
                             "--trainer.devices=2", "--trainer.strategy=grpo_ddp", "--checkpoint_every=2", *extra],
                            check=False, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    return result, time.monotonic() - start


@pytest.mark.slow  # `agentcap fit` on 2 DDP ranks, one killed at tick 3
def test_a_fit_whose_peer_dies_names_it_in_one_line(tmp_path, toy_movie, make_read_config):
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 6}]
    config = make_read_config(tmp_path / "run", toy_movie, stages, sft_batch_size=2)
    result, seconds = _fit(config, "--trainer.callbacks+=kill_switch.KillAtTick", "--trainer.callbacks.tick=3",
                           "--trainer.callbacks.rank=1")
    # 1, or -9 when Lightning's launcher, seeing its child gone, SIGKILLs rank 0 first (after the line)
    assert result.returncode in (1, -9), result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    said = [s for s in result.stderr.splitlines() if s.startswith("agentcap: rank ")]
    assert len(said) == 1, result.stderr[-3000:]
    line = said[0]
    assert line.startswith("agentcap: rank 1 (pid ") and " died (last heard " in line, line
    assert f"rank 0 stopped; the newest checkpoint {tmp_path / 'run' / 'checkpoints' / 'last.ckpt'} is kept" in line
    print(f"fit, rank 1 killed: exit {result.returncode} in {seconds:.0f} s: {line}")

