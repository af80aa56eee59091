"""A NaN or Inf stops the run before it reaches a checkpoint.

``optimizer_step`` (``training.optim``) checks the gradient norm before the optimiser steps (a NaN or
Inf loss makes every gradient NaN, so this catches the loss too) and the trained weights' 2-norm
after it (an lr so large that the update overflows; the gradient clip's kernel, one read of the
weights; weights so large that the norm overflows float32, |w| ~ 1e17, stop the run too). Both are
numbers every rank shares (the gradients are summed over ranks first; a sharded norm is gathered),
so all ranks stop together. The error is raised inside the training step, before the tick's checkpoint is written, so the
newest checkpoint on disk is the last good one. Finding the tensor to name costs a pass over the
parameters, paid only once something is already wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


class NonFiniteError(RuntimeError):
    """A NaN or Inf loss, gradient or weight; ``agentcap fit`` prints it as one line and exits 1."""


def first_non_finite(named: Iterable[tuple[str, torch.Tensor | None]]) -> str | None:
    """The name of the first tensor holding a NaN or Inf (on this rank: a shard may hold none)."""
    for name, tensor in named:
        if tensor is not None and not bool(torch.isfinite(tensor.detach()).all()):
            return name
    return None


def gradient_error(where: str, agent: torch.nn.Module, grad_norm: float, loss: float | None) -> NonFiniteError:
    """Why the gradient norm is not finite: the loss, else the first parameter whose gradient is."""
    if loss is not None and not math.isfinite(loss):
        what = f"the loss is {loss} (gradient norm {grad_norm})"
    else:
        name = first_non_finite((n, p.grad) for n, p in agent.named_parameters())
        what = f"the gradient of {name} is not finite" if name else f"the gradient norm is {grad_norm}"
        what += " (the loss was finite)" if loss is not None else ""
    return NonFiniteError(f"{where}: {what}; stopped before the optimiser step, no checkpoint written for this tick")


def weight_error(where: str, agent: torch.nn.Module, weight_norm: float) -> NonFiniteError:
    """Names the first trained weight the optimiser step turned into a NaN or Inf (none: the weights
    are finite but so large that their norm overflows float32, or the bad one is on another rank)."""
    name = first_non_finite((n, p) for n, p in agent.named_parameters() if p.requires_grad)
    what = f"the weight {name} is not finite" if name else f"the weights' norm is {weight_norm}"
    return NonFiniteError(
        f"{where}: {what} after the optimiser step (lr too large?); stopped before this tick's checkpoint, "
        "the previous one is the last good one"
    )
