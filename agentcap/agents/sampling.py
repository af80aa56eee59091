"""Sampling whose randomness belongs to the trajectory, not to the batch or the process.

HF ``generate(do_sample=True)`` draws from the global RNG for the whole batch at once, so a
trajectory's tokens depend on which other rows share its batch and on how many processes split
the work. Here every row carries its own seed: decoding is greedy over logits perturbed with
Gumbel noise drawn from that row's generator, which samples exactly from the tempered, top-p
filtered softmax (the Gumbel-max trick), and a row's draws never depend on its neighbours.

``greedy_ids`` (an agent's ``greedy_numbers``) make a set of tokens one choice: whether a number comes
next is sampled, *which* number is the most likely one. A group's rollouts then differ in what they
say, not in digits drawn at the temperature (docs/real.md: on the real AudioMap recipe most groups
differed only in their numbers, and GRPO learned which digits had scored).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch


def trajectory_seed(seed: int, trajectory: int, turn: int) -> int:
    """The seed of one trajectory's ``turn``-th action, from its *global* position (any split)."""
    return int(np.random.SeedSequence([seed, trajectory, turn]).generate_state(1, dtype=np.uint64)[0] >> 1)


class RowSampler:
    """A logits processor for greedy ``generate`` that turns it into per-row seeded sampling.

    Args:
        seeds: one seed per row of the batch.
        temperature: the agent's sampling temperature.
        top_p: nucleus mass (1 keeps every token).
        greedy_ids: token ids drawn as one choice whose member is always the likeliest
            (:func:`collapse_to_best`); ``None`` samples every token.
    """

    def __init__(self, seeds: Sequence[int], temperature: float = 1.0, top_p: float = 1.0,
                 greedy_ids: torch.Tensor | None = None):
        # logits are divided by the temperature: 0 would make every logit ±inf or NaN, not greedy
        if not temperature > 0 or temperature == float("inf"):
            raise ValueError(f"RowSampler: temperature must be > 0 and finite, got {temperature!r} (greedy: do not sample)")
        if not 0 < top_p <= 1:
            raise ValueError(f"RowSampler: top_p must be in (0, 1], got {top_p!r}")
        self.seeds = list(seeds)
        self.temperature, self.top_p = temperature, top_p
        self.greedy_ids = greedy_ids
        self._generators: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.shape[0] != len(self.seeds):
            raise ValueError(f"RowSampler: {len(self.seeds)} seeds for a batch of {scores.shape[0]} rows")
        if self._generators is None:  # on the logits' device: no per-step host-to-device copy of the noise
            self._generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            logits = top_p_filter(logits, self.top_p)
        if self.greedy_ids is not None:
            logits = collapse_to_best(logits, self.greedy_ids)
        vocab = logits.shape[-1]
        uniform = torch.stack(
            [torch.rand(vocab, generator=g, device=scores.device) for g in self._generators]
        ).clamp_(min=1e-20, max=1.0 - 1e-7)
        return logits - torch.log(-torch.log(uniform))  # + Gumbel(0, 1)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches ``top_p`` (always the best one)."""
    ordered, order = logits.sort(dim=-1, descending=True)
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = mass - ordered.softmax(dim=-1) >= top_p  # tokens after the mass is already reached
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def collapse_to_best(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The tokens ``ids`` as one choice: their total probability on the likeliest of them, the others
    never drawn (every other token keeps its probability)."""
    ids = ids.to(logits.device)
    members = logits[:, ids]  # [N, K]
    best = ids[members.argmax(dim=-1)]
    total = torch.logsumexp(members, dim=-1)  # log Σ exp: the set's mass, unnormalised like the logits
    out = logits.index_fill(-1, ids, float("-inf"))
    return out.scatter(-1, best[:, None], total[:, None])


#: a token that is a number: digits with an optional decimal part, spaces around (SmolLM2 and GPT-2
#: write one digit a token, a word-level tokenizer "0.3" whole)
NUMBER = re.compile(r"\s*\d+(?:[.,]\d+)?\s*")


def number_token_ids(tokenizer) -> torch.Tensor:
    """The ids of ``tokenizer``'s number tokens (:data:`NUMBER`), for ``greedy_ids``."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    ids = [i for i, text in enumerate(texts) if NUMBER.fullmatch(text)]
    return torch.tensor(ids, dtype=torch.long)
