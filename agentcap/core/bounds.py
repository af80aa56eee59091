"""Sizes checked against the machine before anything is allocated.

A batch setting of 1e9 passes every range rule (``≥ 1``) and then allocates until the machine runs
out: one environment, one observation and one record of tokens per trajectory, held together for a
rollout batch (``RolloutDriver.run``) or an SFT step's items. The arithmetic here is a lower bound
of that host memory (``TRAJECTORY_BYTES`` per trajectory, measured at 13 KB for the toy ADClip env,
plus the tokens' ids and log-probs), compared with what the machine (or its cgroup) has: a size
whose floor alone does not fit is refused in one line, before any model or environment is built.
``agentcap plan`` sizes the device side; this is the part that needs no config.json.
"""

from __future__ import annotations

import os

from agentcap.core.settings import ConfigError

GIB = 1024**3
#: the least one trajectory holds on the host: its environment, its observation, the episode record
TRAJECTORY_BYTES = 4096
#: per generated token: its id, its log-prob and old log-prob, the mask (8 bytes each at least)
TOKEN_BYTES = 32


def host_memory_bytes() -> int:
    """The memory this process may use: the cgroup's limit when one is set, else the machine's."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(physical, int(text))
    return physical


def batch_floor(trajectories: int, max_new_tokens: int, turns: int = 1) -> int:
    """The least host memory ``trajectories`` episodes of ``turns`` actions of ``max_new_tokens`` take."""
    return trajectories * (TRAJECTORY_BYTES + turns * max_new_tokens * TOKEN_BYTES)


def check_batch(sizes: dict[str, int], trajectories: int, max_new_tokens: int, limit: int | None = None,
                unit: str = "trajectories") -> None:
    """Refuse a batch whose floor exceeds the host memory, naming the settings that make it.

    ``sizes``: the config keys and values whose product is ``trajectories`` (shown in the message)."""
    limit = host_memory_bytes() if limit is None else limit
    need = batch_floor(trajectories, max_new_tokens)
    if need > limit:
        named = " and ".join(f"{key} {value}" for key, value in sizes.items())
        raise ConfigError(
            f"{named}: {trajectories} {unit} per step need at least {need / GIB:.1f} GiB of host memory "
            f"({TRAJECTORY_BYTES + max_new_tokens * TOKEN_BYTES} bytes each), more than the "
            f"{limit / GIB:.1f} GiB here; lower them")
