"""READ's per-sample rewards (READ §3.2–3.3): accuracy, format, length, anti-copy mask, coherence.

These are the functional forms: each takes a batch and returns one float64 value per response, which
is what the group-relative advantages need; :func:`agentcap.rewards.read.read_rewards` combines
them into READ's reward (Eq. 6).

Choices the paper leaves open, made here:

- ROUGE (Eq. 3) is ``rouge_score``'s definition with ``use_stemmer=False``: its default, what the
  ``rouge_score``-based GRPO reward of Feng et al. uses, and stemming would reward a wrong verb form
  ("opens" vs "opened") that AD references care about. F1 (``fmeasure``) of ROUGE-1/2/L is averaged.
  The scorer is ``rouge-score-rs`` (a Rust reimplementation, identical scores, tens of times faster,
  batched) where it is installed, else ``rouge_score`` itself; the tests compare the two.
- The AD is the text of the *last* ``<answer>…</answer>`` block; a response without one, or with an
  empty one, earns 0 accuracy and 0 length reward (an empty description is never length-compatible).
- Eq. 5 gates on ``R_acc >= tau`` (the equation's ``≥``; the prose says "exceeds").
- Rank ties (Eq. 5) use competition ranking: ``rank(s_i) = 1 + #{j eligible in the group: s_j > s_i}``,
  so equal scores share the better rank's level and the next distinct score skips the tied places.
  This is independent of the order of the rollouts, and more than ``k`` responses can be rewarded
  only when they tie exactly.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence

import torch
from rouge_score import rouge_scorer

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Tag content may not itself contain a think/answer tag, so "<think>a</think><answer>b</answer>
# <answer>c</answer>" or a nested tag is not the required structure.
_NO_TAG = r"(?:(?!</?(?:think|answer)>).)*"
_FORMAT = re.compile(rf"\s*<think>{_NO_TAG}</think>\s*<answer>({_NO_TAG})</answer>\s*", re.DOTALL)


def extract_answer(response: str) -> str | None:
    """The stripped text of the last ``<answer>…</answer>`` block; ``None`` when there is none."""
    matches = _ANSWER.findall(response)
    if not matches:
        return None
    return matches[-1].strip()


@functools.lru_cache(maxsize=1)
def read_rouge_scorer() -> rouge_scorer.RougeScorer:
    """The ROUGE-1/2/L scorer of Eq. 3, built once (tokenisation is lower-cased, no stemming):
    ``rouge-score-rs``'s where it installs, else ``rouge_score``'s."""
    try:
        from rouge_score_rs import rouge_scorer as fast
    except ImportError:
        return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    return fast.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)


def _check_pairs(responses: Sequence[str], references: Sequence[str]) -> None:
    if isinstance(responses, str) or isinstance(references, str):
        raise TypeError("responses and references must be sequences of strings, not a single string")
    if len(responses) != len(references):
        raise ValueError(f"got {len(responses)} responses but {len(references)} references")
    for i, reference in enumerate(references):
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError(f"reference {i} is empty ({reference!r}): every response needs a gold AD")


def accuracy_reward(
    responses: Sequence[str],
    references: Sequence[str],
    scorer: rouge_scorer.RougeScorer | None = None,
) -> torch.Tensor:
    """R_acc (Eq. 3): mean of ROUGE-1, ROUGE-2 and ROUGE-L F1 between the answer and the gold AD. [N]"""
    _check_pairs(responses, references)
    scorer = scorer or read_rouge_scorer()
    values = [0.0] * len(responses)
    answers = [extract_answer(r) for r in responses]
    scored = [i for i, a in enumerate(answers) if a]
    pairs = [references[i] for i in scored], [answers[i] for i in scored]  # rouge_score's order: (target, prediction)
    if hasattr(scorer, "score_batch"):
        results = scorer.score_batch(*pairs)
    else:
        results = [scorer.score(t, p) for t, p in zip(*pairs)]
    for i, scores in zip(scored, results):
        values[i] = (scores["rouge1"].fmeasure + scores["rouge2"].fmeasure + scores["rougeL"].fmeasure) / 3
    return torch.tensor(values, dtype=torch.float64)


def format_reward(responses: Sequence[str]) -> torch.Tensor:
    """R_fmt: 1 iff the response is ``<think>…</think>`` then a non-empty ``<answer>…</answer>``. [N]"""
    if isinstance(responses, str):
        raise TypeError("responses must be a sequence of strings, not a single string")
    values = []
    for response in responses:
        match = _FORMAT.fullmatch(response)
        values.append(1.0 if match is not None and match.group(1).strip() else 0.0)
    return torch.tensor(values, dtype=torch.float64)


def length_window_reward(responses: Sequence[str], references: Sequence[str], tolerance: int = 4) -> torch.Tensor:
    """R_len: 1 iff |wc(answer) − wc(gold)| ≤ Λ (``tolerance``), wc = whitespace word count. [N]"""
    _check_pairs(responses, references)
    if tolerance < 0:
        raise ValueError(f"tolerance (Λ) must be >= 0, got {tolerance}")
    values = []
    for response, reference in zip(responses, references):
        answer = extract_answer(response)
        ok = bool(answer) and abs(len(answer.split()) - len(reference.split())) <= tolerance
        values.append(1.0 if ok else 0.0)
    return torch.tensor(values, dtype=torch.float64)


def coherence_reward(
    scores: torch.Tensor,
    accuracies: torch.Tensor,
    groups: Sequence[int],
    tau: float = 0.12,
    top_k: int = 2,
    levels: Sequence[float] = (1.0, 0.5),
) -> torch.Tensor:
    """R_coh (Eq. 5): rank level λ_rank for the top-k eligible responses of each group, else 0. [N]

    ``scores`` are the coherence scores s_i of Eq. 4, NaN for a response that cannot be scored (no
    context, empty or fully masked answer); a response is eligible when its s_i is finite and its
    accuracy is ≥ ``tau``. Ranking is within ``groups`` (the G rollouts of one item), descending,
    with competition ranking for ties (see module docstring). ``levels[r - 1]`` is λ_r.
    """
    scores = torch.as_tensor(scores, dtype=torch.float64).detach().cpu().flatten()
    accuracies = torch.as_tensor(accuracies, dtype=torch.float64).detach().cpu().flatten()
    if not (len(scores) == len(accuracies) == len(groups)):
        raise ValueError(
            f"scores ({len(scores)}), accuracies ({len(accuracies)}) and groups ({len(groups)}) must have one"
            " entry per response"
        )
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if len(levels) < top_k:
        raise ValueError(f"levels {tuple(levels)} must give a reward level for each of the top_k={top_k} ranks")
    rewards = torch.zeros(len(scores), dtype=torch.float64)
    eligible = [
        i for i in range(len(scores)) if math.isfinite(float(scores[i])) and float(accuracies[i]) >= tau
    ]
    by_group: dict[int, list[int]] = {}
    for i in eligible:
        by_group.setdefault(int(groups[i]), []).append(i)
    for members in by_group.values():
        for i in members:
            rank = 1 + sum(1 for j in members if float(scores[j]) > float(scores[i]))
            if rank <= top_k:
                rewards[i] = float(levels[rank - 1])
    return rewards
