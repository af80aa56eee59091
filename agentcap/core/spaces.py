"""Gymnasium spaces for text agents.

``gymnasium.spaces.Text`` samples from a fixed charset and refuses any character outside it, which a
language model's output does not respect; these spaces accept any string (up to a length) and
chat transcripts, and still sample deterministically from the space's seed for the env checker.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_WORDS = ("a", "dog", "barks", "twice", "then", "rain", "falls", "softly")


class FreeText(spaces.Space[str]):
    """Any Python string of at most ``max_length`` characters (an LLM's action)."""

    def __init__(self, max_length: int = 65536, seed: int | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(1, 8))
        return " ".join(self.np_random.choice(_SAMPLE_WORDS, size=n).tolist())

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, FreeText) and other.max_length == self.max_length


class Chat(spaces.Space[list]):
    """A chat transcript: a list of ``{"role": str, "content": str}`` messages."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, str]]:
        return [{"role": "user", "content": FreeText(seed=int(self.np_random.integers(2**31))).sample()}]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in x
        )

    def __repr__(self) -> str:
        return "Chat()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Chat)


class Media(spaces.Space[dict]):
    """Named arrays given to the acting model: waveform, frames or precomputed features."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> dict[str, np.ndarray]:
        return {"features": self.np_random.standard_normal((2, 4)).astype(np.float32)}

    def contains(self, x: Any) -> bool:
        return isinstance(x, dict) and all(
            isinstance(k, str) and isinstance(v, (np.ndarray, int, float)) for k, v in x.items()
        )

    def __repr__(self) -> str:
        return "Media()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Media)


_ROLE_CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


def observation_space() -> spaces.Dict:
    """The observation every agentcap environment emits: who acts, what they read, what they see or hear."""
    return spaces.Dict(
        {
            "agent": spaces.Text(max_length=64, min_length=1, charset=_ROLE_CHARSET),
            "messages": Chat(),
            "media": Media(),
        }
    )
