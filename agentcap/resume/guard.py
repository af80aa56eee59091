"""The config guard of a resumed run: a run_dir continues only with the config that started it.

``agentcap fit`` on a run_dir whose saved ``config.yaml`` differs in a result-deciding key is refused
(``--resume anyway`` continues, ``--resume fresh`` moves the old files aside, deleting nothing).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import time
from typing import Any

import yaml

from agentcap.agents.agent import AgentConfig
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


def move_aside(run_dir: str) -> None:
    """``--resume fresh``: the old run's files go to ``<run_dir>/replaced-<UTC time>/``, nothing is deleted."""
    names = [n for n in ("checkpoints", "summary.json", "samples.jsonl", "tokenizers", "config.yaml",
                         "predictions.jsonl") if os.path.exists(os.path.join(run_dir, n))]
    if not names:
        return
    target = os.path.join(run_dir, time.strftime("replaced-%Y%m%dT%H%M%SZ", time.gmtime()))
    os.makedirs(target, exist_ok=True)
    for name in names:
        os.replace(os.path.join(run_dir, name), os.path.join(target, name))
    print(f"agentcap: --resume fresh: moved the old run's {', '.join(names)} to {target}", file=sys.stderr)


