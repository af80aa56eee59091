"""LOOP-GRPO credit assignment (ACE-Cap, "LOOP-GRPO", Eq. 7-23) as pure functions.

Order of use in a Composer phase, top to bottom as in the paper:

1. ``evidence_states(c0, qa)`` -> ser(E_g) and every ser(E_g^{-t}) (Eq. 7, 8, 10, 11); the
   environment scores them with the G2P reward R_G (Eq. 3) in one batched judge call.
2. ``composer_utilities(r0, r_E, r_E_minus, r_F, stopped, config)`` -> raw utilities u^Q_t, u^S,
   u^F and the base b (Eq. 12, 14, 15, 16).
3. ``normalize_by_type(utilities, kinds, groups, eps)`` -> A(xi) within each (group, kind) set
   Xi_tau (Eq. 17). With one kind per group this *is* plain GRPO (READ Eq. 1), so the Captioner
   (Eq. 22) and Instruct (Eq. 23, group = one replayed prompt) use the same function.
4. ``token_advantages`` (Eq. 18) when several spans share one token row; ``loop_loss`` (Eq. 19-21).

Nothing here touches a model: scores come in as floats, log-probs as tensors.

Departures from the paper, and why:

- ser(E) (Eq. 10) is only specified as "deterministic concatenation ... in interaction order with
  role delimiters; questions marked non-assertive". The concrete format is ours (see
  :func:`serialize_evidence`): a one-line preamble telling the caption-only judge what counts as
  evidence, then one labelled line per item. Whitespace inside each item is collapsed to single
  spaces so that an item can never forge a role line of its own. The zero-question state is
  serialised in the same labelled format (not as bare c0), so that the format's effect on the
  judge cancels in every leave-one-out difference of Eq. 12.
- ser(E^{-t}) is ser of the shortened sequence (Eq. 8 removes the pair; nothing remembers where it
  was), so two identical QA pairs give identical leave-one-out strings.
- Eq. 17 does not say which standard deviation; we use the population std (divide by |Xi_tau|),
  the one that makes a two-element set map to +-1. A set with one element, or whose utilities are
  all equal, gets exactly zero advantage: the formula gives ~0 there too, but float noise in
  u - mu divided by eps_norm could otherwise turn into a spurious O(1e-10 / 1e-6) signal.
  ``None`` utilities (actions not trained in this phase) are left out of the statistics and get 0.
- Eq. 21 leaves the KL estimator open; we use k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased,
  non-negative), averaged over the same mask M as the policy term.
- The paper does not define a clip fraction (it is a log, not part of the objective). Ours counts
  the masked tokens whose gradient clipping removes: rho > 1 + eps with A > 0, or rho < 1 - eps
  with A < 0 (the min in Eq. 21 picks the clipped branch there). Tokens with A = 0 never count.
- Masked positions are removed with ``torch.where`` before ``exp`` so padding carrying -inf or NaN
  log-probs cannot poison the loss or its gradient; M * NaN would.
- ``loop_loss`` takes an optional ``token_count``: Eq. 21 divides by sum M over the whole batch,
  so under gradient accumulation the caller passes that global count to every micro-batch.
- The paper gives no values for c_Q, c_S, lambda, eps_norm, eps_clip or beta; see
  :class:`LoopConfig` for our defaults and why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentcap.algorithms.grpo import clipped_objective, token_weights

__all__ = [
    "EVIDENCE_PREAMBLE",
    "ComposerUtilities",
    "LoopConfig",
    "captioner_utility",
    "composer_utilities",
    "evidence_states",
    "instruct_utilities",
    "loop_loss",
    "normalize_by_type",
    "sequential_differences",
    "serialize_evidence",
    "token_advantages",
]

# --------------------------------------------------------------------------------------------
# Evidence serialisation, ser(E) of Eq. 7 / 10
# --------------------------------------------------------------------------------------------

EVIDENCE_PREAMBLE = (
    "Evidence about the audio. Only the initial caption and the answers state facts; "
    "the questions were only asked and are not evidence."
)
INITIAL_CAPTION_LABEL = "Initial caption:"
QUESTION_LABEL = "Question asked (not evidence):"
ANSWER_LABEL = "Answer:"

_WHITESPACE = re.compile(r"\s+")


def _one_line(text: str) -> str:
    """Collapse every whitespace run (newlines included) so an item stays on its own line."""
    return _WHITESPACE.sub(" ", text).strip()


def _line(label: str, text: str) -> str:
    body = _one_line(text)
    return f"{label} {body}" if body else label


def serialize_evidence(c0: str, qa: Sequence[tuple[str, str]]) -> str:
    """ser(E) (Eq. 7, 10): the judge input for c0 plus completed QA pairs, in interaction order.

    Format (one item per line, "\\n"-joined, no trailing newline)::

        Evidence about the audio. Only the initial caption and the answers state facts; the questions were only asked and are not evidence.
        Initial caption: <c0>
        Question asked (not evidence): <q_1>
        Answer: <a_1>
        ...

    The question label says "not evidence" on every question line, because a caption-only judge
    would otherwise read "Is there a dog barking far away?" as a claim. The question label does
    not begin with a bare "Question:", which judge prompts use for the MCQ itself. Empty items keep
    their label. Same input, same string.
    """
    if not isinstance(c0, str):
        raise TypeError(f"c0 must be a str (the Captioner's caption), got {type(c0).__name__}")
    lines = [EVIDENCE_PREAMBLE, _line(INITIAL_CAPTION_LABEL, c0)]
    for t, pair in enumerate(qa):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            raise TypeError(f"qa[{t}] must be a (question, answer) pair of str, got {pair!r}")
        question, answer = pair
        lines.append(_line(QUESTION_LABEL, question))
        lines.append(_line(ANSWER_LABEL, answer))
    return "\n".join(lines)


def evidence_states(c0: str, qa: Sequence[tuple[str, str]]) -> tuple[str, list[str]]:
    """ser(E_g) and [ser(E_g^{-t}) for t = 1..T_g] (Eq. 8, 11): the T_g + 1 texts the judge scores.

    Leave-one-out states may repeat (identical QA pairs); deduplicate before the judge call if
    judge calls are expensive.
    """
    pairs = list(qa)
    full = serialize_evidence(c0, pairs)
    minus = [serialize_evidence(c0, pairs[:t] + pairs[t + 1 :]) for t in range(len(pairs))]
    return full, minus


# --------------------------------------------------------------------------------------------
# Raw utilities, Eq. 12-16, 22, 23
# --------------------------------------------------------------------------------------------


@dataclass
class LoopConfig:
    """LOOP-GRPO constants. The paper only states c_Q, c_S, lambda >= 0 and gives no values.

    question_cost: c_Q of Eq. 12. 0.0, neutral. Note it is a constant shift of every question
        utility, so per-type normalisation (Eq. 17) cancels it: it changes logged raw utilities,
        not advantages.
    stop_cost: c_S of Eq. 15, charged per question asked (c_S * T_g). 0.0, neutral: no length
        pressure unless the recipe asks for it; unlike c_Q it does change stop advantages because
        T_g differs across rollouts.
    preserve_weight: lambda of Eq. 14. 1.0 weighs improvement over c0 and the evidence-preservation
        bottleneck equally.
    eps_norm: epsilon_norm of Eq. 17, a guard against tiny sigma; 1e-6 is far below the G2P
        reward's resolution (1/L with L questions, steps of 0.5/L).
    """

    question_cost: float = 0.0
    stop_cost: float = 0.0
    preserve_weight: float = 1.0
    eps_norm: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("question_cost", "stop_cost", "preserve_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"LoopConfig.{name} must be finite and >= 0 (ACE-Cap Eq. 12-15), got {value}")
        if not (math.isfinite(self.eps_norm) and self.eps_norm > 0):
            raise ValueError(f"LoopConfig.eps_norm must be finite and > 0 (ACE-Cap Eq. 17), got {self.eps_norm}")


@dataclass
class ComposerUtilities:
    """Raw Composer utilities of one rollout g: u^Q_{g,t} per question, u^S_g, u^F_g and b_g.

    ``stop`` is None under forced finalisation (budget K reached): there is no READY span to train.
    """

    questions: list[float]  # u^Q_{g,t}, t = 1..T_g (Eq. 12)
    stop: float | None  # u^S_g (Eq. 15)
    final: float  # u^F_g (Eq. 16)
    base: float  # b_g (Eq. 14)


def composer_utilities(
    r0: float,
    r_E: float,
    r_E_minus: Sequence[float],
    r_F: float,
    stopped: bool,
    config: LoopConfig,
) -> ComposerUtilities:
    """Eq. 12, 14, 15, 16 from the three score types of Eq. 10 and the leave-one-out scores (Eq. 11).

    r0 = R_G(c0), r_E = R_G(ser(E_g)), r_E_minus[t] = R_G(ser(E_g^{-t})), r_F = R_G(c^F_g);
    ``stopped`` is True when the Composer sampled READY, False when the scheduler forced
    finalisation at T_g = K (then Eq. 15 is omitted). T_g = len(r_E_minus).
    """
    questions = [float(r_E) - float(r) - config.question_cost for r in r_E_minus]  # Eq. 12
    base = (float(r_F) - float(r0)) + config.preserve_weight * (min(float(r_E), float(r_F)) - float(r0))  # Eq. 14
    stop = base - config.stop_cost * len(questions) if stopped else None  # Eq. 15
    return ComposerUtilities(questions=questions, stop=stop, final=base, base=base)  # Eq. 16: u^F = b


def captioner_utility(r0: float) -> float:
    """u^Cap = R_G(c0) (Eq. 22): Captioner GRPO rewards the initial caption directly."""
    return float(r0)


def instruct_utilities(r_before: float, r_after: Sequence[float]) -> list[float]:
    """u^I_g = R_G(y^+_g) - R_G(y^-) (Eq. 23) for the G answers replayed on one (x, h_t, q_t).

    r_before scores the evidence before the answer, r_after[g] the same evidence with answer g.
    r_before is shared by the group, so Eq. 17 cancels it; it keeps the raw utility meaningful
    (gain in R_G) for logging.
    """
    return [float(r) - float(r_before) for r in r_after]


def sequential_differences(prefix_scores: Sequence[float]) -> list[float]:
    """d_{g,t} = R_G(ser(E_{g,t})) - R_G(ser(E_{g,t-1})) (Eq. 13), for comparison logs only.

    prefix_scores[t] scores the prefix after t turns (prefix_scores[0] = ser of c0 alone, build
    with ``serialize_evidence(c0, qa[:t])``), so T_g + 1 scores give T_g differences. LOOP-GRPO
    does not train on these: the paper argues they give early questions first-mover credit.
    """
    scores = [float(s) for s in prefix_scores]
    if not scores:
        raise ValueError("prefix_scores needs at least the score of ser(E_{g,0}) (c0 alone)")
    return [b - a for a, b in zip(scores[:-1], scores[1:])]


# --------------------------------------------------------------------------------------------
# Advantages, Eq. 17 (= READ Eq. 1 with one kind) and Eq. 18
# --------------------------------------------------------------------------------------------


def normalize_by_type(
    utilities: Sequence[float | None],
    kinds: Sequence[str],
    groups: Sequence[Hashable],
    eps: float,
) -> Tensor:
    """A(xi) = (u(xi) - mu_tau) / (sigma_tau + eps) within each (group, kind) set Xi_tau (Eq. 17).

    This is the group-relative advantage of plain GRPO (READ Eq. 1) when every action of a group
    has the same kind; LOOP-GRPO pools questions, stops and finals of the G rollouts of one audio
    into separate sets so their scales do not mix. sigma is the population std (the paper does
    not say which). Singleton or constant sets give 0, None gives 0 and is not counted. To split
    by agent as well, fold it into ``kinds`` or ``groups``. Returns float64 [N].
    """
    n = len(utilities)
    if len(kinds) != n or len(groups) != n:
        raise ValueError(
            f"utilities, kinds and groups must have one entry per action, got {n}, {len(kinds)}, {len(groups)}"
        )
    advantages = torch.zeros(n, dtype=torch.float64)  # [N]
    sets: dict[tuple[Hashable, str], list[int]] = {}
    for i, (u, kind, group) in enumerate(zip(utilities, kinds, groups)):
        if u is None:
            continue
        if not math.isfinite(float(u)):
            raise ValueError(f"utilities[{i}] (group {group!r}, kind {kind!r}) is not finite: {u}")
        sets.setdefault((group, kind), []).append(i)
    for index in sets.values():
        u = torch.tensor([float(utilities[i]) for i in index], dtype=torch.float64)  # [|Xi_tau|]
        if len(index) < 2 or bool(u.max() == u.min()):
            continue  # no relative signal: exactly zero, never NaN
        mu = u.mean()
        sigma = u.std(unbiased=False)
        advantages[index] = (u - mu) / (sigma + eps)
    return advantages


def token_advantages(span_lengths: Sequence[int], span_advantages: Sequence[float]) -> Tensor:
    """A^tok (Eq. 18) for one packed token row: every token of span i gets span_advantages[i].

    Give non-trained segments (prompts, Instruct answers, scheduler text) their own span with
    advantage 0 and mask them out in M; a forced finalisation simply has no stop span (or one of
    length 0). When each span is its own row (context + one span), pass the [N] span advantages
    to :func:`loop_loss` directly instead; it broadcasts them. Returns float64 [sum(span_lengths)].
    """
    if len(span_lengths) != len(span_advantages):
        raise ValueError(f"{len(span_lengths)} span lengths but {len(span_advantages)} span advantages")
    if any(int(length) < 0 for length in span_lengths):
        raise ValueError(f"span lengths must be >= 0, got {list(span_lengths)}")
    lengths = torch.tensor([int(length) for length in span_lengths], dtype=torch.long)
    values = torch.tensor([float(a) for a in span_advantages], dtype=torch.float64)
    return torch.repeat_interleave(values, lengths)  # [K]


# --------------------------------------------------------------------------------------------
# Clipped objective with KL, Eq. 19-21
# --------------------------------------------------------------------------------------------


def loop_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_clip: float,
    beta: float = 0.0,
    ref_logprobs: Tensor | None = None,
    token_count: float | Tensor | None = None,
) -> dict[str, Tensor]:
    """L_LOOP (Eq. 21): clipped policy term with token advantages plus beta x masked-mean KL.

    logprobs, old_logprobs, ref_logprobs, mask: [N, T] (mask bool or 0/1); advantages: [N, T]
    token advantages (Eq. 18) or [N], one per row, broadcast over its tokens. The sum over tokens
    is divided by sum M (``token_count`` overrides it, e.g. the whole batch's count when it is split
    into micro-batches). Returns "loss" (with grad), and detached "pg_loss", "kl", "clipfrac",
    "ratio_mean" for logging.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask"
            f" {tuple(mask.shape)} must have the same [N, T] shape"
        )
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logprobs from the frozen reference policy")
    if eps_clip <= 0:
        raise ValueError(f"eps_clip must be > 0, got {eps_clip}")
    count = float(mask.sum()) if token_count is None else float(token_count)
    # Eq. 19-21 are GRPO's clipped objective with span-aligned advantages: one implementation
    out = clipped_objective(
        logprobs, old_logprobs, advantages, mask, clip_eps=eps_clip, beta=beta, ref_logprobs=ref_logprobs,
        weights=token_weights(mask, normalizer=max(count, 1.0)),
    )
    local = max(float(mask.sum()), 1.0) / max(count, 1.0)  # clipfrac / ratio are per given token
    return {
        "loss": out["loss"],
        "pg_loss": out["pg_loss"],
        "kl": out["kl"],
        "clipfrac": out["clipfrac"] / local,
        "ratio_mean": out["ratio"] / local,
    }
