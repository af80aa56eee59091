"""Checkpoints by schedule tick: written atomically, rotated, and found again after a kill.

The module steps its own optimisers, so the tick (not Lightning's ``global_step``) decides when to
save; a truncated or corrupt file is reported by path and the previous checkpoint is used. Under
``grpo_fsdp`` a checkpoint is a folder of shards (:mod:`agentcap.resume.sharded`), written, rotated
and checked the same way; a missing or truncated shard counts as corrupt. A checkpoint
the user gives (a path or an http(s) URL) loads tensors only: one that would run code is refused.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import sys
import urllib.parse
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy

from agentcap.core.settings import check
from agentcap.resume import sharded
from agentcap.resume.disk import is_full, no_space, remove_partial


class TickCheckpoint(L.Callback):
    """Saves ``<run_dir>/checkpoints/tick-NNNNNN.ckpt`` every ``every`` ticks and at every stage
    boundary, keeps the newest ``keep``, and points ``last.ckpt`` at the newest.

    The module's manual optimisation never advances Lightning's ``global_step``, so the schedule
    tick decides. Each file (or folder of shards) is written under a temporary name and renamed, so a
    kill at any moment leaves usable ones; ``last.ckpt`` is a hard link to a file, a symlink to a
    folder (a copy where links are not supported).
    """

    def __init__(self, every: int = 10, keep: int = 3):
        self.check(every, keep)
        self.every, self.keep = every, keep

    @staticmethod
    def check(every: Any, keep: Any) -> None:
        """``--checkpoint_every`` ≤ 0 (was taken as 1) and ``--checkpoint_keep 0`` (a traceback) are refused."""
        check("--checkpoint_every", every, "≥ 1", " (ticks between checkpoints)")
        check("--checkpoint_keep", keep, "≥ 1", " (how many newest checkpoints to keep)")

    @staticmethod
    def path(run_dir: str) -> str:
        return os.path.join(run_dir, "checkpoints", "last.ckpt")

    @staticmethod
    def tick_path(run_dir: str, tick: int) -> str:
        return os.path.join(run_dir, "checkpoints", f"tick-{tick:06d}.ckpt")

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        """A run that is not sharded (one process, ``grpo_ddp``) reads a sharded checkpoint folder too,
        consolidated in each process (:class:`FolderReader`); ``grpo_fsdp`` reads its own shards."""
        strategy = trainer.strategy
        if not isinstance(strategy, ModelParallelStrategy) and type(strategy.checkpoint_io) is TorchCheckpointIO:
            strategy.checkpoint_io = FolderReader()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int):
        tick = pl_module.tick
        index, step = pl_module.schedule.locate(tick - 1)
        stage_done = step == pl_module.schedule.stages[index].ticks() - 1
        if tick % self.every == 0 or stage_done:
            self.save(trainer, pl_module)

    def save(self, trainer: L.Trainer, pl_module: Any) -> None:
        path = self.tick_path(pl_module.run_dir, pl_module.tick)
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        try:
            trainer.save_checkpoint(tmp, weights_only=False)  # full state: optimiser, loops, tick
        except Exception as err:  # a full disk: no partial .tmp left behind, the file named in one line
            if trainer.is_global_zero:
                remove_partial(tmp)
            if is_full(err):
                raise no_space(err, path, "saving the checkpoint") from err
            raise
        if trainer.is_global_zero:
            _replace(tmp, path)
            _point_last(path, self.path(pl_module.run_dir))
            for old in checkpoints(pl_module.run_dir)[self.keep :]:
                _remove(old)
        trainer.strategy.barrier("agentcap-checkpoint")


class FolderReader(TorchCheckpointIO):
    """Lightning's checkpoint IO, which also reads a sharded checkpoint folder (:func:`read_checkpoint`)."""

    def load_checkpoint(self, path, *args, **kwargs) -> dict[str, Any]:
        if os.path.isdir(path):
            return read_checkpoint(str(path))
        return super().load_checkpoint(path, *args, **kwargs)


def _replace(tmp: str, path: str) -> None:
    """``os.replace`` for files, folders and links. A folder cannot replace anything but an empty
    folder, nor be replaced by a file: the old one is renamed aside first (a tick saved again, e.g.
    after resuming before a corrupt one) and removed after."""
    folders = any(os.path.isdir(p) and not os.path.islink(p) for p in (tmp, path))
    if folders and os.path.lexists(path):
        _remove(path + ".old")
        os.replace(path, path + ".old")
        os.replace(tmp, path)
        _remove(path + ".old")
    else:
        os.replace(tmp, path)


def _point_last(path: str, last: str) -> None:
    """``last.ckpt`` → ``path``: a hard link to a file, a relative symlink to a folder (a copy where
    neither is supported), swapped in by one rename."""
    _remove(last + ".tmp")
    try:
        if os.path.isdir(path):
            os.symlink(os.path.basename(path), last + ".tmp", target_is_directory=True)
        else:
            os.link(path, last + ".tmp")
    except OSError:
        (shutil.copytree if os.path.isdir(path) else shutil.copyfile)(path, last + ".tmp")
    _replace(last + ".tmp", last)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def checkpoints(run_dir: str) -> list[str]:
    """The run's tick checkpoints (files or folders), newest first."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    names = sorted((n for n in os.listdir(folder) if re.fullmatch(r"tick-\d+\.ckpt", n)), reverse=True)
    return [os.path.join(folder, n) for n in names]


def latest_checkpoint(run_dir: str, report=None) -> str | None:
    """The newest checkpoint of ``run_dir`` that loads; an unreadable one is reported by path and skipped.

    ``last.ckpt`` first (it may also be a file the user put there), then the tick checkpoints.
    """
    report = report or (lambda message: print(message, file=sys.stderr))
    candidates = [TickCheckpoint.path(run_dir)] + checkpoints(run_dir)
    bad: list[str] = []
    for path in candidates:
        if not os.path.exists(path):
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            if bad:
                report(f"agentcap: using the previous checkpoint {path}")
            return path
        bad.append(path)
        report(f"agentcap: checkpoint {path} is unreadable ({problem}); skipping it")
    return None


def checkpoint_problem(path: str) -> str | None:
    """Why ``path`` is not a loadable checkpoint, or None. Memory-mapped: tensors are not read.
    A folder is a sharded checkpoint (:func:`agentcap.resume.sharded.problem`)."""
    if os.path.isdir(path):
        return sharded.problem(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:  # torch's explanation is a paragraph; the refused global is the news
        called = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f"it calls {called.group(1)}" if called else str(err).splitlines()[0][:200]
        return f"refused: loading it would run code ({what}); a checkpoint holds tensors and plain containers only"
    except Exception as err:  # truncated zip, garbage bytes
        return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not isinstance(state, dict) or "state_dict" not in state:
        return "not a Lightning checkpoint (no 'state_dict')"
    return None


def read_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint's whole state in this process, full tensors on the CPU: a file as ``torch.load``
    reads it (tensors only), a sharded folder consolidated (no process group needed)."""
    if os.path.isdir(path):
        return sharded.read_full(path)
    return torch.load(path, map_location="cpu", weights_only=True)


#: Lightning's own names for a checkpoint (``--ckpt_path last``), resolved by the Trainer.
LIGHTNING_NAMES = ("last", "best", "hpc")


def usable_checkpoint(path: str, run_dir: str, flag: str, command: str, lightning: bool = False) -> str:
    """The local file to load for a user-given checkpoint, or ``SystemExit`` in one line naming it.

    An http(s) URL is downloaded into ``<run_dir>/downloads/`` first; every file is then checked with
    ``torch.load(weights_only=True)``, so a pickle that would run code is refused before anything loads
    it (Lightning itself loads remote checkpoints with ``weights_only=False``). ``lightning``: the path
    goes to the Trainer, so its own names (``last``) and other fsspec URLs (``s3://``) pass, to be
    loaded with ``weights_only=True`` as the callers tell it; elsewhere they are refused."""
    scheme = urllib.parse.urlsplit(path).scheme
    remote = scheme not in ("", "file", "http", "https")
    if lightning and (path in LIGHTNING_NAMES or path.startswith("registry") or remote):
        return path
    if scheme in ("http", "https"):
        path = download(path, os.path.join(run_dir, "downloads"), flag, command)
    elif "://" in path and scheme != "file":
        raise SystemExit(f"{command}: {flag} {path}: only local files and http(s) URLs can be loaded here")
    elif scheme == "file":
        path = urllib.parse.urlsplit(path).path
    if not os.path.exists(path):
        raise SystemExit(f"{command}: {flag} {path}: no such file or folder")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise SystemExit(f"{command}: {flag} {path}: {problem}")
    return path


def download(url: str, folder: str, flag: str, command: str) -> str:
    """``url`` saved as ``folder/<its file name>`` (written under a temporary name, then renamed)."""
    name = os.path.basename(urllib.parse.urlsplit(url).path) or "checkpoint.ckpt"
    target = os.path.join(folder, name)
    try:
        os.makedirs(folder, exist_ok=True)
        torch.hub.download_url_to_file(url, target, progress=False)
    except (OSError, ValueError) as err:  # URLError and HTTPError are OSErrors
        raise SystemExit(f"{command}: {flag} {url}: download failed ({err})") from None
    print(f"agentcap: {flag} {url} downloaded to {target}", file=sys.stderr)
    return target


