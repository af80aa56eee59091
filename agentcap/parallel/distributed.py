"""Data-parallel plumbing the GRPO update needs, in one place, so that N processes reproduce one.

Batch sizes in configs are global. Every process takes a strided :func:`share` of each global list
of items and keeps each item's global position: sampling seeds follow that position
(:func:`agentcap.agents.sampling.trajectory_seed`), and each GRPO group lives on one rank, so group
statistics need no communication. What does cross ranks: the global loss normaliser (token or
sequence count), the optimiser minibatches (drawn over every rank's spans,
:func:`global_minibatches`), the gradients of the trainable agent (summed: the loss weights are
already globally normalised) and logged means. Without an initialised process group every helper
is the single-process identity.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def global_sums(values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
    """Element-wise sums over ranks, in one all-reduce (float64, so counts stay exact)."""
    if world()[1] == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def sum_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Sum the gradients of trainable parameters over ranks (a rank that saw no data adds zeros)."""
    if world()[1] == 1:
        return
    for p in parameters:
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)


def collective_device() -> torch.device:
    """Where a small tensor for a collective must live (NCCL only reduces CUDA tensors)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def most(value: int) -> int:
    """The largest ``value`` over ranks."""
    if world()[1] == 1:
        return value
    t = torch.tensor([value], device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def share(chosen: Sequence[T], what: str = "items") -> tuple[list[T], list[int]]:
    """This process's strided share of a global list, and the global positions of its elements."""
    rank, size = world()
    if len(chosen) < size:
        raise ValueError(
            f"a global batch of {len(chosen)} {what} cannot be split over {size} processes; "
            "make the batch size at least the number of processes"
        )
    positions = list(range(rank, len(chosen), size))
    return [chosen[p] for p in positions], positions


def global_minibatches(keys: Sequence[Hashable], size: int, seed: Sequence[int]) -> list[list[int]]:
    """Local indices of ``keys`` in each global minibatch of ``size`` spans.

    ``keys`` name this process's spans globally (trajectory id, action index). The union of every
    process's keys is sorted, permuted with ``seed`` and cut into chunks of ``size``; each process
    gets, per chunk, the indices of its own spans in it (possibly none). So every process takes the
    same number of optimiser steps, and step k sees the same global minibatch whatever the number
    of processes.
    """
    ordered = sorted(k for part in gather_objects(list(keys)) for k in part)
    local = {k: i for i, k in enumerate(keys)}
    order = np.random.default_rng(list(seed)).permutation(len(ordered)).tolist()
    chunks = [order[i : i + size] for i in range(0, len(order), max(size, 1))]
    return [[local[ordered[j]] for j in chunk if ordered[j] in local] for chunk in chunks]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (collective: every rank must call it)."""
    _, size = world()
    if size == 1:
        return [obj]
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, obj)
    return gathered
