"""``agentcap envs [PATTERN …]``: the registered agentcap environments, one line each.

Without a pattern: the built-in ``agentcap/`` ids and those of installed plugins (the
``gymnasium.envs`` entry point). A pattern selects ids by ``fnmatch`` (``agentcap/*-v0``) or by
substring, case-insensitively; ``module:PATTERN`` (or a bare name that is an importable, non-stdlib
module: ``agentcap envs mytask``) imports that module first, so the ids it registers are listed.
Only the listed environments are imported (for their docstrings), never Gymnasium's own.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import importlib.util
import inspect
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
    wanted = [_import_for(pattern) for pattern in patterns]
    if wanted:
        chosen = [i for i, spec in gym.registry.items() if any(_matches(i, spec, *w) for w in wanted)]
    else:
        chosen = [i for i in gym.registry if i.startswith("agentcap/") or i not in gymnasium_own]
    if not chosen:
        print(f"agentcap envs: no registered id matches {' '.join(patterns)!r}; `agentcap envs` lists "
              f"agentcap's", file=sys.stderr)
        return 1
    for env_id in sorted(chosen):
        spec = gym.registry[env_id]
        entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
        print(f"{env_id:32s} {entry:48s} {_first_doc_line(spec)}")
    return 0


def _import_for(pattern: str) -> tuple[str, str | None]:
    """Import the module a pattern names (``module:PATTERN``, or a bare importable package name);
    return the pattern to match ids against and that module (None for a plain pattern)."""
    module, _, rest = pattern.rpartition(":")
    if module:
        importlib.import_module(module)
        return rest or "*", module
    top = pattern.split(".")[0]
    if pattern.replace(".", "").replace("_", "").isalnum() and top not in sys.stdlib_module_names:
        try:
            if importlib.util.find_spec(pattern) is not None:
                importlib.import_module(pattern)  # it registers its own environments
                return pattern, pattern
        except (ImportError, ValueError):
            pass  # not a module: only a pattern
    return pattern, None


def _matches(env_id: str, spec: Any, pattern: str, module: str | None) -> bool:
    """An id matches by substring or fnmatch; a bare module name also matches the ids it implements."""
    entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__module__", "")
    if module is not None and pattern == module and entry.split(":")[0].split(".")[0] == module.split(".")[0]:
        return True
    env_id, pattern = env_id.lower(), pattern.lower()
    return pattern in env_id or fnmatch.fnmatchcase(env_id, pattern)


def _first_doc_line(spec: Any) -> str:
    try:
        creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
        return (creator.__doc__ or "").strip().splitlines()[0]
    except Exception as err:  # an env whose module fails to import is still listed
        return f"(cannot import: {err})"


def env_page(env_id: str) -> str:
    """``docs/envs/<Name>.md`` of a registered environment, from its class docstring (the single
    source: Description, Action, Observation, Rewards, Episode end, Arguments, Version history);
    ``tools/gen_env_docs.py`` writes them."""
    spec = gym.registry[env_id]
    cls = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    doc = inspect.cleandoc(cls.__doc__ or "")
    title, _, body = doc.partition("\n")
    return f"# {env_id}\n\n*{title.strip()}* — `{spec.entry_point}`\n\n```python\nenv = gymnasium.make(\"{env_id}\", ...)\n```\n{body}\n"
