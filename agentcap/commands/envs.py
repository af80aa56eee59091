"""``agentcap envs [PATTERN …]``: the registered agentcap environments, one line each.

Without a pattern: the built-in ``agentcap/`` ids and those of installed plugins (the
``gymnasium.envs`` entry point). A pattern selects ids by ``fnmatch`` (``agentcap/*-v0``) or by
substring, case-insensitively; ``module:PATTERN`` (or a bare name that is an importable, non-stdlib
module: ``agentcap envs mytask``) imports that module first, so the ids it registers are listed.
Each line's description is read from the environment's source (its class docstring), so listing
imports no environment; one whose source cannot be read is imported for its docstring.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from agentcap.core.registry import load_env_plugins


def envs_command(argv: list[str]) -> int:
    """``agentcap envs``: the matching registered environments, one line each (see module docstring)."""
    parser = argparse.ArgumentParser(prog="agentcap envs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("patterns", nargs="*", help="fnmatch pattern or substring of an id; module:PATTERN "
                        "imports module first")
    patterns = parser.parse_args(argv).patterns
    gymnasium_own = set(gym.registry)  # registered when gymnasium was imported: never listed unasked
    load_env_plugins()
    failed: list[str] = []
    wanted = [_import_for(pattern, failed) for pattern in patterns]
    for line in failed:
        print(f"agentcap envs: {line}", file=sys.stderr)
    wanted = [w for w in wanted if w[0] is not None]
    if wanted or failed:
        chosen = [i for i, spec in gym.registry.items() if any(_matches(i, spec, *w) for w in wanted)]
    else:
        chosen = [i for i in gym.registry if i.startswith("agentcap/") or i not in gymnasium_own]
    if not chosen:
        hint = "" if failed else _not_found_hint(patterns)
        print(f"agentcap envs: no registered id matches {' '.join(patterns)!r}; `agentcap envs` lists "
              f"agentcap's{hint}", file=sys.stderr)
        return 1
    for env_id in sorted(chosen):
        spec = gym.registry[env_id]
        entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
        print(f"{env_id:32s} {entry:48s} {_first_doc_line(spec)}")
    return 0


def _import_for(pattern: str, failed: list[str]) -> tuple[str | None, str | None]:
    """Import the module a pattern names (``module:PATTERN``, or a bare importable package name);
    return the pattern to match ids against and that module (None for a plain pattern). A module
    that exists but fails to import is named in ``failed`` with its error."""
    module, _, rest = pattern.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as err:  # a missing module or one whose import raises: said, not a traceback
            failed.append(f"importing {module!r} failed: {type(err).__name__}: {err}{_path_hint(err)}")
            return None, module  # nothing of it is registered: its pattern lists nothing
        return rest or "*", module
    top = pattern.split(".")[0]
    if pattern.replace(".", "").replace("_", "").isalnum() and top not in sys.stdlib_module_names:
        try:
            found = importlib.util.find_spec(pattern) is not None
        except (ImportError, ValueError):
            found = False  # not a module: only a pattern
        if found:
            try:
                importlib.import_module(pattern)  # it registers its own environments
            except Exception as err:
                failed.append(f"module {pattern!r} failed to import, so its environments are not registered: "
                              f"{type(err).__name__}: {err}")
            return pattern, pattern
    return pattern, None


def _path_hint(err: BaseException) -> str:
    if isinstance(err, ModuleNotFoundError) and os.getcwd() not in sys.path and "" not in sys.path:
        return (f" (the current folder is not on the import path of the `agentcap` script: run it with "
                f"PYTHONPATH=. or install your package, pip install -e .)")
    return ""


def _not_found_hint(patterns: list[str]) -> str:
    """A bare name that is no importable module but a package folder here: the import path is why."""
    here = [p for p in patterns if os.path.isdir(p.split(".")[0]) or os.path.isfile(p.split(".")[0] + ".py")]
    if here and os.getcwd() not in sys.path and "" not in sys.path:
        return (f"; {here[0]!r} is a module in the current folder, which is not on the import path of the "
                f"`agentcap` script: run it with PYTHONPATH=. or install your package (pip install -e .)")
    return ""


def _matches(env_id: str, spec: Any, pattern: str, module: str | None) -> bool:
    """An id matches by substring or fnmatch; a bare module name also matches the ids it implements."""
    entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__module__", "")
    if module is not None and pattern == module and entry.split(":")[0].split(".")[0] == module.split(".")[0]:
        return True
    env_id, pattern = env_id.lower(), pattern.lower()
    return pattern in env_id or fnmatch.fnmatchcase(env_id, pattern)


def _first_doc_line(spec: Any) -> str:
    if isinstance(spec.entry_point, str):
        line = _doc_line_from_source(spec.entry_point)
        if line is not None:  # read, not imported: the built-in environments' modules import torch
            return line
    try:
        creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
        return (creator.__doc__ or "").strip().splitlines()[0]
    except Exception as err:  # an env whose module fails to import is still listed
        return f"(cannot import: {err})"


def _doc_line_from_source(entry_point: str) -> str | None:
    """The first docstring line of ``module:Class`` read from the module's source, without importing
    the module (its parent packages are imported to find it); None when it cannot be read so."""
    import ast

    module, _, name = entry_point.partition(":")
    try:
        found = importlib.util.find_spec(module)
        origin = found.origin if found is not None else None
        if not origin or not origin.endswith(".py"):
            return None
        with open(origin, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (ImportError, ValueError, OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            doc = ast.get_docstring(node)
            return doc.strip().splitlines()[0] if doc and doc.strip() else ""
    return None


def env_page(env_id: str) -> str:
    """``docs/envs/<Name>.md`` of a registered environment, from its class docstring (the single
    source: Description, Action, Observation, Rewards, Episode end, Arguments, Version history);
    ``tools/gen_env_docs.py`` writes them."""
    spec = gym.registry[env_id]
    cls = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    doc = inspect.cleandoc(cls.__doc__ or "")
    title, _, body = doc.partition("\n")
    return f"# {env_id}\n\n*{title.strip()}* — `{spec.entry_point}`\n\n```python\nenv = gymnasium.make(\"{env_id}\", ...)\n```\n{body}\n"
