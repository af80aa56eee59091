"""The learner's weights as the engine wants them: full tensors, one layer at a time.

Under FSDP2 every parameter is a ``DTensor`` shard; ``full_tensor()`` gathers one parameter on
every rank (a collective: all ranks iterate the same names in the same order), so at most one
layer is ever whole in memory. A peft model yields its base weights only, under the base model's
names: its adapter travels on its own (``backends.adapter_sync``), and the engine applies it as a
vLLM LoRA request.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch
import torch.nn as nn

_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")
_PEFT_PREFIX = "base_model.model."


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (a collective), or the tensor itself; detached."""
    full_tensor = getattr(tensor, "full_tensor", None)  # torch.distributed.tensor.DTensor
    return (full_tensor() if full_tensor is not None else tensor).detach()


def engine_name(name: str) -> str | None:
    """The checkpoint name of a learner parameter; None for parameters the engine has no use for
    (LoRA factors, which reach the engine as an adapter)."""
    if "lora_" in name or ".original_module." in name:
        return None
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX) :]
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def trainable_weights(model: nn.Module, whole: bool = False) -> dict[str, torch.Tensor]:
    """A detached clone of ``model``'s trainable tensors (a LoRA agent's: its adapter only), by
    parameter name: the weights of one step, kept while the learner moves on. ``whole``: its frozen
    tensors too, uncloned (they do not change), in the model's order, so the dict stands for the
    whole model in :func:`layers` and another thread need not read the model (whose forward may
    swap its output head out meanwhile: ``agents.logprobs.head_removed``)."""
    with torch.no_grad():
        return {name: p.detach().clone() if p.requires_grad else p.detach()
                for name, p in model.named_parameters() if whole or p.requires_grad}


def layers(model: nn.Module, weights: Mapping[str, torch.Tensor] | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """(name, full tensor) lists, one decoder layer (or one loose parameter) per list, in order;
    ``weights`` (every parameter by name, ``trainable_weights(model, whole=True)``) in place of the
    model's own."""
    group: list[tuple[str, torch.Tensor]] = []
    current: str | None = None
    for name, param in (weights.items() if weights is not None else model.named_parameters()):
        target = engine_name(name)
        if target is None:
            continue
        match = _LAYER.match(target)
        key = match.group(1) if match else target
        if group and key != current:
            yield group
            group = []
        current = key
        group.append((target, full(param)))
    if group:
        yield group


def gathered_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of a sharded ``model`` whole, copied to host memory, by name in the model's
    order: a snapshot :func:`layers` reads without any collective (each gather here is one, so every
    rank calls it at the same point). One parameter is whole on the device at a time."""
    with torch.no_grad():
        return {name: full(p).to("cpu", copy=True) for name, p in model.named_parameters()}
