"""One prompt encoded once for its G rollouts: a shared prefill for HF ``generate``.

GRPO asks for G completions of every item, so a batch holds each prompt G times. HF ``generate``
would prefill every row; here each distinct prompt row (same tokens or embeddings, same mask) is
run once over all but its last token, its KV cache is copied out to the rows that repeat it, in
the batch's order, and ``generate`` resumes from that cache: per row, only the last prompt token
and the new tokens are computed. Positions are the ones ``generate`` assigns from the left-padded
mask, so the completions are those of the full prefill, up to float rounding (a different batch
shape may pick different kernels); the learner's log-probs are recomputed from the tokens anyway.

Only plain ``DynamicCache`` layers are shared (full attention): sliding-window, linear-attention
(recurrent) or quantised caches keep the ordinary prefill, as do batches where no prompt repeats.
"""

from __future__ import annotations

import inspect

import torch


def repeated_rows(*rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Indices of the first occurrence of each distinct row of ``rows`` (tensors whose first dim is
    the batch, compared together, exactly), and for every row the index of its distinct row: the
    pair ``(unique [U], inverse [N])``, or None when every row is distinct."""
    n = rows[0].shape[0]
    flat = torch.cat([r.reshape(n, -1).to(torch.float64) for r in rows], dim=1)
    _, inverse = torch.unique(flat, dim=0, return_inverse=True)
    u = int(inverse.max()) + 1 if n else 0
    if u == n:
        return None
    first = torch.full((u,), n, dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=inverse.device), reduce="amin")
    return first, inverse


def shared_prompt_cache(model, attention_mask: torch.Tensor, input_ids=None, inputs_embeds=None):
    """A KV cache of every row's prompt but its last token, computed once per distinct prompt, for
    ``model.generate(..., past_key_values=cache)``; None when sharing does not apply (see module).

    Give ``input_ids`` [N, P] or ``inputs_embeds`` [N, P, H], left-padded like ``attention_mask``.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    prompt = input_ids if input_ids is not None else inputs_embeds
    if prompt is None or prompt.shape[1] < 2 or attention_mask.ndim != 2:
        return None
    if not getattr(model, "_supports_default_dynamic_cache", lambda: False)():
        return None  # recurrent / hybrid caches
    if getattr(getattr(model, "generation_config", None), "cache_implementation", None) is not None:
        return None  # a static / offloaded cache of the model's own choosing; generate refuses a second one
    found = repeated_rows(prompt, attention_mask)
    if found is None:
        return None
    first, inverse = found
    cache = DynamicCache(config=model.config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    mask = attention_mask[first, :-1]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate derives them
    inputs = {"input_ids": input_ids[first, :-1]} if input_ids is not None else {"inputs_embeds": inputs_embeds[first, :-1]}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        inputs["logits_to_keep"] = 1  # the prefill's logits are never read
    model(**inputs, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
    cache.batch_select_indices(inverse.to(mask.device))
    return cache
