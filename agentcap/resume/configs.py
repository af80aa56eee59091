"""Reading a config file the way every command does: one plain sentence for a file that is not a config.

A 0-byte or non-mapping YAML file otherwise surfaces as ``AttributeError: 'NoneType' object has no
attribute 'get'`` or LightningCLI's blank "Unexpected config"; kept free of torch so that ``plan`` stays light.
"""

from __future__ import annotations

import os
from typing import Any

import yaml


#: the largest config file read (the shipped recipes are a few KB)
MAX_CONFIG_BYTES = 1_000_000
#: the most nodes a config may hold once its aliases (``*name``) are expanded: an anchor bomb of 9 levels
#: × 9 aliases is 81 aliases but 9^9 nodes, and grew memory without bound
MAX_CONFIG_NODES = 100_000


def _expanded(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes ``node`` becomes with every alias expanded (each shared node counted once per use)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = MAX_CONFIG_NODES + 1  # a recursive alias is past any budget
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded(k, sizes) + _expanded(v, sizes) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded(v, sizes) for v in node.value)
    else:
        total = 1
    sizes[id(node)] = min(total, MAX_CONFIG_NODES + 1)
    return sizes[id(node)]


def _load_bounded(stream: Any, path: str, command: str) -> Any:
    """``yaml.safe_load`` that composes the node graph first (aliases share nodes: cheap) and refuses
    one whose expansion passes ``MAX_CONFIG_NODES`` before anything is built from it."""
    loader = yaml.SafeLoader(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded(node, {}) > MAX_CONFIG_NODES:
            raise SystemExit(f"{command}: config {path}: its anchors and aliases expand to more than "
                             f"{MAX_CONFIG_NODES} values; refused (a config holds settings, not generated data)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_config(path: str, command: str) -> dict[str, Any]:
    """The YAML mapping in ``path``; ``SystemExit`` naming the file when it is missing, empty, not
    YAML, or not a mapping of settings."""
    if not os.path.isfile(path):
        raise SystemExit(f"{command}: config {path!r} not found")
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:  # a 50 MB line kept PyYAML's pure-Python reader busy for 600 s
        raise SystemExit(f"{command}: config {path} is {size / 1e6:.1f} MB; a config is at most "
                         f"{MAX_CONFIG_BYTES / 1e6:.0f} MB of settings (data belongs in manifests)")
    with open(path, encoding="utf-8") as handle:
        try:
            document = _load_bounded(handle, path, command)
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
