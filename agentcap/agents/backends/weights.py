"""The learner's weights as the engine wants them: full tensors, one layer at a time.

Under FSDP2 every parameter is a ``DTensor`` shard; ``full_tensor()`` gathers one parameter on
every rank (a collective: all ranks iterate the same names in the same order), so at most one
layer is ever whole in memory. A peft model yields its base weights only, under the base model's
names: its adapter travels on its own (``backends.adapter_sync``), and the engine applies it as a
vLLM LoRA request.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

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


def layers(model: nn.Module) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """(name, full tensor) lists, one decoder layer (or one loose parameter) per list, in order."""
    group: list[tuple[str, torch.Tensor]] = []
    current: str | None = None
    for name, param in model.named_parameters():
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
