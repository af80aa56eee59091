"""Gradient (activation) checkpointing for agents that stay in eval mode.

HF models checkpoint a decoder layer only when ``self.gradient_checkpointing and self.training``,
and agents never enter training mode: dropout would make the learner see another policy than the
sampler. Turning ``training`` on for the layers alone is not safe either: some layers call
``F.dropout(..., training=self.training)`` directly (Whisper-style audio encoder layers), and
checkpointing layers drop the KV cache, which would break generation.

So the checkpointed unit is the same (each HF ``GradientCheckpointingLayer``, or any module class
named in ``layer_classes``), but the switch is ours: a layer's ``forward`` runs under
``torch.utils.checkpoint`` (non-reentrant, so frozen inputs and keyword arguments are fine) only
when autograd is recording. Sampling (no grad) runs the plain forward with its cache; ``training``
is never touched, so dropout stays off and the recomputed activations equal the stored ones.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def checkpointed_layers(model: nn.Module, layer_classes: tuple[type, ...] = ()) -> list[nn.Module]:
    """The modules that checkpoint as a unit: HF's checkpointing layers, outermost only."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    kinds = (GradientCheckpointingLayer, *layer_classes)
    chosen: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, kinds) and not any(_contains(outer, module) for outer in chosen):
            chosen.append(module)
    return chosen


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def enable_gradient_checkpointing(model: nn.Module, role: str = "policy", layer_classes: tuple[type, ...] = ()) -> int:
    """Checkpoint every layer of ``model`` under autograd; returns the number of layers."""
    layers = checkpointed_layers(model, layer_classes)
    if not layers:
        raise ValueError(
            f"agents.{role}.gradient_checkpointing: {type(model).__name__} has no checkpointable layers "
            "(Hugging Face decoder layers); turn it off for this model"
        )
    for layer in layers:
        # an instance attribute, which nn.Module.__call__ (and its hooks) call; a bound method, so a
        # deepcopy of the model (a KL reference) gets a forward bound to its own layer
        layer.forward = types.MethodType(_checkpointed_forward, layer)
    return len(layers)


def _checkpointed_forward(layer: nn.Module, *args, **kwargs):
    plain = functools.partial(type(layer).forward, layer)
    if torch.is_grad_enabled():
        return checkpoint(plain, *args, use_reentrant=False, **kwargs)
    return plain(*args, **kwargs)


def is_checkpointed(model: nn.Module) -> bool:
    """Whether some layer of ``model`` runs under :func:`enable_gradient_checkpointing`."""
    return any(getattr(m.forward, "__func__", None) is _checkpointed_forward for m in model.modules())
