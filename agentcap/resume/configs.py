"""Reading a config file the way every command does: one plain sentence for a file that is not a config.

A 0-byte or non-mapping YAML file otherwise surfaces as ``AttributeError: 'NoneType' object has no
attribute 'get'`` or LightningCLI's blank "Unexpected config"; kept free of torch so that ``plan`` stays light.
"""

from __future__ import annotations

import os
from typing import Any

import yaml


def read_config(path: str, command: str) -> dict[str, Any]:
    """The YAML mapping in ``path``; ``SystemExit`` naming the file when it is missing, empty, not
    YAML, or not a mapping of settings."""
    if not os.path.isfile(path):
        raise SystemExit(f"{command}: config {path!r} not found")
    with open(path, encoding="utf-8") as handle:
        try:
            document = yaml.safe_load(handle)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else path
            raise SystemExit(f"{command}: {where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if document is None:
        raise SystemExit(f"{command}: config {path} is empty; give a YAML file of settings (trainer:, model:, …), "
                         "e.g. the one `agentcap fit` ran with")
    if not isinstance(document, dict):
        raise SystemExit(f"{command}: config {path} holds a {type(document).__name__}, not a mapping of settings "
                         "(trainer:, model:, …)")
    return document


def config_paths(argv: list[str]) -> list[str]:
    """The files given as ``--config PATH`` / ``--config=PATH`` (a YAML string in their place is not a file)."""
    paths = []
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--config=") else (
            argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None)
        if value is not None and os.path.isfile(value):
            paths.append(value)
    return paths
