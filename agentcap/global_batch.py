"""How a global batch splits over processes, so that N processes reproduce one.

Batch sizes in configs are global. Every process takes a strided share of each global list of items
and keeps each item's global position: sampling seeds follow that position
(:func:`agentcap.agents.sampling.trajectory_seed`), and the optimiser minibatches are drawn over
the global set of spans, each process stepping on its part of the same global minibatch. Gradients
are then sums over processes of globally normalised losses, as one process would compute them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np
import torch.distributed as dist

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device():
    """Where a small tensor for a collective must live (NCCL only reduces CUDA tensors)."""
    import torch

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def share(chosen: Sequence[T], what: str = "items") -> tuple[list[T], list[int]]:
    """This process's strided share of a global list, and the global positions of its elements."""
    rank, size = world()
    if len(chosen) < size:
        raise ValueError(
            f"a global batch of {len(chosen)} {what} cannot be split over {size} processes; "
            f"make the batch size at least the number of processes"
        )
    positions = list(range(rank, len(chosen), size))
    return [chosen[p] for p in positions], positions


def global_minibatches(keys: Sequence[Hashable], size: int, seed: Sequence[int]) -> list[list[int]]:
    """Local indices of ``keys`` in each global minibatch of ``size`` spans.

    ``keys`` name this process's spans globally (e.g. (trajectory id, action index)). The union of
    every process's keys is sorted, permuted with ``seed`` and cut into chunks of ``size``; each
    process gets, per chunk, the indices of its own spans in it (possibly none). So every process
    takes the same number of optimiser steps, and step k sees the same global minibatch whatever the
    number of processes.
    """
    rank, world_size = world()
    everyone: list[list[Hashable]] = [list(keys)]
    if world_size > 1:
        everyone = [None] * world_size  # type: ignore[list-item]
        dist.all_gather_object(everyone, list(keys))
    ordered = sorted(k for part in everyone for k in part)
    local = {k: i for i, k in enumerate(keys)}
    order = np.random.default_rng(list(seed)).permutation(len(ordered)).tolist()
    chunks = [order[i : i + size] for i in range(0, len(order), max(size, 1))]
    return [[local[ordered[j]] for j in chunk if ordered[j] in local] for chunk in chunks]
