"""Per-piece credit: which piece of an action's text each of its generated tokens wrote.

An environment may cut an action's text into pieces with their own utilities (``Score.text_credit``:
AudioMap's sentences). The update trains tokens, so each token is placed in the piece where its text
ends: a token " From" that opens the next sentence belongs to that sentence, and EOS (no text) to the
last piece. Offsets come from decoding growing prefixes of the generated ids, since sampled ids need
not be the tokenizer's own encoding of the text and offset mappings describe only the latter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["token_pieces"]


def token_pieces(tokenizer: Any, ids: torch.Tensor | Sequence[int], text: str, ends: Sequence[int]) -> list[int]:
    """The piece index of every token in ``ids``; piece k ends at character ``ends[k]`` of ``text``
    (the action's text: the decoded ids, special tokens skipped and stripped, as ``Agent.generate``
    writes it). Refuses ``ends`` that do not rise to ``len(text)``."""
    ends = [int(e) for e in ends]
    if not ends or ends[-1] != len(text) or any(b <= a for a, b in zip(ends, ends[1:])) or ends[0] <= 0:
        raise ValueError(f"text credit ends must rise from above 0 to the text's length {len(text)}, got {ends}")
    ids = [int(i) for i in ids]
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    lead = len(decoded) - len(decoded.lstrip())  # the action's text is stripped
    pieces, piece, reached = [], 0, 0
    for t in range(len(ids)):
        # a prefix may end inside a multi-byte character; never let the offset run backwards
        reached = max(reached, len(tokenizer.decode(ids[: t + 1], skip_special_tokens=True)) - lead)
        while piece < len(ends) - 1 and reached > ends[piece]:
            piece += 1
        pieces.append(piece)
    return pieces
