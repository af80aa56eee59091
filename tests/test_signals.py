"""SIGTERM and SIGUSR1 end a run promptly with 128 + the signal's number, never 0, saving between ticks."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from agentcap.judges.served import ServedClient
from agentcap.parallel import signals
from agentcap.resume.checkpoints import checkpoint_problem

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def handlers():
    """The stop handlers for one test; the process's own handlers and state afterwards."""
    saved = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    signals.reset()
    signals.install()
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    signals.reset()
    gc.unfreeze()  # stop_on_signals froze this process's objects for a quick exit


def signal_later(signum: int, seconds: float) -> None:
    threading.Timer(seconds, os.kill, (os.getpid(), signum)).start()


def test_outside_a_trainer_a_signal_stops_at_once(handlers):
    with pytest.raises(signals.Stopped) as stopped:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)  # the handler runs as soon as the signal arrives
    assert stopped.value.code == 128 + signal.SIGUSR1 and str(stopped.value) == "stopped by SIGUSR1"


def test_sigint_is_a_stop_signal_like_sigterm(handlers):
    """Ctrl-C: not Python's KeyboardInterrupt (Lightning exited 1 mid-step, nothing saved) but 130."""
    assert signal.SIGINT in signals.STOP_SIGNALS
    with pytest.raises(signals.Stopped) as stopped:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert stopped.value.code == 130 and str(stopped.value) == "stopped by SIGINT"


def test_a_run_that_got_a_signal_never_exits_0(handlers):
    """Lightning ends a fit it stopped on SIGTERM with SystemExit(None), status 0."""
    signals.StopOnSignal().setup(SimpleNamespace(), None, "fit")  # a trainer runs: the signal waits for a batch
    with pytest.raises(SystemExit) as stopped, signals.stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit  # as Lightning's SIGTERMException
    assert stopped.value.code == 143
    with pytest.raises(SystemExit) as stopped, signals.stop_on_signals():
        pass  # the last tick finished anyway
    assert stopped.value.code == 143
    signals.reset()
    with signals.stop_on_signals():  # no signal: nothing changes
        pass
    with pytest.raises(SystemExit) as failed, signals.stop_on_signals():
        raise SystemExit(2)
    assert failed.value.code == 2


def test_a_signal_ends_a_wait_on_a_silent_judge(handlers):
    """Inside a trainer's step the signal is deferred, but a judge's wait notices it within 0.1 s."""
    server = socket_that_never_answers()
    try:
        signals.StopOnSignal().setup(SimpleNamespace(), None, "fit")
        client = ServedClient(f"http://127.0.0.1:{server.getsockname()[1]}/v1", "judge", timeout=60, retries=3)
        signal_later(signal.SIGTERM, 0.5)
        start = time.monotonic()
        with pytest.raises(signals.Stopped) as stopped:
            client.map("/chat/completions", [{"messages": []}] * 4)
        assert time.monotonic() - start < 2.0 and stopped.value.code == 143
        assert not stopped.value.between_ticks  # mid-step: not worth a checkpoint
    finally:
        server.close()


def socket_that_never_answers() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0), backlog=64)  # connections queue; nothing is ever read


def fit_process(config: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT / "tests")}
    return subprocess.Popen([sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow  # `agentcap fit` in a subprocess, twice
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_a_signalled_fit_saves_its_tick_exits_non_zero_and_resumes(tmp_path, toy_movie, make_read_config, signum):
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 8}]
    config = make_read_config(tmp_path / "run", toy_movie, stages).rename(tmp_path / "config.yaml")
    # checkpoint_every 2 saves ticks 4 and 6; the signal comes at the end of tick 5
    stopped = fit_process(config, "--trainer.callbacks+=kill_switch.SignalAtTick", "--trainer.callbacks.tick=5",
                          f"--trainer.callbacks.signum={int(signum)}")
    _, err = stopped.communicate(timeout=600)
    assert stopped.returncode == 128 + signum, err[-3000:]
    assert f"agentcap: {signal.Signals(signum).name}: stopped at tick 5; saved" in err
    saved = tmp_path / "run" / "checkpoints" / "tick-000005.ckpt"
    assert checkpoint_problem(str(saved)) is None
    assert torch.load(saved, map_location="cpu", weights_only=True)["agentcap"]["tick"] == 5
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["agentcap"]["tick"] == 5
    if signum != signal.SIGTERM:
        return  # resuming is the same for both
    resumed = fit_process(config)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert "resuming from" in err
    assert torch.load(last, map_location="cpu", weights_only=True)["agentcap"]["tick"] == 8


@pytest.mark.slow  # `agentcap fit` in a subprocess
def test_sigterm_while_waiting_on_a_silent_judge_ends_the_fit_in_seconds(tmp_path, toy_soundscapes, make_game_config):
    server = socket_that_never_answers()
    try:
        examiner = {"url": f"http://127.0.0.1:{server.getsockname()[1]}/v1", "model": "judge", "timeout": 300}
        stages = [{"name": "S0", "kind": "evaluate", "split": "test"}]
        config = make_game_config(tmp_path / "run", toy_soundscapes, stages)
        settings = yaml.safe_load(config.read_text())
        settings["model"]["env"]["kwargs"]["examiner"] = examiner
        config.write_text(yaml.safe_dump(settings))
        process = fit_process(config)
        server.settimeout(300)
        connection, _ = server.accept()  # the fit asks its judge, which never answers
        time.sleep(1.0)
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        elapsed = time.monotonic() - start
        connection.close()
    finally:
        server.close()
    assert process.returncode == 143, err[-3000:]
    assert elapsed < 5.0, f"the fit took {elapsed:.1f} s to end after SIGTERM"
    assert "agentcap: SIGTERM: stopped at tick 0; the newest checkpoint is the last whole tick's" in err
