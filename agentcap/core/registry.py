"""Environment plugins: packages register their environments through the ``gymnasium.envs`` entry point.

Gymnasium 1.x no longer reads that entry-point group itself, so agentcap does, wherever it makes an
environment from an id: the built-in tasks (``agentcap_envs``) and any installed package that
declares ``[project.entry-points."gymnasium.envs"]`` are registered without importing them by hand.
``gymnasium.make("agentcap_envs:agentcap/ADClip-v0")`` works without agentcap's help.
"""

from __future__ import annotations

from importlib.metadata import entry_points

_loaded: set[str] = set()


def load_env_plugins() -> None:
    """Call every ``gymnasium.envs`` entry point once per process (each registers its environments)."""
    for entry in entry_points(group="gymnasium.envs"):
        if entry.value in _loaded:
            continue
        _loaded.add(entry.value)
        register = entry.load()
        if callable(register):
            register()
