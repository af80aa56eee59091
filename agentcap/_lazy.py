"""Re-exports resolved on first use, for the package ``__init__`` files.

Importing ``agentcap.judges.examiner`` runs ``agentcap/judges/__init__.py`` first, so an ``__init__``
that imported its own modules would form an import cycle with any of them that imports a sibling
through the package. A lazy re-export keeps ``from agentcap.judges import build_examiner`` working
without one, and keeps ``import agentcap`` free of torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, handing out each name from its module (name → module)."""

    def __getattr__(name: str) -> object:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
