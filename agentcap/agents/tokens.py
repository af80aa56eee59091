"""Token-id helpers shared by the backends, the agent and the update: cut a sampled row after its
first EOS, right-pad rows into a batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def trim_after_eos(new: torch.Tensor, eos_ids: Sequence[int], pad_id: int):
    """Keep tokens up to and including the first EOS; returns (ids [N, T], mask [N, T])."""
    is_eos = torch.zeros_like(new, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= new == e
    after = (is_eos.cumsum(dim=1) - is_eos.long()) > 0  # strictly after the first EOS
    mask = (~after).long()
    ids = new.masked_fill(after, pad_id)
    keep = int(mask.sum(dim=1).max()) if mask.numel() else 0
    return ids[:, : max(keep, 1)], mask[:, : max(keep, 1)]


def pad_right(rows: Sequence[torch.Tensor], pad_id: int, device=None):
    """Right-pad 1-D tensors into ([N, T] ids, [N, T] mask)."""
    t = max(max((r.numel() for r in rows), default=1), 1)
    ids = torch.full((len(rows), t), pad_id, dtype=rows[0].dtype if rows else torch.long)
    mask = torch.zeros(len(rows), t, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : r.numel()] = r
        mask[i, : r.numel()] = 1
    return ids.to(device), mask.to(device)
