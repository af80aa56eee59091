"""The base class of every agentcap environment.

A task subclasses :class:`CaptionEnv` and writes three methods: ``begin`` (the first observation of
an episode), ``advance`` (apply one text action, return the next observation or ``None`` when the
episode is over) and ``score`` (turn a *batch* of finished episodes into :class:`Score` records).
Scoring is batched because the model-based scorers (examiners, the coherence LM) must see many
queries per forward pass and some rewards rank the G rollouts of an item against each other; the
rollout driver therefore builds its environments with ``defer_scoring=True`` and calls ``score``
once per batch, while a plain ``gymnasium.make`` user gets the reward from ``step`` as usual.
"""

from __future__ import annotations

import copy
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import gymnasium as gym

from agentcap.core.episode import Action, Episode, Score
from agentcap.core import unusable
from agentcap.core.manifests import ManifestError, SkipReport, read_manifest
from agentcap.core.spaces import FreeText, observation_space


class CaptionEnv(gym.Env):
    """A text-action environment over a manifest of items (see module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}
    #: Fields every manifest row must carry, with their types; checked on load.
    required_fields: dict[str, type | tuple[type, ...]] = {}
    #: Those of ``required_fields`` only scoring reads (gold captions, question banks, anchors): rows
    #: loaded under :func:`inference_rows` (``agentcap caption``, ``evaluate --predictions``) may lack
    #: them; ``check_item`` checks such a field only when the row has it.
    scoring_fields: frozenset[str] = frozenset()
    #: The most actions one episode can take (the rollout driver's turn limit); None: unknown (64).
    max_actions: int | None = None
    #: The instance attributes ``check_item`` reads (``max_seconds``, ``audio_check``): part of the
    #: loaded-manifest cache key, so environments that check rows differently do not share rows.
    check_settings: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        """Every task's ``Literal``-typed arguments refuse a value outside their choices (a typo)."""
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _checking_choices(cls.__dict__["__init__"])

    def __init__(
        self,
        manifest: str | None = None,
        items: Sequence[dict[str, Any]] | None = None,
        defer_scoring: bool = False,
        on_error: Literal["raise", "skip"] = "raise",
        max_skip_fraction: float = 0.1,
    ):
        if (manifest is None) == (items is None):
            raise ValueError(f"{type(self).__name__}: give exactly one of `manifest` or `items`")
        self.manifest = manifest
        self.on_error, self.max_skip_fraction = on_error, max_skip_fraction
        #: Rows refused at load with ``on_error="skip"``: counted, logged, never silently lost.
        self.skipped = SkipReport()
        if manifest is not None:
            self.items = read_manifest(
                manifest,
                self.fields_to_check(),
                check=self.check_item,
                on_error=on_error,
                max_skip_fraction=max_skip_fraction,
                report=self.skipped,
                limit=_ROW_LIMIT[-1] if _ROW_LIMIT else None,  # first_rows: --limit reads a prefix
            )
        else:
            self.items = list(items)
        if not self.items:
            raise ValueError(f"{type(self).__name__}: no items in {manifest or 'items'}")
        self.defer_scoring = defer_scoring
        self.observation_space = observation_space()
        self.action_space = FreeText()
        self.episode: Episode | None = None
        self._obs: dict[str, Any] | None = None
        self._finished = False

    def fields_to_check(self) -> dict[str, type | tuple[type, ...]]:
        """``required_fields``, less ``scoring_fields`` while :func:`inference_rows` is on."""
        if not _INFERENCE:
            return dict(self.required_fields)
        return {k: v for k, v in self.required_fields.items() if k not in self.scoring_fields}

    # --- what a task writes -------------------------------------------------------------------
    def check_item(self, row: dict[str, Any], where: str) -> None:
        """Raise a ``ManifestError`` naming ``where`` (file:line) when a row is unusable."""

    def begin(self, episode: Episode) -> dict[str, Any]:
        raise NotImplementedError

    def advance(self, episode: Episode, action: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def score(self, episodes: Sequence[Episode]) -> list[Score]:
        """One :class:`Score` per episode, the whole batch at once. Under ``grpo_fsdp`` a process
        with no episode still calls it with an empty list: a sharded judge must be asked anyway
        (``agentcap.judges.pool``), so return ``[]`` after asking it."""
        raise NotImplementedError

    def demonstrations(self, item: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """(observation, target action) pairs for the supervised warm start of each role."""
        raise NotImplementedError(f"{type(self).__name__} gives no demonstrations for supervised training")

    def caption(self, driver: Any, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Inference on new items with frozen agents; tasks override it (READ's recurrent context)."""
        batch = driver.run(items=items, greedy=True)
        return [
            {"id": e.item.get("id"), "caption": e.actions[-1].text if e.actions else "",
             "trace": [{"agent": a.agent, "kind": a.kind, "text": a.text} for a in e.actions]}
            for e in batch.episodes
        ]

    def caption_chunks(self, items: Sequence[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
        """Split ``items`` into groups that ``caption`` can run apart (``agentcap caption`` writes each
        group's rows when it is done and retries a failed group unit by unit: ``size=1``)."""
        return [list(items[i : i + size]) for i in range(0, len(items), max(1, size))]

    # --- gymnasium API ------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "item" in options:
            item, index = options["item"], -1
        else:
            index = int(options.get("index", self.np_random.integers(len(self.items))))
            if not 0 <= index < len(self.items):
                raise IndexError(f"reset(options={{'index': {index}}}): only {len(self.items)} items")
            item = self.items[index]
        self._finished = False
        self._obs, index = self._begin_usable(item, index, int(options.get("group", 0)))
        return self._obs, {"index": index}

    def _begin_usable(self, item: dict[str, Any], index: int, group: int) -> tuple[dict[str, Any], int]:
        """``begin`` the item; a manifest row found unusable there (its audio, decoded now: NaN samples,
        a truncated stream) stops the reset, or under ``on_error: skip`` is marked and the next usable
        row begins instead (``agentcap.core.unusable``). ``info["index"]`` names the row used."""
        for _ in range(len(self.items)):
            if unusable.reason(item) is None:
                self.episode = Episode(item=item, group=group)
                try:
                    return self.begin(self.episode), index
                except ManifestError as err:
                    if index < 0 or self.on_error != "skip":
                        raise
                    unusable.mark(item, self.manifest, str(err))
                    self._check_skip_share(err)
            if index < 0:  # an item given by value (inference) has no next row
                raise ManifestError(unusable.reason(item))
            index = (index + 1) % len(self.items)
            item = self.items[index]
        raise ManifestError(f"{self.manifest or 'items'}: every one of the {len(self.items)} rows is unusable when used; "
                            f"the last: {unusable.reason(item)}")

    def _check_skip_share(self, err: ManifestError) -> None:
        """Refused at load and found at use together, rows may not pass ``max_skip_fraction``."""
        at_use = len(unusable.found(self.manifest))
        lost = len(self.skipped.skipped) + at_use
        total = max(self.skipped.total, len(self.items) + len(self.skipped.skipped))
        if lost / total > self.max_skip_fraction:
            raise ManifestError(f"{self.manifest or 'items'}: {lost} of {total} rows are unusable ({at_use} found when "
                                f"used), more than max_skip_fraction={self.max_skip_fraction}; the last: {err}") from None

    def step(self, action: str):
        if self.episode is None or self._obs is None:
            raise RuntimeError("call reset() before step()")
        if self._finished:
            raise RuntimeError("this episode is over; call reset() before step()")
        if not isinstance(action, str):
            raise TypeError(f"actions are text; got {type(action).__name__}: {action!r}")
        episode, acting = self.episode, self._obs["agent"]
        n_before = len(episode.actions)
        next_obs = self.advance(episode, action)
        kind = episode.actions[n_before].kind if len(episode.actions) > n_before else "none"
        info: dict[str, Any] = {"agent": acting, "action_kind": kind}
        if next_obs is not None:
            self._obs = next_obs
            return next_obs, 0.0, False, False, info
        info["episode"] = episode
        self._finished = True
        final_obs = copy.deepcopy(self._obs)  # the caller owns what it is given; nothing is shared
        if self.defer_scoring:
            return final_obs, 0.0, True, False, info
        score = self.score([episode])[0]
        info.update(score=score, rewards=dict(score.components), utilities=list(score.utilities))
        return final_obs, float(score.reward), True, False, info

    # --- helpers for subclasses ---------------------------------------------------------------
    @staticmethod
    def record(episode: Episode, agent: str, kind: str, text: str) -> None:
        episode.actions.append(Action(agent=agent, kind=kind, text=text))

    @staticmethod
    def observation(agent: str, messages: list[dict[str, str]], media: dict[str, Any] | None = None):
        return {"agent": agent, "messages": messages, "media": dict(media or {})}


#: Non-empty while :func:`inference_rows` is on (a process-wide switch: rollout drivers build their
#: environments later, possibly in other threads).
_INFERENCE: list[bool] = []


@contextlib.contextmanager
def inference_rows() -> Iterator[None]:
    """Environments built inside load rows for inference: a row needs the media and what the agents
    read, not the fields only scoring uses (``CaptionEnv.scoring_fields``)."""
    _INFERENCE.append(True)
    try:
        yield
    finally:
        _INFERENCE.pop()


def loading_for_inference() -> bool:
    return bool(_INFERENCE)


#: The row limits of :func:`first_rows` in force (innermost last).
_ROW_LIMIT: list[int | None] = []


@contextlib.contextmanager
def first_rows(limit: int | None) -> Iterator[None]:
    """Environments built inside read only the first ``limit`` usable rows of their manifest
    (``agentcap caption / evaluate --limit``): the reading stops there, so a 10-item look at a
    million-row manifest costs 10 rows, not the file (None: every row)."""
    _ROW_LIMIT.append(limit)
    try:
        yield
    finally:
        _ROW_LIMIT.pop()


def _checking_choices(init):
    """Wrap ``init`` so that an argument typed ``Literal[...]`` must be one of its choices."""
    import difflib
    import functools
    import inspect
    import typing

    signature = inspect.signature(init)
    choices: dict[str, tuple] | None = None

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        nonlocal choices
        if choices is None:  # resolved on first use: annotations are strings until the module is loaded
            hints = typing.get_type_hints(init)
            choices = {n: typing.get_args(h) for n, h in hints.items() if typing.get_origin(h) is Literal}
        bound = signature.bind(self, *args, **kwargs)
        for name, value in bound.arguments.items():
            allowed = choices.get(name)
            if allowed and value not in allowed:
                close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"{type(self).__name__}: argument {name!r} must be one of {list(allowed)}, got {value!r}.{hint}"
                )
        init(self, *args, **kwargs)

    return checked
