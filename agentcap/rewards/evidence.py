"""ACE-Cap's raw utilities the environment scores it with (Eq. 7-16, 22, 23).

The environment owns these: it serialises the evidence state ser(E) for the caption-only judge,
scores every state with the G2P reward and turns the scores into one raw utility per action
(``agentcap_envs.evidence_game`` calls the functions below). The algorithm only normalises utilities
into advantages (Eq. 17, ``agentcap.algorithms.loop``) and trains on them (Eq. 19-21,
``agentcap.algorithms.grpo``).

Order of use in a Composer phase:

1. ``evidence_states(c0, qa)`` -> ser(E_g) and every ser(E_g^{-t}) (Eq. 7, 8, 10, 11); the
   environment scores them with the G2P reward R_G (Eq. 3) in one batched judge call.
2. ``composer_utilities(r0, r_E, r_E_minus, r_F, stopped, config)`` -> raw utilities u^Q_t, u^S,
   u^F and the base b (Eq. 12, 14, 15, 16).

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
- The paper gives no values for c_Q, c_S and lambda; see :class:`LoopConfig` for our defaults and
  why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ComposerUtilities",
    "LoopConfig",
    "captioner_utility",
    "composer_utilities",
    "instruct_utility",
    "sequential_differences",
]

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


def instruct_utility(r_before: float, r_after: float) -> float:
    """u^I_g = R_G(y^+_g) - R_G(y^-) (Eq. 23) for answer g replayed on one (x, h_t, q_t).

    r_before scores the evidence before the answer, r_after the same evidence with answer g.
    r_before is shared by the G answers of a replayed prompt, so Eq. 17 cancels it; it keeps the
    raw utility meaningful (gain in R_G) for logging.
    """
    return float(r_after) - float(r_before)


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
