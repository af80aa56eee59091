"""The config guard of a resumed run: a run_dir continues only with the config that started it.

``agentcap fit`` on a run_dir whose saved ``config.yaml`` differs in a result-deciding key is refused
(``--resume anyway`` continues, ``--resume fresh`` moves the old files aside, deleting nothing).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import shutil
import sys
import time
from typing import Any

from agentcap.agents.agent import AgentConfig
from agentcap.core.schedule import Stage
from agentcap.resume.configs import read_config
from agentcap.resume.run_dir import RunLock
from agentcap.training.module import GRPOModule


#: What a resumed run must share with its start: everything that decides the results. The strategy,
#: devices and nodes do not (N processes reproduce one), nor do logging and checkpoint settings.
RESUME_KEYS = ("model", "seed_everything", "trainer.precision", "trainer.deterministic")

#: Lightning's spellings of one precision
PRECISIONS = {None: "32-true", 32: "32-true", "32": "32-true", 16: "16-mixed", "16": "16-mixed", "bf16": "bf16-mixed",
              64: "64-true", "64": "64-true", "transformer-engine": "transformer-engine"}
#: the longest value a refusal shows (a changed stage was a dump of both stage lists: 1,470 characters)
SHOWN = 60
#: the most changed keys a refusal names
SHOWN_KEYS = 8
_ABSENT = object()


def _get(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree.get(part, _ABSENT) if isinstance(tree, dict) else _ABSENT
    return tree


def _show(value: Any) -> str:
    text = "None" if value is _ABSENT else repr(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def _differences(old: Any, new: Any, key: str, out: list[tuple[str, Any, Any]]) -> None:
    """``(key, old, new)`` for every leaf that differs; lists compared entry by entry (``stages[3].lr``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for name in sorted(set(old) | set(new), key=str):
            _differences(old.get(name, _ABSENT), new.get(name, _ABSENT), f"{key}.{name}", out)
    elif isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            _differences(old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT, f"{key}[{i}]", out)
    elif old != new:
        out.append((key, old, new))


def changed_keys(saved_path: str, current: dict[str, Any]) -> list[str]:
    """``--key: saved → now`` for every result-deciding key that differs from the run's saved config:
    each changed leaf named (``--model.stages[3].lr: 0.0002 → 0.001``), values cut at ``SHOWN`` characters."""
    if not os.path.isfile(saved_path):
        return []
    saved = read_config(saved_path, "agentcap fit")
    found: list[tuple[str, Any, Any]] = []
    for key in RESUME_KEYS:
        old, new = _get(saved, key), _get(current, key)
        if key == "trainer.precision":
            old, new = (PRECISIONS.get(v, v) if v is not _ABSENT else "32-true" for v in (old, new))
        _differences(old, new, key, found)
    # config.yaml holds every setting, so one it lacks came with a newer agentcap: at its default, no change
    found = [(k, a, b) for k, a, b in found if a is not _ABSENT or not _added_at_default(k, b)]
    shown = [f"--{k}: {_show(a)} → {_show(b)}" for k, a, b in found[:SHOWN_KEYS]]
    return shown + ([f"and {len(found) - SHOWN_KEYS} more"] if len(found) > SHOWN_KEYS else [])


def _added_at_default(key: str, value: Any) -> bool:
    """Whether ``key`` names a typed setting (a module argument, an agent or a stage field) now at its default."""
    parts = key.split(".")
    if len(parts) == 3 and parts[0] == "model" and re.fullmatch(r"stages\[\d+\]", parts[1]):
        field = {f.name: f for f in dataclasses.fields(Stage)}.get(parts[2])
        return field is not None and field.default is not dataclasses.MISSING and field.default == value
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


