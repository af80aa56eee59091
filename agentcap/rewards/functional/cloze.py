"""Per-sample evidence, temporal and length rewards (AudioMap Eq. 3, 5, 7; ACE-Cap Eq. 2–3).

Each function returns a [N] tensor, one reward per caption, which feeds the advantages. The model
calls are batched across the whole batch: every (caption, question) pair goes to the examiner in
one call and every (caption, event) pair to the temporal examiner in one call, so an LLM examiner
runs one forward pass per batch of queries, and identical queries (the G rollouts of an item often
repeat a caption) are asked once.

Departures from the paper: AudioMap does not define R_len. :func:`length_ramp_reward` is our choice,
documented there. :func:`event_count_reward` is ours too: AudioMap's rewards ask only about the clip's
own events, so nothing in them costs a caption an event the clip lacks (docs/real.md measures GRPO
buying cloze answers that way).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentcap.judges.examiner import Examiner
from agentcap.judges.questions import LETTERS, Question
from agentcap.judges.replies import TooManyInvalidReplies
from agentcap.judges.temporal import TemporalExaminer, parse_intervals

#: AudioMap's r_pos, r_abs, r_neg (Eq. 3); ACE-Cap Eq. 2 uses the same 1 / −0.5 / −1.
DEFAULT_SCORES = {"r_pos": 1.0, "r_abs": -0.5, "r_neg": -1.0}


def answer_scores(
    predicted: Sequence[str | None],
    gold: Sequence[str],
    r_pos: float = 1.0,
    r_abs: float = -0.5,
    r_neg: float = -1.0,
) -> torch.Tensor:
    """Per-question score r_k (AudioMap Eq. 3, ACE-Cap Eq. 2): gold → r_pos, E → r_abs, else r_neg;
    NaN for None (an invalid examiner reply, never read as an answer: callers leave it out of means)."""
    if not r_neg < r_abs <= 0 < r_pos:
        raise ValueError(
            f"scores must satisfy r_neg < r_abs <= 0 < r_pos (AudioMap Eq. 3), "
            f"got r_pos={r_pos}, r_abs={r_abs}, r_neg={r_neg}"
        )
    if len(predicted) != len(gold):
        raise ValueError(f"got {len(predicted)} predicted answers but {len(gold)} gold answers")
    scores = []
    for k, (answer, truth) in enumerate(zip(predicted, gold)):
        if answer is None:  # the examiner's reply was invalid (agentcap.judges.replies): no score, NaN
            scores.append(float("nan"))
            continue
        if answer not in LETTERS:
            raise ValueError(f"predicted answer {k} must be one of A–E, got {answer!r}")
        if truth not in LETTERS[:4]:
            raise ValueError(f"gold answer {k} must be one of A–D (E is 'Not given'), got {truth!r}")
        scores.append(r_pos if answer == truth else r_abs if answer == "E" else r_neg)
    return torch.tensor(scores, dtype=torch.float64)


def evidence_sufficiency(
    captions: Sequence[str],
    banks: Sequence[Sequence[Question]],
    examiner: Examiner,
    **scores: float,
) -> torch.Tensor:
    """R_ESR per caption: the mean of Eq. 3's r_k over that caption's cloze bank (AudioMap).

    ``banks[i]`` is the bank of caption i; ``scores`` are ``r_pos`` / ``r_abs`` / ``r_neg``.
    All pairs of the batch go to ``examiner`` in one call; repeated (caption, question) pairs are
    sent once.
    """
    unknown = set(scores) - set(DEFAULT_SCORES)
    if unknown:
        raise TypeError(f"unknown score names {sorted(unknown)}; expected some of {sorted(DEFAULT_SCORES)}")
    if len(captions) != len(banks):
        raise ValueError(f"got {len(captions)} captions but {len(banks)} question banks")
    pairs: dict[tuple[str, Question], int] = {}
    rows: list[list[int]] = []
    for i, (caption, bank) in enumerate(zip(captions, banks)):
        if len(bank) == 0:
            raise ValueError(f"question bank {i} is empty: R_ESR is a mean over the bank and needs >= 1 question")
        for k, question in enumerate(bank):
            if not isinstance(question, Question):
                raise TypeError(f"bank {i}, question {k}: expected a Question, got {type(question).__name__}")
        rows.append([pairs.setdefault((caption, q), len(pairs)) for q in bank])
    unique = list(pairs)
    predicted = examiner.answer([c for c, _ in unique], [q for _, q in unique])
    if len(predicted) != len(unique):
        raise RuntimeError(f"examiner returned {len(predicted)} answers for {len(unique)} questions")
    per_pair = answer_scores(predicted, [q.answer for _, q in unique], **scores)
    if not rows:  # no captions (the examiner was still asked: a sharded one takes part in every call)
        return per_pair.new_zeros(0)
    return torch.stack([valid_mean(per_pair[torch.tensor(row)], f"caption {i}") for i, row in enumerate(rows)])


def valid_mean(scores: torch.Tensor, what: str) -> torch.Tensor:
    """The mean of a caption's question scores, those of invalid examiner replies (NaN) left out; a
    caption none of whose questions got a valid answer stops the run (nothing to reward it with)."""
    valid = ~scores.isnan()
    if bool(valid.all()):
        return scores.mean()
    if not bool(valid.any()):
        raise TooManyInvalidReplies(f"the examiner gave no valid answer to any of {what}'s {scores.numel()} "
                                    "questions (invalid replies; agentcap.judges.replies)")
    return scores[valid].mean()


#: ACE-Cap's name for the same computation: R_G(y), the mean of Eq. 2 over the bank (Eq. 3).
gold_to_prediction = evidence_sufficiency


def temporal_iou(pred: tuple[float, float] | None, gold: tuple[float, float]) -> float:
    """r_{t,m} of AudioMap Eq. 5: I/U of the two intervals; null or U <= 0 gives 0."""
    start, end = gold
    if end < start:
        raise ValueError(f"gold interval must have start <= end, got {tuple(gold)}")
    if pred is None:
        return 0.0
    p_start, p_end = pred
    if p_end < p_start:
        raise ValueError(f"predicted interval must have start <= end, got {tuple(pred)}")
    inter = max(0.0, min(end, p_end) - max(start, p_start))
    union = (end - start) + (p_end - p_start) - inter
    return 0.0 if union <= 0 else inter / union


def anchor_problem(anchor: Any) -> str | None:
    """Why ``anchor`` is not an ECTR anchor ``{"event": str, "start": s, "end": e}`` with 0 ≤ s ≤ e
    (AudioMap Eq. 4–5), or None when it is one. Shared by the reward and the manifest check."""
    if not isinstance(anchor, Mapping):
        return f"an anchor must be an object with event, start, end; got {anchor!r}"
    for name in ("event", "start", "end"):
        if name not in anchor:
            return f"missing field {name!r} (has {sorted(anchor)})"
    event, start, end = anchor["event"], anchor["start"], anchor["end"]
    if not isinstance(event, str) or not event.strip():
        return f"field 'event' must be a non-empty string, got {event!r}"
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"field {name!r} must be a number of seconds, got {value!r}"
    if not 0 <= start <= end:
        return f"fields 'start'/'end' need 0 ≤ start ≤ end, got start={start!r}, end={end!r}"
    return None


def _anchor(anchor: Mapping[str, Any], i: int, m: int) -> tuple[str, tuple[float, float]]:
    problem = anchor_problem(anchor)
    if problem is not None:
        raise ValueError(f"caption {i}, anchor {m}: {problem}")
    return anchor["event"], (float(anchor["start"]), float(anchor["end"]))


def event_temporal_reward(
    captions: Sequence[str],
    anchors_per_caption: Sequence[Sequence[Mapping[str, Any]]],
    examiner: TemporalExaminer,
) -> torch.Tensor:
    """R_ECTR per caption: the mean of Eq. 5's tIoU over that caption's event anchors.

    Anchors are ``{"event": str, "start": float, "end": float}``; the examiner sees only the
    caption and the event text (Eq. 4). All pairs go to the examiner in one ``locate`` call.
    """
    if len(captions) != len(anchors_per_caption):
        raise ValueError(f"got {len(captions)} captions but {len(anchors_per_caption)} anchor lists")
    queries: list[tuple[str, str]] = []
    golds: list[tuple[float, float]] = []
    owners: list[int] = []
    for i, (caption, anchors) in enumerate(zip(captions, anchors_per_caption)):
        if len(anchors) == 0:
            raise ValueError(f"anchor list {i} is empty: R_ECTR is a mean over anchors and needs >= 1")
        for m, anchor in enumerate(anchors):
            event, gold = _anchor(anchor, i, m)
            queries.append((caption, event))
            golds.append(gold)
            owners.append(i)
    located = examiner.locate([c for c, _ in queries], [e for _, e in queries])
    if len(located) != len(queries):
        raise RuntimeError(f"temporal examiner returned {len(located)} intervals for {len(queries)} events")
    ious = torch.tensor([temporal_iou(p, g) for p, g in zip(located, golds)], dtype=torch.float64)
    totals = torch.zeros(len(captions), dtype=torch.float64).index_add_(0, torch.tensor(owners, dtype=torch.long), ious)
    counts = torch.tensor([len(a) for a in anchors_per_caption], dtype=torch.float64)
    return totals / counts


def word_count(text: str) -> int:
    return len(text.split())


def length_ramp_reward(captions: Sequence[str], references: Sequence[str], tolerance: float = 0.25) -> torch.Tensor:
    """R_len — our choice, since AudioMap does not define it (a departure, not the paper's formula).

    With d = |wc(y) − wc(ref)| and a = tolerance · wc(ref) (wc = whitespace word count): 1 when
    d <= a, falling linearly to 0 at d = 2a, 0 beyond. A relative band keeps the reward scale-free
    across short and long clips; the linear ramp keeps a gradient-like signal for near misses that
    a hard window (READ's |wc(o) − wc(g)| <= Λ) would not. ``tolerance=0`` rewards exact length only.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if len(captions) != len(references):
        raise ValueError(f"got {len(captions)} captions but {len(references)} references")
    rewards = []
    for i, (caption, reference) in enumerate(zip(captions, references)):
        target = word_count(reference)
        if target == 0:
            raise ValueError(f"reference {i} is empty ({reference!r}); the length reward needs its word count")
        d, band = abs(word_count(caption) - target), tolerance * target
        if d <= band:
            rewards.append(1.0)
        elif band == 0 or d >= 2 * band:
            rewards.append(0.0)
        else:
            rewards.append(1.0 - (d - band) / band)
    return torch.tensor(rewards, dtype=torch.float64)


def event_count_reward(captions: Sequence[str], anchors_per_caption: Sequence[Sequence[Any]]) -> torch.Tensor:
    """R_count — ours, not AudioMap's: min(n, m) / max(n, m), with n the timed clauses of the caption
    (read by the temporal examiners' parser, :func:`agentcap.judges.temporal.parse_intervals`) and m
    the clip's event anchors; 0 for a caption that times nothing.

    ESR and ECTR ask only about events the clip has, so a caption that adds events it lacks loses
    nothing there and may gain (one more name, one more chance at a cloze blank). This term charges
    a missing and an invented event alike, and reads only the caption's times, not its words.
    """
    if len(captions) != len(anchors_per_caption):
        raise ValueError(f"got {len(captions)} captions but {len(anchors_per_caption)} anchor lists")
    rewards = []
    for i, (caption, anchors) in enumerate(zip(captions, anchors_per_caption)):
        if len(anchors) == 0:
            raise ValueError(f"anchor list {i} is empty: R_count compares the caption's events with >= 1 anchor")
        n, m = len(parse_intervals(caption)), len(anchors)
        rewards.append(min(n, m) / max(n, m))
    return torch.tensor(rewards, dtype=torch.float64)


def curriculum_weights(step: int, switch_step: int, esr: float, ectr: float, length: float) -> dict[str, float]:
    """AudioMap Eq. 7: R(1) = λ_ESR·ESR + λ_len·len before ``switch_step``; R(2) adds λ_ECTR·ECTR.

    Returns the weights for :func:`agentcap.rewards.base.weighted_sum` under the component names
    ``"esr"``, ``"ectr"``, ``"length"``; ECTR keeps its key with weight 0 in stage 1, so the same
    components are logged in both stages.
    """
    if step < 0 or switch_step < 0:
        raise ValueError(f"step and switch_step must be >= 0, got step={step}, switch_step={switch_step}")
    return {"esr": float(esr), "ectr": float(ectr) if step >= switch_step else 0.0, "length": float(length)}
