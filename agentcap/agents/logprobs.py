"""Log-probs of chosen tokens without full-vocabulary float32 tensors.

A policy-gradient update needs log π(y_t | ·) of the sampled tokens only, yet ``log_softmax``
over the vocabulary keeps several [N, T, V] float32 tensors alive through backward (818 MB each
at N·T ≈ 4k with a 49k vocabulary). Here the output head is applied to the hidden states in
chunks of rows, inside one autograd function: its forward keeps only the chosen-token log-prob
(``logits.gather − logsumexp``) and the entropy (logged, never differentiated), and its backward
recomputes each chunk's logits from the saved hidden states. Memory grows with N·T (the hidden
states), not N·T·V: only one chunk's [rows, V] logits exist at a time.

The gradient is the usual one of a log-softmax: ∂ log p_y / ∂ z = onehot(y) − softmax(z).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

#: Rows (tokens) whose logits exist at once; 1024 × 49k × 4 B ≈ 200 MB.
CHUNK_ROWS = 1024


class _ChosenLogprobs(torch.autograd.Function):
    """hidden [M, H] @ weight [V, H]ᵀ / temperature → (log p of targets [M], entropy [M])."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk: int):
        logprobs = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = torch.empty_like(logprobs)
        lse_all = torch.empty_like(logprobs)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = (hidden[rows] @ weight.t()).float() / temperature  # [c, V]
            lse = torch.logsumexp(logits, dim=-1)
            logprobs[rows] = logits.gather(-1, targets[rows, None]).squeeze(-1) - lse
            entropy[rows] = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
            lse_all[rows] = lse
        ctx.save_for_backward(hidden, weight, targets, lse_all)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        hidden, weight, targets, lse_all = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            logits = (hidden[rows] @ weight.t()).float() / ctx.temperature
            g = grad_logprobs[rows].float()
            grad_z = torch.exp(logits - lse_all[rows, None]).mul_(-g[:, None])  # −softmax · g
            grad_z.scatter_add_(-1, targets[rows, None], g[:, None])  # + onehot(y) · g
            grad_z = grad_z / ctx.temperature
            if need_h:
                grad_h[rows] = (grad_z.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_w:
                grad_w += grad_z.t() @ hidden[rows].float()
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None


def chosen_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) per row of ``hidden`` [M, H] under the head ``weight`` [V, H]."""
    return _ChosenLogprobs.apply(hidden, weight, targets, float(temperature), int(chunk))


def logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """The same from given logits [..., V] (models without a plain linear head): one gather and
    one logsumexp on the differentiable path; the entropy outside the graph."""
    logits = logits.float()
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if not with_entropy:
        return logprobs, None
    with torch.no_grad():
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
    return logprobs, entropy


def plain_head(model: nn.Module) -> tuple[str, nn.Linear] | None:
    """The attribute path and module of ``model``'s output head when it is a bias-free linear layer
    whose output the model returns unchanged (no logit soft-capping); ``None`` otherwise."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return None
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    for name, module in model.named_modules():
        if module is head:
            return name, head
    return None


@contextlib.contextmanager
def head_removed(model: nn.Module, path: str):
    """Within the block the model's forward returns the hidden states in place of logits."""
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    head = getattr(parent, attr)
    setattr(parent, attr, nn.Identity())
    try:
        yield head
    finally:
        setattr(parent, attr, head)
