"""READ's anti-copy mask m_t (Eq. 4): response tokens that repeat a context n-gram do not count.

The coherence judge applies it before scoring, so that copying the previous AD earns no coherence.
"""

from __future__ import annotations

from collections.abc import Sequence


def anti_copy_mask(response_ids: Sequence[int], context_ids: Sequence[int], n: int = 3) -> list[int]:
    """m_t of Eq. 4: 0 for a response token inside any response n-gram that also occurs in the context.

    READ uses n = 3 or 4. A response shorter than ``n`` keeps every token.
    """
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    response = [int(t) for t in response_ids]
    context = [int(t) for t in context_ids]
    context_ngrams = {tuple(context[i : i + n]) for i in range(len(context) - n + 1)}
    mask = [1] * len(response)
    for start in range(len(response) - n + 1):
        if tuple(response[start : start + n]) in context_ngrams:
            mask[start : start + n] = [0] * n
    return mask
