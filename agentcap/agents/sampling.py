"""Sampling whose randomness belongs to the trajectory, not to the batch or the process.

HF ``generate(do_sample=True)`` draws from the global RNG for the whole batch at once, so a
trajectory's tokens depend on which other rows share its batch and on how many processes split
the work. Here every row carries its own seed: decoding is greedy over logits perturbed with
Gumbel noise drawn from that row's generator, which samples exactly from the tempered, top-p
filtered softmax (the Gumbel-max trick), and a row's draws never depend on its neighbours.
"""

from __future__ import annotations

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
    """

    def __init__(self, seeds: Sequence[int], temperature: float = 1.0, top_p: float = 1.0):
        # logits are divided by the temperature: 0 would make every logit ±inf or NaN, not greedy
        if not temperature > 0 or temperature == float("inf"):
            raise ValueError(f"RowSampler: temperature must be > 0 and finite, got {temperature!r} (greedy: do not sample)")
        if not 0 < top_p <= 1:
            raise ValueError(f"RowSampler: top_p must be in (0, 1], got {top_p!r}")
        self.seeds = list(seeds)
        self.temperature, self.top_p = temperature, top_p
        self._generators: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.shape[0] != len(self.seeds):
            raise ValueError(f"RowSampler: {len(self.seeds)} seeds for a batch of {scores.shape[0]} rows")
        if self._generators is None:  # on the logits' device: no per-step host-to-device copy of the noise
            self._generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            logits = top_p_filter(logits, self.top_p)
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
