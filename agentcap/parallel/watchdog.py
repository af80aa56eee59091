"""Ranks that stop answering: a collective timeout of agentcap's own, and a watchdog that names the silent rank.

A frozen rank (SIGSTOP, a hung driver) used to leave the others waiting silently until Lightning's
30-minute default; a dead one (kill -9, a lost node) gave a gloo traceback naming no rank. Here:

* the process groups of ``grpo_ddp`` / ``grpo_fsdp`` time out after :func:`collective_timeout`
  seconds (``COLLECTIVE_TIMEOUT`` = 600 by default; ``agentcap fit --collective_timeout S``, or the
  ``AGENTCAP_COLLECTIVE_TIMEOUT`` environment variable, or the strategy's ``timeout`` argument);
* every rank writes a heartbeat each second, ``<run_dir>/heartbeats/rank-<r>.json`` (its pid, host,
  tick, stage, and the collective its main thread waits in, read from the thread's stack); a rank
  that has waited in a collective for :func:`watchdog_after` seconds (``WATCHDOG_AFTER`` = 60, or
  ``AGENTCAP_WATCHDOG_AFTER``) prints one line naming the ranks that have not arrived, where they
  were last heard from, and whether their process is stopped, gone or silent;
* when a collective fails (a peer died, or the timeout passed), the lowest surviving rank prints one
  line naming the rank and the checkpoint kept (:func:`failure`), instead of gloo's traceback.

Heartbeats need a run_dir every rank sees (one machine, or a shared file system); a rank of
another node without it is reported as "no heartbeat".
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import lightning as L

#: seconds a collective may wait before the process group gives up (Lightning's default: 1800)
COLLECTIVE_TIMEOUT = 600.0
#: seconds a rank waits in a collective before it names the ranks that have not arrived
WATCHDOG_AFTER = 60.0
TIMEOUT_ENV, AFTER_ENV = "AGENTCAP_COLLECTIVE_TIMEOUT", "AGENTCAP_WATCHDOG_AFTER"


def _seconds(env: str, default: float) -> float:
    value = os.environ.get(env)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{env}={value!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{env} must be > 0 seconds, got {value}")
    return seconds


def collective_timeout() -> datetime.timedelta:
    """The collective timeout agentcap's strategies give their process group."""
    return datetime.timedelta(seconds=_seconds(TIMEOUT_ENV, COLLECTIVE_TIMEOUT))


def watchdog_after() -> float:
    return _seconds(AFTER_ENV, WATCHDOG_AFTER)


def waiting_in(thread_id: int | None = None) -> str | None:
    """The collective (``all_reduce``, ``barrier`` …) a thread (the main one by default) waits in, or None."""
    frame = sys._current_frames().get(thread_id if thread_id is not None else threading.main_thread().ident)
    name = None
    while frame is not None:  # innermost first: the outermost c10d frame is the call agentcap or Lightning made
        if frame.f_code.co_filename.endswith("distributed_c10d.py") and not frame.f_code.co_name.startswith("_"):
            name = frame.f_code.co_name
        frame = frame.f_back
    return name


def process_state(pid: int, host: str) -> str | None:
    """'gone', 'stopped' (SIGSTOP, a debugger) or None (running, or on another host: unknown)."""
    if host != socket.gethostname():
        return None
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except OSError:
            pass
        return None
    return "gone" if state in ("Z", "X", "x") else "stopped" if state in ("T", "t") else None


def _where(beat: dict) -> str:
    tick, stage = beat.get("tick"), beat.get("stage")
    return f"tick {tick}" + (f" of stage '{stage}'" if stage else "") if tick is not None else "start-up"


class Heartbeat:
    """One rank's heartbeat file and watchdog thread (a daemon: it never keeps a process alive).

    ``where()`` gives (tick, stage) for the heartbeat; ``token`` is the same on every rank of one run
    (rank 0's, broadcast), so a file a previous run left is not read as a live rank's."""

    def __init__(self, folder: str, rank: int, world_size: int, token: str,
                 where: Callable[[], tuple[Any, Any]] = lambda: (None, None), after: float | None = None,
                 every: float = 1.0, out: Any = None):
        self.folder, self.rank, self.world_size, self.token = folder, rank, world_size, token
        self.where, self.after, self.every = where, watchdog_after() if after is None else after, every
        self.out = out
        self.pid, self.host = os.getpid(), socket.gethostname()
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiting: str | None = None
        self._since = 0.0
        self._reported = False
        self.started = time.time()
        os.makedirs(folder, exist_ok=True)

    def path(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank-{rank}.json")

    def start(self) -> Heartbeat:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="agentcap-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def beat(self) -> None:
        waiting = waiting_in(self._main)
        now = time.time()
        if waiting != self._waiting:
            self._waiting, self._since, self._reported = waiting, now, False
        tick, stage = self.where()
        body = {"token": self.token, "rank": self.rank, "pid": self.pid, "host": self.host, "time": now,
                "tick": tick, "stage": stage, "waiting": waiting, "since": self._since if waiting else None}
        tmp = self.path(self.rank) + f".{self.pid}.{threading.get_ident()}.tmp"  # the thread, or a tick's start
        try:
            with open(tmp, "w") as handle:
                json.dump(body, handle)
            os.replace(tmp, self.path(self.rank))
        except OSError:
            pass  # a full disk or a removed run_dir must not stop training; the peers see a silent rank
        if waiting and not self._reported and now - self._since >= self.after:
            self._reported = True
            line = self.report()
            if line:
                print(line, file=self.out or sys.stderr, flush=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.beat()

    def peers(self) -> dict[int, dict | None]:
        """Every other rank's heartbeat of this run (None: none yet, or unreadable)."""
        found: dict[int, dict | None] = {}
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            try:
                with open(self.path(rank)) as handle:
                    beat = json.load(handle)
            except (OSError, ValueError):
                beat = None
            found[rank] = beat if isinstance(beat, dict) and beat.get("token") == self.token else None
        return found

    def _describe(self, rank: int, beat: dict | None, now: float) -> tuple[str, str]:
        """(kind, words) for a rank: kind is 'gone', 'stopped', 'silent', 'busy', 'waiting' or 'unknown'."""
        if beat is None:
            return "unknown", f"rank {rank} (no heartbeat in {self.folder}: another node without this run_dir?)"
        who = f"rank {rank} (pid {beat['pid']}" + (f" on {beat['host']}" if beat["host"] != self.host else "") + ")"
        age = now - float(beat["time"])
        state = process_state(int(beat["pid"]), beat["host"])
        last = f"last heard {age:.0f} s ago at {_where(beat)}"
        if state == "gone":
            return "gone", f"{who} died ({last})"
        if state == "stopped":
            return "stopped", f"{who} is stopped (SIGSTOP or a debugger; {last})"
        if age > max(5 * self.every, 5.0):
            return "silent", f"{who} is silent ({last})"
        if beat.get("waiting"):
            return "waiting", f"{who} waits in {beat['waiting']} at {_where(beat)}"
        return "busy", f"{who} is busy at {_where(beat)}, not in a collective"

    def report(self) -> str | None:
        """The watchdog's line: which ranks have not arrived at the collective this rank waits in.
        Only the lowest waiting rank of those heard from says it (None on the others, or when all arrived)."""
        now = time.time()
        peers = self.peers()
        described = {rank: self._describe(rank, beat, now) for rank, beat in peers.items()}
        if any(kind == "waiting" and rank < self.rank for rank, (kind, _) in described.items()):
            return None
        missing = [words for kind, words in described.values() if kind != "waiting"]
        if not missing:
            return None
        tick, stage = self.where()
        here = _where({"tick": tick, "stage": stage})
        return (f"agentcap: rank {self.rank} has waited {now - self._since:.0f} s in {self._waiting} at {here}; "
                f"not arrived: {'; '.join(missing)}; the collective times out after "
                f"{collective_timeout().total_seconds():.0f} s ({TIMEOUT_ENV} / --collective_timeout)")

    def failure(self, error: BaseException, checkpoint: str | None) -> tuple[bool, str | None]:
        """(diagnosed, line) for a failed collective: the line names which rank died or never arrived,
        and the checkpoint kept.

        (True, None) on a rank that is not the lowest one alive (it exits without a word); (False, None)
        when no peer looks dead, stopped or silent and the error is not a timeout (not a peer's fault)."""
        timed_out = "timed out" in str(error).lower() or "timeout" in type(error).__name__.lower()
        # a dying peer's sockets close before the kernel marks it a zombie: on a busy machine the
        # collective can fail inside that window, so look again for a moment before blaming no one
        deadline = time.monotonic() + (0 if timed_out else 2.0)
        while True:
            now = time.time()
            described = {rank: self._describe(rank, beat, now) for rank, beat in self.peers().items()}
            culprits = [words for kind, words in described.values() if kind in ("gone", "stopped", "silent")]
            if culprits or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not culprits and not timed_out:
            return False, None
        if any(r < self.rank and kind in ("waiting", "busy") for r, (kind, _) in described.items()):
            return True, None
        if not culprits:
            culprits = [words for kind, words in described.values() if kind != "waiting"] or ["a peer"]
        tick, stage = self.where()
        how = (f"did not arrive within the {collective_timeout().total_seconds():.0f} s collective timeout"
               if timed_out else "broke the collective")
        kept = (f"the newest checkpoint {checkpoint} is kept; rerun the same command to resume from it"
                if checkpoint else "no checkpoint was written yet")
        return True, (f"agentcap: {'; '.join(culprits)}: {how} at {_where({'tick': tick, 'stage': stage})}; "
                f"rank {self.rank} stopped; {kept}")


def is_collective_error(error: BaseException) -> bool:
    """A failure of torch.distributed's transport (gloo / NCCL): a closed peer, a timeout."""
    import torch.distributed as dist

    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        s in text for s in ("gloo", "Connection closed by peer", "Connection reset by peer", "Timed out", "NCCL"))


_failure: str | None = None  # the line the CLI prints for a collective that failed (this process)
_failed = False


def set_failure(line: str | None) -> None:
    global _failure, _failed
    _failure, _failed = line, True


def failure() -> tuple[bool, str | None]:
    """(whether a collective failed and was diagnosed here, the line :class:`RankWatchdog` printed or None)."""
    return _failed, _failure


def reset() -> None:
    global _failure, _failed
    _failure, _failed = None, False


class RankWatchdog(L.Callback):
    """Starts each rank's :class:`Heartbeat` for a run of several processes; names a dead or silent peer."""

    def __init__(self, after: float | None = None, every: float = 1.0):
        self.after, self.every = after, every
        self.heartbeat: Heartbeat | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.world_size < 2 or self.heartbeat is not None:
            return
        token = trainer.strategy.broadcast(f"{time.time():.6f}-{os.getpid()}")
        run_dir = getattr(pl_module, "run_dir", None) or trainer.default_root_dir

        def where() -> tuple[Any, Any]:
            tick, schedule = getattr(pl_module, "tick", None), getattr(pl_module, "schedule", None)
            try:
                name = schedule.stages[schedule.locate(tick)[0]].name
            except Exception:  # noqa: BLE001  (past the last tick, or no schedule: the tick alone)
                name = None
            return tick, name

        self.heartbeat = Heartbeat(os.path.join(run_dir, "heartbeats"), trainer.global_rank, trainer.world_size,
                                   str(token), where, after=self.after, every=self.every).start()

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if self.heartbeat is not None:  # the tick as it starts, not up to a second late
            self.heartbeat.beat()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.heartbeat is None or not is_collective_error(exception):
            return
        from agentcap.resume.checkpoints import latest_checkpoint

        run_dir = getattr(pl_module, "run_dir", None) or trainer.default_root_dir
        try:
            checkpoint = latest_checkpoint(run_dir)
        except Exception:  # noqa: BLE001  (the line must come out whatever the folder holds)
            checkpoint = None
        diagnosed, line = self.heartbeat.failure(exception, checkpoint)
        if line:  # at once: Lightning's launcher may SIGKILL this process soon after a child died
            print(line, file=sys.stderr, flush=True)
        if diagnosed:
            set_failure(line)
