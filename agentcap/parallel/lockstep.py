"""Lock-step passes: processes that share a sharded model must run its forwards together.

Every forward of an FSDP2-sharded model is a chain of all-gathers, so a process with less work
(fewer episodes, fewer judge queries) runs stand-in passes while another still has real ones.
:class:`Lockstep` matches the rollout driver's generate calls per agent and turn; a sharded judge
announces each pass (:func:`announce_pass`) and idle processes follow (:func:`stand_in_passes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentcap.parallel.distributed import collective_device, most, world
from agentcap.parallel.sharding import is_sharded

#: What a sharded judge's process is about to run: nothing more, a forward, a ``generate`` call.
DONE, FORWARD, GENERATE = 0, 1, 2


def announce_pass(kind: int) -> None:
    """Before each real pass of a sharded judge: tell every process which kind of pass follows.

    Each pass is a chain of all-gathers, so the processes must run passes in step; the ones with
    nothing left run stand-ins meanwhile (:func:`stand_in_passes`). One small all-reduce per pass."""
    if most(kind) != kind:
        raise RuntimeError("processes disagree on a sharded judge's next pass (a forward against a generate call)")


def stand_in_passes(forward, generate) -> None:
    """After a process's own passes of a judge call: run stand-ins while any other still has passes."""
    while (kind := most(DONE)) != DONE:
        (forward if kind == FORWARD else generate)()


class Lockstep:
    """Keeps the processes' calls to sharded agents matched during a rollout (see module docstring).

    Inactive (every method a no-op) with one process or when no agent is sharded.
    """

    def __init__(self, agents: Mapping[str, nn.Module]):
        self.active = world()[1] > 1 and any(is_sharded(a.model) for a in agents.values())
        self.stand_ins: dict[str, dict[str, Any]] = {}

    def anyone_running(self, running: bool) -> bool:
        """True while any process still has an episode running."""
        if not self.active:
            return running
        flag = torch.tensor([int(running)], device=collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def turn(
        self, waiting: Mapping[str, list[int]], observations: Sequence[dict[str, Any]], batch_size: int
    ) -> list[tuple[str, list[int], int, dict[str, Any] | None]]:
        """(agent, trajectories, extra stand-in calls, stand-in) for this turn, in one order on every process."""
        if not self.active:
            return [(name, list(ts), 0, None) for name, ts in waiting.items()]
        for name, ts in waiting.items():
            self.stand_ins.setdefault(name, observations[ts[0]])
        calls = {name: -(-len(ts) // batch_size) for name, ts in waiting.items()}
        everyone: list[Any] = [None] * world()[1]
        dist.all_gather_object(everyone, (calls, sorted(self.stand_ins)))
        most: dict[str, int] = {}
        for part, _ in everyone:
            for name, count in part.items():
                most[name] = max(most.get(name, 0), count)
        lacking = {name for _, seen in everyone for name in most if name not in seen}
        if lacking:  # a second round, on every process, only when one has never seen an agent it must call
            offers: list[Any] = [None] * world()[1]
            dist.all_gather_object(offers, {n: self.stand_ins[n] for n in sorted(lacking) if n in self.stand_ins})
            for part in offers:
                for name, obs in part.items():
                    self.stand_ins.setdefault(name, obs)
        return [
            (name, list(waiting.get(name, [])), most[name] - calls.get(name, 0), self.stand_ins[name])
            for name in sorted(most)
        ]


