"""A wheel must carry every room: pyproject lists packages explicitly (``envs/`` installs as ``agentcap_envs``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "agentcap").rglob("__init__.py")}
    assert found - listed == set(), f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    assert "agentcap_envs" in listed
