"""A single-step text task scored by plain reward functions, without writing an environment."""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from agentcap.core.env import CaptionEnv
from agentcap.core.episode import Episode, Score
from agentcap.core.settings import ConfigError

#: ``fn(prompts, completions, **columns) -> one float (or None: does not apply) per completion``.
RewardFunction = Callable[..., Sequence[float | None]]


class TextRewardsEnv(CaptionEnv):
    """One prompt, one answer, scored by your reward functions (TRL-style ``reward_funcs``).

    ## Description
    Each manifest row holds a prompt (``prompt_field``) and any other fields. The policy sees the
    prompt as one user message (after an optional system message), without media, and answers once.
    The answers of a batch are scored by plain Python functions, given as import strings.

    ## Action
    Text: the answer.

    ## Observation
    ``{"agent": agent, "messages": [system?, user prompt], "media": {}}``.

    ## Rewards
    Each function is called once per batch as ``fn(prompts, completions, **columns)`` with
    ``prompts`` and ``completions`` lists of strings and ``columns`` the rows' other fields, one list
    each (``answer=[…]``; a row without the field gives ``None``; only the names the function takes,
    or all with ``**kwargs``). It returns one float per completion, or ``None`` where it does not
    apply. The reward is ``sum_k w_k f_k`` over the functions that apply; each function is logged
    as a reward component under its ``__name__`` (``reward/exact_match``).

    ## Episode end
    After the single action. ``info["utilities"]`` holds the reward for that action.

    ## Arguments
    manifest: JSONL, one row per prompt. reward_funcs: import strings ``my_pkg.rewards:exact_match``
    (or callables); a bad one is refused by name when the environment is built. reward_weights: one
    weight per function (default 1 each). prompt_field: the row field with the prompt (``prompt``).
    reference_field: the row field with the reference answer (``answer``): the SFT target and what
    ``agentcap evaluate`` compares with; rows without it give no demonstration. system: an optional
    system message. agent: the role that answers (``policy``). on_error: ``skip`` drops unusable rows
    and counts them; more than ``max_skip_fraction`` stops.

    ## Version history
    v0: first version.
    """

    max_actions = 1  # single step

    def __init__(
        self,
        manifest: str | None = None,
        items: Sequence[dict[str, Any]] | None = None,
        reward_funcs: Sequence[str | RewardFunction] = ("agentcap_envs.text_rewards:exact_match",),
        reward_weights: Sequence[float] | None = None,
        prompt_field: str = "prompt",
        reference_field: str = "answer",
        system: str | None = None,
        agent: str = "policy",
        defer_scoring: bool = False,
        on_error: Literal["raise", "skip"] = "raise",
        max_skip_fraction: float = 0.1,
    ):
        # the functions first: a typo in an import string costs no manifest read
        self.functions = load_reward_functions(reward_funcs, reward_weights)
        self.required_fields = {prompt_field: str}
        self.prompt_field, self.reference_field = prompt_field, reference_field
        self.system, self.agent = system, agent
        super().__init__(
            manifest=manifest, items=items, defer_scoring=defer_scoring, on_error=on_error,
            max_skip_fraction=max_skip_fraction,
        )

    def begin(self, episode: Episode) -> dict[str, Any]:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": episode.item[self.prompt_field]})
        return self.observation(self.agent, messages)

    def advance(self, episode: Episode, action: str) -> None:
        self.record(episode, self.agent, "answer", action)
        return None

    def demonstrations(self, item: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """The reference answer as the SFT target; none for a row without one."""
        if item.get(self.reference_field) is None:
            return []
        return [(self.begin(Episode(item=dict(item))), str(item[self.reference_field]))]

    def score(self, episodes: Sequence[Episode]) -> list[Score]:
        if not episodes:
            return []
        prompts = [str(e.item[self.prompt_field]) for e in episodes]
        completions = [e.actions[-1].text if e.actions else "" for e in episodes]
        names = sorted({k for e in episodes for k in e.item if not k.startswith("_") and k != self.prompt_field})
        columns = {k: [e.item.get(k) for e in episodes] for k in names}
        components: list[dict[str, float]] = [{} for _ in episodes]
        for function in self.functions:
            values = function(prompts, completions, columns, episodes)
            for row, value in zip(components, values):
                if value is not None:
                    row[function.name] = value
        scores = []
        for row in components:
            reward = sum(f.weight * row[f.name] for f in self.functions if f.name in row)
            scores.append(Score(float(reward), row, [float(reward)]))
        return scores


class WeightedFunction:
    """One reward function, its weight, its component name and the columns it takes."""

    def __init__(self, function: RewardFunction, weight: float, where: str):
        self.function, self.weight, self.where = function, float(weight), where
        self.name = getattr(function, "__name__", type(function).__name__)
        parameters = list(inspect.signature(function).parameters.values())
        self.all_columns = any(p.kind is p.VAR_KEYWORD for p in parameters)
        named = [p for p in parameters[2:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.columns = {p.name for p in named}
        self.required = sorted(p.name for p in named if p.default is p.empty)

    def __call__(self, prompts: list[str], completions: list[str], columns: dict[str, list], episodes) -> list:
        missing = [k for k in self.required if k not in columns]
        if missing:
            raise ValueError(f"reward function {self.where}: takes the column(s) {missing}, which no row of the "
                             f"batch has (columns: {sorted(columns)})")
        given = columns if self.all_columns else {k: v for k, v in columns.items() if k in self.columns}
        values = list(self.function(prompts, completions, **given))
        if len(values) != len(completions):
            raise ValueError(f"reward function {self.where}: returned {len(values)} values for "
                             f"{len(completions)} completions")
        for value, episode in zip(values, episodes):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"reward function {self.where}: returned {value!r} for the row at "
                                 f"{episode.item.get('_where', episode.item.get('id'))}; expected a finite "
                                 f"number or None")
        return [None if v is None else float(v) for v in values]


def load_reward_functions(
    specs: Sequence[str | RewardFunction], weights: Sequence[float] | None
) -> list[WeightedFunction]:
    """Import each function (``module:name``) and pair it with its weight; refuse, by name, an import
    string that does not resolve, a weight list of the wrong length and two functions of one name."""
    if isinstance(specs, (str, bytes)) or callable(specs):
        specs = [specs]
    if not specs:
        raise ConfigError("reward_funcs: give at least one reward function ('my_pkg.rewards:exact_match')")
    weights = [1.0] * len(specs) if weights is None else list(weights)
    if len(weights) != len(specs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(specs)} reward_funcs; give one each")
    functions = []
    for index, (spec, weight) in enumerate(zip(specs, weights)):
        where = f"reward_funcs[{index}] ({spec!r})" if isinstance(spec, str) else f"reward_funcs[{index}]"
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"reward_weights[{index}] must be a finite number, got {weight!r}")
        function = import_function(spec, where) if isinstance(spec, str) else spec
        if not callable(function):
            raise ConfigError(f"{where}: not callable (a {type(function).__name__})")
        functions.append(WeightedFunction(function, weight, where))
    names = [f.name for f in functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"reward_funcs: two functions are named {twice}; each names a logged component")
    return functions


def import_function(spec: str, where: str) -> Any:
    """``module:attribute`` → the attribute, or a ``ConfigError`` naming the part that is wrong."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(f"{where}: not an import string 'module:function' (e.g. 'my_pkg.rewards:exact_match')")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not module_name.startswith(err.name):
            raise  # the module exists but its own import fails: its traceback says why
        raise ConfigError(f"{where}: no module {module_name!r} ({err}); is it installed or on PYTHONPATH?") from None
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            public = [n for n in dir(value) if not n.startswith("_") and callable(getattr(value, n))]
            close = difflib.get_close_matches(part, public, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(f"{where}: {module_name!r} has no attribute {part!r}{hint}")
        value = getattr(value, part)
    return value


# --- reward functions of general use --------------------------------------------------------------
def _normal(text: Any) -> str:
    return " ".join(str(text).lower().split()).strip(" .!?")


def exact_match(
    prompts: list[str], completions: list[str], answer: list[Any] | None = None, **_: Any
) -> list[float | None]:
    """1 where the completion equals the row's ``answer`` (case and spacing ignored); None without one."""
    answers = answer if answer is not None else [None] * len(completions)
    return [None if a is None else float(_normal(c) == _normal(a)) for c, a in zip(completions, answers)]


def contains_answer(
    prompts: list[str], completions: list[str], answer: list[Any] | None = None, **_: Any
) -> list[float | None]:
    """1 where the row's ``answer`` appears in the completion (case and spacing ignored); None without one."""
    answers = answer if answer is not None else [None] * len(completions)
    return [None if a is None else float(_normal(a) in _normal(c)) for c, a in zip(completions, answers)]
