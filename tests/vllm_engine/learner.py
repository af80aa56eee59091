"""The learner's side of the vLLM tests' comparisons: put a recorded set of weights back into it."""

from __future__ import annotations

import torch


def load_weights(agent, weights) -> None:
    """Copy ``weights`` (named as ``agent.model.named_parameters()``, e.g. ``trainable_weights``) in place;
    an unknown name is a KeyError."""
    params = dict(agent.model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)
