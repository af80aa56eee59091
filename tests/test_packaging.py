"""A wheel must carry every room, and the built-in tasks register through Gymnasium's plugin group."""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_found_by_the_wheel():
    """pyproject finds packages by pattern; a folder without ``__init__.py`` would be left out of the wheel."""
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = set(find_packages(str(ROOT), include=find["include"]))
    folders = {".".join(p.relative_to(ROOT).parts) for top in ("agentcap", "agentcap_envs")
               for p in [ROOT / top, *(ROOT / top).rglob("*")] if p.is_dir() and any(p.glob("*.py"))
               and "__pycache__" not in p.parts}
    assert folders - found == set(), f"add an __init__.py to: {sorted(folders - found)}"
    assert {"agentcap", "agentcap_envs", "agentcap.core", "agentcap.training"} <= found


def test_the_builtin_tasks_register_through_the_gymnasium_envs_entry_point():
    import gymnasium as gym

    from agentcap.core.registry import load_env_plugins

    (entry,) = [e for e in entry_points(group="gymnasium.envs") if e.name == "agentcap"]
    assert entry.value == "agentcap_envs:register_envs"
    load_env_plugins()
    assert {"agentcap/ADClip-v0", "agentcap/ClozeCaption-v0", "agentcap/EvidenceGame-v0"} <= set(gym.registry)


def test_an_installed_package_registers_its_environments_through_the_entry_point(tmp_path, monkeypatch):
    """A user's package declaring ``gymnasium.envs`` is registered without being imported by hand."""
    import gymnasium as gym

    from agentcap.core.registry import load_env_plugins

    (tmp_path / "plugin_task").mkdir()
    (tmp_path / "plugin_task" / "__init__.py").write_text(
        "from gymnasium.envs.registration import register\n\n"
        "def register_envs():\n"
        "    register(id='plugintask/Echo-v0', entry_point='plugin_task.echo:EchoEnv')\n"
    )
    info = tmp_path / "plugin_task-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-task\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gymnasium.envs]\nplugintask = plugin_task:register_envs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "plugintask/Echo-v0" not in gym.registry
    load_env_plugins()
    try:
        assert gym.registry["plugintask/Echo-v0"].entry_point == "plugin_task.echo:EchoEnv"
    finally:
        del gym.registry["plugintask/Echo-v0"]
