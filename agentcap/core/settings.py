"""Range checks for numeric settings, run when a config is built (before any weights load).

Each setting gets a rule written the way the error prints it (``≥ 1``, ``> 0``, ``in (0, 1]``); a value
outside it, or a NaN / Inf, is refused with a :class:`ConfigError` that names the config key, the rule
and the value. ``agentcap fit`` prints that error as one line and exits 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: The rules a numeric setting can have: how each reads in an error → the test.
RULES: dict[str, Callable[[float], bool]] = {
    "≥ 0": lambda v: v >= 0,
    "≥ 1": lambda v: v >= 1,
    "> 0": lambda v: v > 0,
    "in (0, 1)": lambda v: 0 < v < 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
}


class ConfigError(ValueError):
    """A setting outside its allowed range (or an inconsistent pair), named by its config key."""


def check(key: str, value: Any, rule: str, hint: str = "") -> None:
    """Refuse ``value`` unless it is a finite number satisfying ``rule``; None (an optional setting
    left unset) always passes. ``hint`` is appended to the message (what to do instead)."""
    if value is None:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not RULES[rule](value):
        raise ConfigError(f"{key} must be {rule}, got {value!r}{hint}")
