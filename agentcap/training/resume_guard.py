"""The config guard of a resumed run: a run_dir continues only with the config that started it.

``agentcap fit`` on a run_dir whose saved ``config.yaml`` differs in a result-deciding key is refused
(``--resume anyway`` continues, ``--resume fresh`` moves the old files aside, deleting nothing).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import shutil
import sys
import time
from typing import Any

import yaml

from agentcap.agents.agent import AgentConfig
from agentcap.resume.run_dir import RunLock
from agentcap.training.module import GRPOModule


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


#: What a resumed run must share with its start: everything that decides the results.
RESUME_KEYS = ("model", "seed_everything")


def changed_keys(saved_path: str, current: dict[str, Any]) -> list[str]:
    """``--key: saved → now`` for every result-deciding key that differs from the run's saved config."""
    if not os.path.isfile(saved_path):
        return []
    with open(saved_path, encoding="utf-8") as handle:
        saved = yaml.safe_load(handle) or {}
    old = _flatten({k: saved.get(k) for k in RESUME_KEYS})
    new = _flatten({k: current.get(k) for k in RESUME_KEYS})
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    # config.yaml holds every setting, so one it lacks came with a newer agentcap: at its default, no change
    keys = [k for k in keys if k in old or not _added_at_default(k, new.get(k))]
    return [f"--{k}: {old.get(k)!r} → {new.get(k)!r}" for k in keys]


def _added_at_default(key: str, value: Any) -> bool:
    """Whether ``key`` names a typed setting (a module argument or an agent field) now at its default."""
    parts = key.split(".")
    if len(parts) == 4 and parts[:2] == ["model", "agents"]:
        field = {f.name: f for f in dataclasses.fields(AgentConfig)}.get(parts[3])
        return field is not None and field.default is not dataclasses.MISSING and field.default == value
    if len(parts) == 2 and parts[0] == "model":
        param = inspect.signature(GRPOModule.__init__).parameters.get(parts[1])
        return param is not None and param.default is not inspect.Parameter.empty and param.default == value
    return False


#: What ``--resume fresh`` leaves in place: the lock of the process now training, and the old runs moved before.
KEPT = (RunLock.NAME,)
REPLACED = "replaced-"


def move_aside(run_dir: str) -> None:
    """``--resume fresh``: every file of the old run (``eval/``, logger folders, …: whatever is there)
    goes to ``<run_dir>/replaced-<UTC time>/``, nothing is deleted. The vocabulary is copied back: the
    new run's module was built from it before this runs, and a run keeps the vocabulary it trains with."""
    if not os.path.isdir(run_dir):
        return
    names = sorted(n for n in os.listdir(run_dir) if n not in KEPT and not n.startswith(REPLACED))
    if not names:
        return
    target = os.path.join(run_dir, time.strftime(f"{REPLACED}%Y%m%dT%H%M%SZ", time.gmtime()))
    os.makedirs(target, exist_ok=True)
    for name in names:
        os.replace(os.path.join(run_dir, name), os.path.join(target, name))
    if os.path.isdir(os.path.join(target, "tokenizers")):
        shutil.copytree(os.path.join(target, "tokenizers"), os.path.join(run_dir, "tokenizers"))
    print(f"agentcap: --resume fresh: moved the old run's {', '.join(names)} to {target}", file=sys.stderr)


