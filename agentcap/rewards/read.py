"""READ's reward (Eq. 6): its components, combined.

:func:`read_rewards` is what the READ environment calls on a finished batch: it computes every
component with the functions of :mod:`agentcap.rewards.functional.read`, scores coherence with a
single batched :class:`~agentcap.judges.coherence.CoherenceScorer` call, and combines them with
:func:`~agentcap.rewards.base.weighted_sum`.

The rank levels λ_1, λ_2 of Eq. 5 are not given in the paper (only k = 2 is); the default
``(1.0, 0.5)`` gives the best-ranked response the full coherence reward and the runner-up half, so
that after the 0.05 weight the bonus stays below the format weight (0.08) and never outweighs a
visible accuracy difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from agentcap.rewards.base import weighted_sum
from agentcap.rewards.functional.read import (
    accuracy_reward,
    coherence_reward,
    extract_answer,
    format_reward,
    length_window_reward,
)

if TYPE_CHECKING:
    from agentcap.judges.coherence import CoherenceScorer

#: READ §4.1: accuracy is the anchor; format, length and coherence weights 0.08, 0.05, 0.05.
READ_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"accuracy": 1.0, "format": 0.08, "length": 0.05, "coherence": 0.05}
)


def read_rewards(
    responses: Sequence[str],
    references: Sequence[str],
    contexts: Sequence[Sequence[str]],
    groups: Sequence[int],
    scorer: CoherenceScorer | None,
    weights: Mapping[str, float] = READ_WEIGHTS,
    tau: float = 0.12,
    top_k: int = 2,
    levels: Sequence[float] = (1.0, 0.5),
    tolerance: int = 4,
    ngram: int = 3,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """R_i of Eq. 6 and its named components, each [N] float64.

    ``contexts[i]`` are the previous ADs of response i's item (empty for a plain clip→AD instance)
    and ``groups[i]`` ties the rollouts of one item together. Coherence (Eq. 4–5) is scored, in one
    batched scorer call, on the answers of responses that have a context and R_acc ≥ ``tau``; with
    ``scorer=None`` the coherence component is all zeros.
    """
    n = len(responses)
    if not (len(references) == len(contexts) == len(groups) == n):
        raise ValueError(
            f"responses ({n}), references ({len(references)}), contexts ({len(contexts)}) and groups"
            f" ({len(groups)}) must have one entry per response"
        )
    accuracy = accuracy_reward(responses, references)  # Eq. 3
    components = {
        "accuracy": accuracy,
        "format": format_reward(responses),
        "length": length_window_reward(responses, references, tolerance=tolerance),
    }
    coherence_scores = torch.full((n,), float("nan"), dtype=torch.float64)
    if scorer is not None:
        answers = [extract_answer(r) for r in responses]
        eligible = [
            i
            for i in range(n)
            if answers[i] and any(ad.strip() for ad in contexts[i]) and float(accuracy[i]) >= tau
        ]
        if eligible:
            scored = scorer.score([contexts[i] for i in eligible], [answers[i] for i in eligible], n=ngram)
            coherence_scores[eligible] = scored.to(torch.float64).cpu()  # Eq. 4
    components["coherence"] = coherence_reward(
        coherence_scores, accuracy, groups, tau=tau, top_k=top_k, levels=levels
    )  # Eq. 5
    return weighted_sum(components, weights), components  # Eq. 6
