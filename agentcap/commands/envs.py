"""``agentcap envs``: the registered agentcap environments, one line each."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from agentcap.core.registry import load_env_plugins


def envs_command(argv: list[str]) -> int:
    """``agentcap envs``: every registered agentcap environment, one line each."""
    parser = argparse.ArgumentParser(prog="agentcap envs", description="List the registered agentcap environments.")
    parser.add_argument("modules", nargs="*", help="modules to import first (they register their own envs, also listed)")
    modules = parser.parse_args(argv).modules
    load_env_plugins()
    for module in modules:
        __import__(module)
    for env_id, spec in sorted(gym.registry.items()):
        entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
        if env_id.startswith("agentcap/") or modules:
            summary = _first_doc_line(spec)
            print(f"{env_id:32s} {entry:48s} {summary}")
    return 0


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
