"""Records shared by environments, the rollout driver and the algorithms.

An environment keeps an :class:`Episode` (the item, the acting roles' actions in order) and turns a
finished batch of them into :class:`Score` records. A score carries one utility per action, aligned
with ``episode.actions``: ``None`` for an action that must not be trained (an Instruct answer during
a Composer phase, say), a float otherwise. The algorithm normalises utilities within
``(group, agent, kind)`` so that GRPO (one kind per group) and LOOP-GRPO (question / stop / final
kinds) are the same computation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Action:
    """One text action taken by a role, with the kind the environment parsed it as."""

    agent: str
    kind: str
    text: str


@dataclass
class Episode:
    """One rollout of one dataset item; ``group`` ties the G rollouts of an item together."""

    item: dict[str, Any]
    group: int = 0
    actions: list[Action] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    def texts(self, kind: str) -> list[str]:
        return [a.text for a in self.actions if a.kind == kind]


@dataclass
class Score:
    """What a finished episode earned: the scalar reward, its named parts and per-action utilities.

    ``text_credit`` (optional, per action like ``utilities``): the action's text cut into pieces, each
    ``(end, utility)`` with ``end`` its last character offset (exclusive), in order, the last reaching
    the text's end. The update then trains each piece's tokens with its own advantage beside the
    action's (per-sentence credit: ``ClozeCaption-v0``'s ``credit="sentence"``;
    ``training.update.set_advantages``). ``None`` or missing: the action's utility covers all of it.
    """

    reward: float
    components: dict[str, float]
    utilities: list[float | None]
    extras: dict[str, Any] = field(default_factory=dict)
    text_credit: list[list[tuple[int, float]] | None] = field(default_factory=list)
