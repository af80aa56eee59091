"""Next-token logits of many prompts that share prefixes, reading every shared prefix once.

A judge's prompts repeat themselves: all open with the same template and instruction, every
question about one caption repeats that caption, and the questions about one sentence of a caption
repeat that sentence up to their blank. Scoring each prompt from scratch pays for those tokens
again and again; here the prompts' token ids are read as a radix tree:

- a *node* is a run of tokens that every prompt below it shares, fed once, on top of its
  parent's KV cache (the root: the template and instruction common to all prompts);
- a *leaf* is one prompt's own remaining tokens (at least its last one, where its logits are read).

Siblings and cousins are fed together, ``batch_size`` rows a pass, and a batch's children are read
before the next batch, so at most (tree depth × batch size) rows of cache are alive at once. A node
shorter than ``min_tokens`` is not worth a pass of its own and is folded into its children.

Only the last position's logits are produced, at the ids asked for. Positions are explicit (count
of attended tokens), so padding between the levels changes nothing: every prompt's logits equal
those of the prompt read alone, up to float rounding of the split attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agentcap.agents.logprobs import head_removed, plain_head

MIN_TOKENS = 4  # a shared run shorter than this is read by each prompt below it (a pass costs more)


def common_prefix(rows: Sequence[Sequence[int]], start: int = 0) -> int:
    """Length of the longest token prefix shared by every row (counting from ``start``)."""
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(start, n):
        token = first[i]
        if any(r[i] != token for r in rows):
            return i - start
    return max(n - start, 0)


@dataclass
class Node:
    """Tokens ``[start, end)`` of prompt ``prompt`` (shared by every prompt below the node); a leaf
    when it has no children, and then ``prompt``'s logits are read at its last token."""

    prompt: int
    start: int
    end: int
    children: list["Node"] = field(default_factory=list)

    def size(self) -> int:
        """Tokens fed for this subtree."""
        return self.end - self.start + sum(child.size() for child in self.children)


def prefix_tree(prompts: Sequence[Sequence[int]], min_tokens: int = 1) -> Node:
    """The radix tree of ``prompts`` (each at least one token long). Its root holds the prefix of
    all prompts (possibly empty); every prompt ends in a leaf of its own."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    everyone = list(range(len(prompts)))
    shortest = min((len(p) for p in prompts), default=1)
    header = min(common_prefix(prompts), shortest - 1)
    return Node(0, 0, header, _children(prompts, everyone, header, min_tokens))


def _children(prompts, members: list[int], start: int, min_tokens: int) -> list[Node]:
    """The subtrees of ``members``, which all share their first ``start`` tokens."""
    nodes, by_token = [], {}
    for i in members:
        if len(prompts[i]) - start == 1:  # its last token: a leaf now
            nodes.append(Node(i, start, start + 1))
        else:
            by_token.setdefault(prompts[i][start], []).append(i)
    for group in by_token.values():
        if len(group) == 1:
            nodes.append(Node(group[0], start, len(prompts[group[0]])))
            continue
        rows = [prompts[i] for i in group]
        end = start + min(common_prefix(rows, start), min(len(r) for r in rows) - 1 - start)
        below = _children(prompts, group, end, min_tokens)
        if end - start < min_tokens:  # too short for a pass of its own: its children read it too
            for child in below:
                child.start = start
            nodes.extend(below)
        else:
            nodes.append(Node(group[0], start, end, below))
    return nodes


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
    """Reads prompts as a prefix tree (see module docstring) and returns last-token logits."""

    def __init__(self, model, pad_id: int, batch_size: int = 32, forward=None, min_tokens: int = MIN_TOKENS):
        self.model = model
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.min_tokens = min_tokens
        self.call = forward or model  # a judge's counted forward (agentcap.judges.examiner)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward(self, ids, full_mask, cache):
        """Hidden states (or logits, for a head we cannot detach) of ``ids`` [B, L] after ``cache``;
        ``full_mask`` covers cache + ids."""
        positions = (full_mask.cumsum(dim=1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        return self.call(input_ids=ids, attention_mask=full_mask, position_ids=positions,
                         past_key_values=cache, use_cache=True).logits

    @torch.inference_mode()
    def last_logits(self, prompts: Sequence[Sequence[int]], ids: Sequence[int]) -> torch.Tensor:
        """[N, len(ids)] float32 logits at each prompt's last token, restricted to ``ids``."""
        from transformers import DynamicCache

        out = torch.empty((len(prompts), len(ids)), dtype=torch.float32)
        if not prompts:
            return out
        wanted = torch.tensor(list(ids), device=self.device)
        head = plain_head(self.model)

        def states(tokens, full_mask, cache):  # hidden states when the head can be applied to leaves only
            if head is None:
                return self._forward(tokens, full_mask, cache)
            with head_removed(self.model, head[0]):
                return self._forward(tokens, full_mask, cache)

        def read(nodes: list[Node], parents: list[int], cache, mask: torch.Tensor) -> None:
            """Feeds ``nodes`` (node k on top of row ``parents[k]`` of ``cache``) a batch at a time,
            each batch's children before the next batch."""
            for start in range(0, len(nodes), self.batch_size):
                chunk = nodes[start : start + self.batch_size]
                rows = torch.tensor(parents[start : start + self.batch_size], device=self.device)
                own = _select(cache, rows) if cache.get_seq_length() else DynamicCache()
                tokens, tokens_mask = _right_pad([prompts[n.prompt][n.start : n.end] for n in chunk],
                                                 self.pad_id, self.device)
                full_mask = torch.cat([mask[rows], tokens_mask], dim=1)
                hidden = states(tokens, full_mask, own)
                leaves = [k for k, n in enumerate(chunk) if not n.children]
                if leaves:
                    at = torch.tensor(leaves, device=hidden.device)
                    last = hidden[at, tokens_mask.sum(dim=1).to(hidden.device)[at] - 1]
                    logits = last if head is None else head[1](last)
                    out[torch.tensor([chunk[k].prompt for k in leaves])] = logits[:, wanted].float().cpu()
                below = [(child, k) for k, n in enumerate(chunk) for child in n.children]
                if below:
                    read([c for c, _ in below], [k for _, k in below], own, full_mask)

        root = prefix_tree(prompts, self.min_tokens)
        cache, mask = DynamicCache(), torch.ones((1, 0), dtype=torch.long, device=self.device)
        if root.end:
            header = torch.tensor([list(prompts[0][: root.end])], device=self.device)
            mask = torch.ones_like(header)
            states(header, mask, cache)
        read(root.children, [0] * len(root.children), cache, mask)
        return out
