"""Environment plugins: packages register their environments through the ``gymnasium.envs`` entry point.

Gymnasium 1.x no longer reads that entry-point group itself, so agentcap does, wherever it makes an
environment from an id: the built-in tasks (``agentcap_envs``) and any installed package that
declares ``[project.entry-points."gymnasium.envs"]`` are registered without importing them by hand.
``gymnasium.make("agentcap_envs:agentcap/ADClip-v0")`` works without agentcap's help.
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points
from typing import Any

import gymnasium as gym

from agentcap.core.settings import ConfigError

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


class UnknownEnvError(ConfigError):
    """An environment id that is not registered (or whose ``module:`` part cannot be imported)."""


def check_env_id(env_id: str, key: str = "--model.env.id") -> None:
    """Refuse an id ``gymnasium.make`` would not find, naming the closest registered ids and how a
    package's own environment is named, instead of Gymnasium's traceback."""
    import importlib

    from gymnasium.envs.registration import registry

    load_env_plugins()
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):
                raise  # the module exists but one of its own imports fails: its traceback says why
            raise UnknownEnvError(f"{key}: {env_id!r}: module {module!r} cannot be imported ({err}); "
                                  f"is its package installed or on PYTHONPATH?") from None
    if name in registry:
        return
    by_lower = {i.lower(): i for i in registry}
    close = [by_lower[i] for i in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)]
    hint = f" Closest registered ids: {', '.join(repr(i) for i in close)}." if close else ""
    raise UnknownEnvError(
        f"{key}: unknown environment id {env_id!r}.{hint} An environment of your own package is named with "
        f"the module that registers it first, e.g. 'my_pkg.envs:MyTask-v0', or registered through the "
        f"`gymnasium.envs` entry point (docs/custom-environments.md); `agentcap envs PATTERN` lists the ids."
    )


def check_env_kwargs(env_id: str, kwargs: dict[str, Any], key: str = "--model.env.kwargs") -> None:
    """Refuse keyword arguments the environment's class does not take, in one line naming them and the
    ones it takes, instead of the ``TypeError`` from deep inside ``gymnasium.make`` (e.g. a
    TextRewards config's ``reward_funcs`` given to another environment with ``--model.env.id``)."""
    import inspect

    from gymnasium.envs.registration import load_env_creator, registry

    spec = registry.get(env_id.rpartition(":")[2])
    if spec is None or spec.entry_point is None:
        return
    try:
        creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
        parameters = inspect.signature(creator).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return  # gymnasium.make reports it
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    taken = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set({**spec.kwargs, **kwargs}) - set(taken) - {"render_mode"})
    if unknown:
        entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(creator, "__qualname__", creator)
        raise ConfigError(
            f"{key}: {env_id!r} ({entry}) takes no {', '.join(repr(u) for u in unknown)}; its arguments: "
            f"{', '.join(taken)}. Were they meant for another environment (the config's own env.id)?"
        )


def make_env(env_id: str, kwargs: dict[str, Any], key: str = "--model.env.id") -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)`` after the plugins are registered and the id is checked
    (:func:`check_env_id`, :func:`check_env_kwargs`; ``key`` is the setting the error names)."""
    check_env_id(env_id, key)
    check_env_kwargs(env_id, kwargs)
    return gym.make(env_id, **kwargs)
