"""Temporal examiners: where does a caption say a named event happens? (AudioMap Eq. 4)

ECTR (AudioMap Eq. 4–5) asks a frozen examiner for the interval a caption associates with one
event description; the caption is the only evidence. Both examiners here share one deterministic
timestamp parser, so a caption's times are read the same way whether a rule or an LLM picks the
clause:

- :class:`RuleTemporalExaminer` picks the clause that shares most content words with the event;
- :class:`LLMTemporalExaminer` asks a causal LM, greedily, and parses its short answer;
  :class:`~agentcap.judges.served.ServedTemporalExaminer` asks the same of a served one.

A point timestamp t becomes [max(0, t − w), t + w] (the paper's half-width w); a missing event or
a clause without a usable timestamp gives ``None`` (null).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from agentcap.agents.pretrained import load_causal_lm
from agentcap.judges.causal_lm import CausalLMJudge
from agentcap.judges.questions import check_pairs, sentences, unique

Interval = tuple[float, float]


class TimedClause(NamedTuple):
    """A clause and the time it states; a point timestamp has ``start == end`` (``is_point``)."""

    text: str
    start: float
    end: float

    @property
    def is_point(self) -> bool:
        return self.start == self.end


# --- the timestamp grammar ------------------------------------------------------------------------
_NUM = r"\d+(?:\.\d+)?"
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?"  # mm:ss, h:mm:ss
_TIME = rf"(?:{_CLOCK}|{_NUM})"
_UNIT = r"(?:(?:s|secs?|seconds?)(?![A-Za-z]))"
_DASH = r"(?:-|–|—|~|to|until|till|through)"
# Ranges before points, so "from 1 to 2 s" is one range, not two points.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("range", re.compile(rf"[\[(]\s*({_TIME})\s*{_UNIT}?\s*{_DASH}\s*({_TIME})\s*{_UNIT}?\s*[\])]", re.I)),
    ("range", re.compile(
        rf"\b(?:from|between)\s+({_TIME})\s*{_UNIT}?\s*(?:{_DASH}|and)\s+({_TIME})(?:\s*{_UNIT})?", re.I)),
    ("range", re.compile(rf"(?<![\w.:])({_CLOCK})\s*{_DASH}\s*({_CLOCK})(?![\w:])", re.I)),
    ("range", re.compile(rf"(?<![\w.:])({_NUM})\s*{_UNIT}?\s*{_DASH}\s*({_NUM})\s*{_UNIT}", re.I)),
    ("point", re.compile(rf"[\[(]\s*({_TIME})\s*{_UNIT}?\s*[\])]", re.I)),
    ("point", re.compile(
        rf"\b(?:at|around|about|near|by|after|before)\s+~?\s*({_TIME})(?:\s*{_UNIT})?(?![\w:])", re.I)),
    ("point", re.compile(rf"(?<![\w.:])({_CLOCK})(?![\w:])", re.I)),
    # a bare "3.2 s" is a time unless it is a duration ("for 2 s", "lasting 2 s")
    ("point", re.compile(rf"(?<!for )(?<!lasting )(?<!lasts )(?<![\w.:])({_NUM})\s*{_UNIT}", re.I)),
]
# Only for reading an examiner's own short answer ("1.0-2.5", "3"), where every number is a time.
_BARE: list[tuple[str, re.Pattern[str]]] = [
    ("range", re.compile(rf"(?<![\w.:])({_TIME})\s*{_DASH}\s*({_TIME})(?![\w:])", re.I)),
    ("point", re.compile(rf"(?<![\w.:])({_TIME})(?![\w:])", re.I)),
]


def _seconds(token: str) -> float:
    if ":" in token:
        total = 0.0
        for part in token.split(":"):
            total = total * 60 + float(part)
        return total
    return float(token)


def _timestamps(text: str, bare_numbers: bool = False) -> list[tuple[int, int, float, float]]:
    """Non-overlapping (char start, char end, t0, t1) matches, in text order."""
    found: list[tuple[int, int, float, float]] = []
    for kind, pattern in _PATTERNS + (_BARE if bare_numbers else []):
        for match in pattern.finditer(text):
            lo, hi = match.span()
            if any(lo < e and s < hi for s, e, _, _ in found):
                continue
            a = _seconds(match.group(1))
            b = _seconds(match.group(2)) if kind == "range" else a
            found.append((lo, hi, min(a, b), max(a, b)))
    return sorted(found)


_CLAUSE_BREAK = re.compile(r"\s*,\s*(?:and|while|but|then)?\s*|\s+(?:and|while|whereas|but|then)\s+", re.I)


def _clauses(text: str, bare_numbers: bool = False) -> list[tuple[str, Interval | None]]:
    """Every clause of ``text`` with the first time it states (or None), in text order.

    A sentence with at most one timestamp is one clause. A sentence with several is cut into pieces
    at commas and conjunctions outside the timestamps, and each piece with a timestamp starts a
    clause: words without a time continue the clause before them (so "From 0.5 s to 1.8 s, a beep
    sounds" stays whole) and leading words without a time join the first timed piece. A piece that
    is only a time and follows a timed clause ("at 1 s and 3 s") becomes a clause with no words,
    which no event can match.
    """
    out: list[tuple[str, Interval | None]] = []
    for sentence in sentences(text):
        stamps = _timestamps(sentence, bare_numbers)
        if len(stamps) <= 1:
            out.append((sentence, (stamps[0][2], stamps[0][3]) if stamps else None))
            continue
        bounds = [0]
        for match in _CLAUSE_BREAK.finditer(sentence):
            if not any(match.start() < e and s < match.end() for s, e, _, _ in stamps):
                bounds += [match.start(), match.end()]
        bounds.append(len(sentence))
        groups: list[list] = []  # [lo, hi, stamps]
        for lo, hi in zip(bounds[::2], bounds[1::2]):
            if lo >= hi:
                continue
            own = [st for st in stamps if lo <= st[0] and st[1] <= hi]
            if groups and not own:
                groups[-1][1] = hi  # words without a time continue the clause before them
            elif groups and not groups[-1][2]:
                groups[-1][1:] = [hi, own]  # leading words without a time join the first timed piece
            else:
                groups.append([lo, hi, own])
        for lo, hi, own in groups:
            interval = (own[0][2], own[0][3]) if own else None
            out.append((sentence[lo:hi].strip(" ,"), interval))
    return out


def parse_intervals(caption: str, bare_numbers: bool = False) -> list[TimedClause]:
    """(clause text, start, end) for each clause of ``caption`` that states a time, in text order.

    Ranges: "From 0.5 s to 1.8 s", "from 1 to 2 seconds", "between 1 and 2 s", "[0.5-1.8]",
    "(0:03–0:07)", "0.5-1.8s", "0:03-0:07". Points (``start == end``): "at 3.2s", "at 0:03",
    "(3.2 s)", "0:03", "3.2 seconds" (but not "for 2 seconds", a duration). A number with neither a
    unit, a clock form, brackets nor a time word is not a time ("three times", "2 dogs") unless
    ``bare_numbers`` — used only to read an examiner's own short answer such as "1.0-2.5".
    """
    return [TimedClause(text, *iv) for text, iv in _clauses(caption, bare_numbers) if iv is not None]


# --- content-word overlap -------------------------------------------------------------------------
_STOP = frozenset(
    "a an the of and or to from at in on with by for is are was were be been being it its this that "
    "these those then while between until till around about near after before into onto over under "
    "s sec secs second seconds time times again also there here which who as than very one".split()
)


def _stem(word: str) -> str:
    """Light plural folding: "beeps" → "beep", "hisses" → "hiss"; enough for event names."""
    if len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def content_words(text: str) -> set[str]:
    """Lower-case stemmed words without stop words: what an anchor shares with a caption clause."""
    return {_stem(w) for w in re.findall(r"[a-z]+", text.lower()) if w not in _STOP}


def widen(interval: Interval, half_width: float) -> Interval:
    """A point t becomes [max(0, t − w), t + w] (AudioMap, under Eq. 4); a range is kept."""
    start, end = interval
    if start == end:
        return (max(0.0, start - half_width), end + half_width)
    return (start, end)


# --- the protocol and the examiners ---------------------------------------------------------------
@runtime_checkable
class TemporalExaminer(Protocol):
    """Interval that caption i states for event i, or None (null); pairwise."""

    def locate(self, captions: Sequence[str], events: Sequence[str]) -> list[Interval | None]: ...


class RuleTemporalExaminer:
    """Deterministic: the clause sharing most content words with the event (ties → earliest).

    No clause sharing a content word, or a best clause without a timestamp → None.
    """

    def __init__(self, half_width: float = 0.5):
        if half_width < 0:
            raise ValueError(f"half_width must be >= 0, got {half_width}")
        self.half_width = half_width

    def locate(self, captions: Sequence[str], events: Sequence[str]) -> list[Interval | None]:
        check_pairs(captions, events, "events")
        return [self.locate_one(c, e) for c, e in zip(captions, events)]

    def locate_one(self, caption: str, event: str, bare_numbers: bool = False) -> Interval | None:
        wanted = content_words(event)
        best, best_overlap = None, 0
        for text, interval in _clauses(caption, bare_numbers):
            overlap = len(wanted & content_words(text))
            if overlap > best_overlap:
                best, best_overlap = interval, overlap
                if best_overlap == len(wanted):
                    break
        return None if best is None else widen(best, self.half_width)


_NULL = re.compile(r"^\W*(?:null|none|n/?a|not (?:given|stated|mentioned))\b", re.I)


def temporal_question(caption: str, event: str) -> str:
    """The examiner's user turn: only the caption and the event description (local and served alike)."""
    return (
        "Using only the caption, give the time interval in seconds of the event, as 'start-end', "
        "or a single time if the caption gives only one, or 'null' if the caption does not say.\n\n"
        f"Caption: {caption}\n\nEvent: {event}"
    )


class AnswerTemporalExaminer:
    """An examiner that answers each (caption, event) pair in a few words, read by one rule.

    Subclasses give ``_answers(pairs) -> texts`` (greedy, at most ``max_new_tokens``); identical pairs
    are asked once. An answer is read by :func:`parse_intervals` (bare numbers allowed there, since
    the answer is only times); "null" gives None; an answer with no parseable time falls back to
    :class:`RuleTemporalExaminer` on the same pair. Points are widened by ±``half_width``.
    """

    def __init__(self, half_width: float = 0.5, max_new_tokens: int = 24):
        self.fallback = RuleTemporalExaminer(half_width)
        self.half_width = half_width
        self.max_new_tokens = max_new_tokens

    def _answers(self, pairs: list[tuple[str, str]]) -> list[str | None]:
        raise NotImplementedError

    def read_answer(self, answer: str | None, caption: str, event: str) -> Interval | None:
        if answer is None:  # an invalid reply (agentcap.judges.replies): the rule's reading, as for no time
            return self.fallback.locate_one(caption, event)
        if _NULL.match(answer):
            return None
        stated = parse_intervals(answer, bare_numbers=True)
        if not stated:
            return self.fallback.locate_one(caption, event)
        return widen((stated[0].start, stated[0].end), self.half_width)

    def locate(self, captions: Sequence[str], events: Sequence[str]) -> list[Interval | None]:
        check_pairs(captions, events, "events")
        distinct, inverse = unique(list(zip(captions, events)))  # none: a sharded judge still takes part
        located = [self.read_answer(a, c, e) for a, (c, e) in zip(self._answers(distinct), distinct)]
        return [located[i] for i in inverse]


class LLMTemporalExaminer(CausalLMJudge, AnswerTemporalExaminer):
    """Asks a local causal LM (:class:`AnswerTemporalExaminer`), greedily, with :func:`temporal_question`."""

    def __init__(self, model, tokenizer, batch_size: int = 32, half_width: float = 0.5, max_new_tokens: int = 24):
        CausalLMJudge.__init__(self, model, tokenizer, batch_size)
        AnswerTemporalExaminer.__init__(self, half_width, max_new_tokens)

    @classmethod
    def from_pretrained(cls, path, gguf_file=None, device="cpu", dtype=None, batch_size: int = 32,
                        half_width: float = 0.5, cache_dir=None) -> "LLMTemporalExaminer":
        model, tokenizer = load_causal_lm(path, gguf_file=gguf_file, device=device, dtype=dtype, cache_dir=cache_dir)
        return cls(model, tokenizer, batch_size=batch_size, half_width=half_width)

    def prompt(self, caption: str, event: str) -> str:
        return self.render(temporal_question(caption, event))

    def _answers(self, pairs: list[tuple[str, str]]) -> list[str]:
        return self.generate([self.prompt(c, e) for c, e in pairs], self.max_new_tokens)
