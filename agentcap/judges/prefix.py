"""Next-token logits of many prompts that share prefixes, reading each shared prefix once.

A judge's prompts repeat themselves: every prompt opens with the same template and instruction,
and every question about one caption repeats that caption. Scoring each prompt from scratch pays
for those tokens again and again; here the prompts are read as a three-level tree:

1. the *header*, the token prefix common to all prompts (template + instruction), one pass;
2. per group (e.g. one caption), the group's common prefix after the header, one row per group
   on top of the header's KV cache;
3. per prompt, the rest (the question), one row on top of its group's cache.

Only the last position's logits are produced, at the ids asked for. Positions are explicit
(count of attended tokens), so padding between the levels changes nothing: every prompt's
logits equal those of the prompt read alone, up to float rounding of the split attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentcap.agents.logprobs import head_removed, plain_head


def common_prefix(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix shared by every row."""
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != first[i] for r in rows):
            return i
    return n


def _select(cache, index: torch.Tensor):
    """A new DynamicCache holding the rows ``index`` of ``cache``."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=[(layer.keys[index], layer.values[index]) for layer in cache.layers])


def _right_pad(rows: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


class PrefixReader:
    """Reads prompts grouped by a key (see module docstring) and returns last-token logits."""

    def __init__(self, model, pad_id: int, batch_size: int = 32, forward=None):
        self.model = model
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.call = forward or model  # a judge's counted forward (agentcap.judges.examiner)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward(self, ids, full_mask, cache):
        """One pass over ``ids`` [B, L] after ``cache``; ``full_mask`` covers cache + ids."""
        positions = (full_mask.cumsum(dim=1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.call(input_ids=ids, attention_mask=full_mask, position_ids=positions,
                        past_key_values=cache, use_cache=True)
        return out

    @torch.inference_mode()
    def last_logits(self, prompts: Sequence[Sequence[int]], groups: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        """[N, len(ids)] float32 logits at each prompt's last token, restricted to ``ids``.

        ``groups[i]`` names prompt i's group (prompts of a group share a prefix: one caption).
        """
        from transformers import DynamicCache

        n = len(prompts)
        out = torch.empty((n, len(ids)), dtype=torch.float32)
        if not n:
            return out
        wanted = torch.tensor(list(ids), device=self.device)
        members: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        # every prompt keeps at least its last token for level 3 (the logits come from there)
        header = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
        header_ids = torch.tensor([list(prompts[0][:header])], device=self.device)
        header_cache = DynamicCache()
        if header:
            self._forward(header_ids, torch.ones_like(header_ids), header_cache)
        head = plain_head(self.model)
        keys = list(members)
        for start in range(0, len(keys), self.batch_size):
            chunk = keys[start : start + self.batch_size]
            ends = [min(common_prefix([prompts[i] for i in members[g]]), min(len(prompts[i]) for i in members[g]) - 1)
                    for g in chunk]
            middle, middle_mask = _right_pad([prompts[members[g][0]][header:end] for g, end in zip(chunk, ends)],
                                             self.pad_id, self.device)
            ones = torch.ones((len(chunk), header), dtype=torch.long, device=self.device)
            cache = _select(header_cache, torch.zeros(len(chunk), dtype=torch.long, device=self.device)) if header \
                else DynamicCache()
            prefix_mask = torch.cat([ones, middle_mask], dim=1)
            if middle.shape[1]:
                self._forward(middle, prefix_mask, cache)
            rows = [(slot, i) for slot, g in enumerate(chunk) for i in members[g]]
            for r0 in range(0, len(rows), self.batch_size):
                part = rows[r0 : r0 + self.batch_size]
                slots = torch.tensor([s for s, _ in part], device=self.device)
                tail, tail_mask = _right_pad([prompts[i][ends[s] :] for s, i in part],
                                             self.pad_id, self.device)
                full_mask = torch.cat([prefix_mask[slots], tail_mask], dim=1)
                row_cache = _select(cache, slots) if cache.get_seq_length() else DynamicCache()
                last = tail_mask.sum(dim=1) - 1
                if head is None:
                    logits = self._forward(tail, full_mask, row_cache).logits
                    picked = logits[torch.arange(len(part)), last]
                else:
                    path, linear = head
                    with head_removed(self.model, path):
                        hidden = self._forward(tail, full_mask, row_cache).logits
                    picked = linear(hidden[torch.arange(len(part), device=hidden.device), last])
                out[torch.tensor([i for _, i in part])] = picked[:, wanted].float().cpu()
        return out
