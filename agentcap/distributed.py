"""Data-parallel plumbing the GRPO update needs, in one place.

Items are sharded over ranks, so every GRPO group lives on one rank and group statistics need no
communication. What does cross ranks: the global loss normaliser (token or sequence count), the
gradients of the trainable agent (summed: the loss weights are already globally normalised), the
number of optimiser steps (every rank must take the same count) and logged means. Without an
initialised process group every helper is the single-process identity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist


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


def aligned(chunks: list[list[int]], device: torch.device | str = "cpu") -> list[list[int]]:
    """Pad with empty minibatches so every rank takes the same number of optimiser steps."""
    if world()[1] == 1:
        return chunks
    count = torch.tensor([len(chunks)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return chunks + [[] for _ in range(int(count) - len(chunks))]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (collective: every rank must call it)."""
    _, size = world()
    if size == 1:
        return [obj]
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, obj)
    return gathered
