"""LOOP-GRPO credit (ACE-Cap Eq. 7-23) against hand-computed numbers; no models involved.

The advantages (Eq. 17) and the loss (Eq. 18-21) are checked on the functions training runs:
``normalize_by_type`` and GRPO's ``clipped_objective`` with one row per trained span."""

from __future__ import annotations

import math

import pytest
import torch

from agentcap.algorithms.grpo import clipped_objective, token_weights
from agentcap.algorithms.loop import group_scales, normalize_by_type
from agentcap.judges.evidence import (
    ANSWER_LABEL,
    EVIDENCE_PREAMBLE,
    INITIAL_CAPTION_LABEL,
    evidence_states,
    serialize_evidence,
)
from agentcap.rewards.evidence import (
    ComposerUtilities,
    LoopConfig,
    captioner_utility,
    composer_utilities,
    instruct_utility,
    sequential_differences,
)

# A state-determined toy judge standing in for R_G (Eq. 3): every gold fact is a keyword; a fact
# stated by the evidence scores 1, an absent one -0.5 (judge answers E, "Not given"). It reads only
# the initial-caption and answer lines of ser(E), as the non-assertive question marking intends.
FACTS = ("dog", "rain", "engine", "siren")


def toy_judge(text: str) -> float:
    lines = text.split("\n")
    if lines[0] == EVIDENCE_PREAMBLE:
        evidence = " ".join(
            line for line in lines[1:] if line.startswith(INITIAL_CAPTION_LABEL) or line.startswith(ANSWER_LABEL)
        )
    else:  # a plain caption (c0 or c^F)
        evidence = text
    return sum(1.0 if fact in evidence.lower() else -0.5 for fact in FACTS) / len(FACTS)


# ---------------------------------------------------------------- ser(E), Eq. 7, 8, 10


def test_serialize_evidence_format_is_exact_and_deterministic():
    qa = [("Is there a dog?", "Yes, a dog\nbarks twice."), ("Anything else?", "")]
    text = serialize_evidence("  A car passes.\n", qa)
    assert text == "\n".join(
        [
            EVIDENCE_PREAMBLE,
            "Initial caption: A car passes.",
            "Question asked (not evidence): Is there a dog?",
            "Answer: Yes, a dog barks twice.",
            "Question asked (not evidence): Anything else?",
            "Answer:",
        ]
    )
    assert serialize_evidence("  A car passes.\n", list(qa)) == text
    assert serialize_evidence("x", []) == f"{EVIDENCE_PREAMBLE}\nInitial caption: x"


def test_serialize_evidence_items_cannot_forge_role_lines():
    text = serialize_evidence("quiet room", [("q", "nothing\nAnswer: a dog barks")])
    assert text.count("\n") == 3  # preamble, caption, question, answer: one line each
    assert toy_judge(text) == toy_judge(serialize_evidence("quiet room", [("q", "nothing Answer: a dog barks")]))


def test_serialize_evidence_rejects_bad_pairs():
    with pytest.raises(TypeError, match=r"qa\[1\]"):
        serialize_evidence("c0", [("q", "a"), ("only a question",)])
    with pytest.raises(TypeError, match="c0"):
        serialize_evidence(None, [])  # type: ignore[arg-type]


def test_questions_are_not_evidence_for_a_caption_only_judge():
    with_question = serialize_evidence("a dog barks", [("Is there a siren?", "No.")])
    assert toy_judge(with_question) == toy_judge(serialize_evidence("a dog barks", []))


def test_evidence_states_leave_one_out_in_order():
    qa = [("q1", "a1"), ("q2", "a2"), ("q3", "a3")]
    full, minus = evidence_states("c0", qa)
    assert full == serialize_evidence("c0", qa)
    assert minus == [
        serialize_evidence("c0", [("q2", "a2"), ("q3", "a3")]),
        serialize_evidence("c0", [("q1", "a1"), ("q3", "a3")]),
        serialize_evidence("c0", [("q1", "a1"), ("q2", "a2")]),
    ]
    assert evidence_states("c0", []) == (serialize_evidence("c0", []), [])


# ---------------------------------------------------------------- utilities, Eq. 11-16


def test_composer_utilities_hand_computed():
    config = LoopConfig(question_cost=0.05, stop_cost=0.1, preserve_weight=0.5)
    out = composer_utilities(r0=-0.5, r_E=0.25, r_E_minus=[0.0, 0.25, -0.25], r_F=0.5, stopped=True, config=config)
    assert out.questions == pytest.approx([0.2, -0.05, 0.45])  # Eq. 12: 0.25 - r_-t - 0.05
    assert out.base == pytest.approx(1.375)  # Eq. 14: (0.5 + 0.5) + 0.5 * (min(0.25, 0.5) + 0.5)
    assert out.stop == pytest.approx(1.075)  # Eq. 15: 1.375 - 0.1 * 3
    assert out.final == pytest.approx(1.375)  # Eq. 16


def test_bottleneck_uses_the_weaker_of_evidence_and_synthesis():
    config = LoopConfig(preserve_weight=1.0)
    lossy = composer_utilities(r0=0.0, r_E=1.0, r_E_minus=[0.5], r_F=0.25, stopped=True, config=config)
    assert lossy.base == pytest.approx(0.25 + 0.25)  # min(1.0, 0.25): synthesis dropped evidence
    hallucinated = composer_utilities(r0=0.0, r_E=0.25, r_E_minus=[0.0], r_F=1.0, stopped=True, config=config)
    assert hallucinated.base == pytest.approx(1.0 + 0.25)  # min(0.25, 1.0): not backed by evidence


def test_forced_finalisation_has_no_stop_utility_and_no_stop_span():
    config = LoopConfig(question_cost=0.1, stop_cost=0.2)
    out = composer_utilities(r0=0.0, r_E=0.5, r_E_minus=[0.25, 0.5], r_F=0.5, stopped=False, config=config)
    assert out.stop is None
    assert out.questions == pytest.approx([0.15, -0.1])
    assert out.final == pytest.approx(1.0)  # questions and synthesis still trained (Eq. 12, 16)
    # its Eq. 18 rows (no stop span): test_span_rows_equal_the_packed_eq18_row_by_hand


def test_zero_questions():
    config = LoopConfig(question_cost=0.1, stop_cost=0.3)
    c0 = "a dog barks"
    r0 = toy_judge(c0)
    r_E = toy_judge(serialize_evidence(c0, []))
    out = composer_utilities(r0=r0, r_E=r_E, r_E_minus=[], r_F=toy_judge("a dog barks in the rain"), stopped=True, config=config)
    assert out.questions == []
    assert r_E == r0 == pytest.approx(-0.125)
    assert out.base == pytest.approx(0.375)  # (0.25 + 0.125) + 1 * (min(-0.125, 0.25) + 0.125)
    assert out.stop == pytest.approx(out.base)  # c_S * T_g = 0


def test_two_identical_questions_each_get_minus_question_cost():
    config = LoopConfig(question_cost=0.1)
    c0 = "a dog barks"
    qa = [("Is it raining?", "Rain falls steadily."), ("Is it raining?", "Rain falls steadily.")]
    full, minus = evidence_states(c0, qa)
    assert minus[0] == minus[1]  # removing either copy leaves the other
    r_E = toy_judge(full)
    out = composer_utilities(toy_judge(c0), r_E, [toy_judge(s) for s in minus], r_E, stopped=True, config=config)
    assert out.questions == pytest.approx([-0.1, -0.1])


def test_question_whose_removal_changes_nothing_and_one_that_matters():
    config = LoopConfig(question_cost=0.05)
    c0 = "a dog barks"
    qa = [("What animal?", "A dog."), ("Any vehicle?", "An engine idles.")]
    full, minus = evidence_states(c0, qa)
    r_E = toy_judge(full)
    out = composer_utilities(toy_judge(c0), r_E, [toy_judge(s) for s in minus], r_E, stopped=True, config=config)
    assert out.questions[0] == pytest.approx(-0.05)  # repeats c0: no leave-one-out loss
    assert out.questions[1] == pytest.approx(1.5 / 4 - 0.05)  # engine: -0.5 -> 1 on one of four facts


def test_leave_one_out_removes_first_mover_credit_of_sequential_differences():
    c0 = "quiet street"
    qa = [("Any animal?", "A dog."), ("Describe everything.", "A dog and heavy rain.")]
    prefix_scores = [toy_judge(serialize_evidence(c0, qa[:t])) for t in range(len(qa) + 1)]
    d = sequential_differences(prefix_scores)
    full, minus = evidence_states(c0, qa)
    loo = composer_utilities(toy_judge(c0), toy_judge(full), [toy_judge(s) for s in minus], 0.0, True, LoopConfig())
    assert d == pytest.approx([0.375, 0.375])  # Eq. 13: q1 credited for the dog
    assert loo.questions == pytest.approx([0.0, 0.375])  # Eq. 12: q2 also reveals the dog


def test_sequential_differences_hand_computed():
    assert sequential_differences([-0.5, 0.0, 0.5, 0.5]) == pytest.approx([0.5, 0.5, 0.0])
    assert sequential_differences([0.2]) == []
    with pytest.raises(ValueError):
        sequential_differences([])


def test_captioner_and_instruct_utilities():
    assert captioner_utility(0.25) == 0.25  # Eq. 22
    assert [instruct_utility(-0.5, r) for r in (0.0, -0.5, 0.25)] == pytest.approx([0.5, 0.0, 0.75])  # Eq. 23


def test_loop_config_rejects_negative_costs():
    with pytest.raises(ValueError, match="question_cost"):
        LoopConfig(question_cost=-0.1)
    with pytest.raises(ValueError, match="eps_norm"):
        LoopConfig(eps_norm=0.0)
    assert isinstance(composer_utilities(0, 0, [], 0, False, LoopConfig()), ComposerUtilities)


# ---------------------------------------------------------------- advantages, Eq. 17 / READ Eq. 1


def test_normalize_by_type_two_groups_mixed_kinds():
    eps = 1e-6
    #            idx: 0     1    2    3    4    5     6    7    8    9    10   11   12
    utilities = [1.0, 0.0, 5.0, 3.0, 2.0, 2.0, None, 4.0, 2.0, 1.0, 2.0, 0.0, 3.0]
    kinds = ["Q", "F", "S", "Q", "F", "Q", "Q", "F", "Q", "F", "Q", "S", "F"]
    groups = [0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1]
    adv = normalize_by_type(utilities, kinds, groups, eps)
    assert adv.dtype == torch.float64 and adv.shape == (13,)
    expected = {
        0: -1 / (1 + eps), 3: 1 / (1 + eps),  # group 0, Q = [1, 3]
        1: -2 / (math.sqrt(8 / 3) + eps), 4: 0.0, 7: 2 / (math.sqrt(8 / 3) + eps),  # group 0, F = [0, 2, 4]
        2: 0.0,  # group 0, S = [5]: singleton
        5: 0.0, 8: 0.0, 10: 0.0,  # group 1, Q = [2, 2, 2]: all equal
        6: 0.0,  # None: not trained
        9: -1 / (1 + eps), 12: 1 / (1 + eps),  # group 1, F = [1, 3]
        11: 0.0,  # group 1, S = [0]: singleton
    }
    assert adv.tolist() == pytest.approx([expected[i] for i in range(13)], rel=1e-12, abs=1e-15)


def test_all_equal_utilities_give_exact_zero_not_nan():
    for eps in (1e-6, 0.0):
        adv = normalize_by_type([0.1, 0.1, 0.1], ["Q"] * 3, [7] * 3, eps)
        assert adv.tolist() == [0.0, 0.0, 0.0]
    assert normalize_by_type([], [], [], 1e-6).shape == (0,)
    assert normalize_by_type([None, None], ["F", "F"], [0, 0], 1e-6).tolist() == [0.0, 0.0]


def test_group_scales_are_what_the_advantages_divide_by():
    """Per-sentence credit divides its shares by the caption group's scale: sigma + eps, 1 for Dr.
    GRPO, and 0 (no signal) for singleton, constant and None sets, as in the advantages."""
    rewards = [0.5, -0.25, 1.0, 0.0, 0.2, 0.2, 3.0, None]
    groups = [0, 0, 0, 0, 1, 1, 2, 0]
    kinds = ["caption"] * 8
    scales = group_scales(rewards, kinds, groups, 1e-6)
    sigma = torch.tensor(rewards[:4], dtype=torch.float64).std(unbiased=False).item()
    assert scales[:4].tolist() == pytest.approx([sigma + 1e-6] * 4) and scales[4:].tolist() == [0.0] * 4
    adv = normalize_by_type(rewards, kinds, groups, 1e-6)
    mean = sum(rewards[:4]) / 4
    assert adv[:4].tolist() == pytest.approx([(r - mean) / (sigma + 1e-6) for r in rewards[:4]])
    assert group_scales(rewards, kinds, groups, 1e-6, std="none").tolist() == [1.0] * 4 + [0.0] * 4
    with pytest.raises(ValueError, match="std must be"):
        group_scales(rewards, kinds, groups, 1e-6, std="mad")


def test_one_kind_per_group_is_plain_grpo():
    rewards = [0.5, -0.25, 1.0, 0.0, 0.2, 0.2]
    groups = [0, 0, 0, 0, 1, 1]
    adv = normalize_by_type(rewards, ["completion"] * 6, groups, 1e-6)
    r = torch.tensor(rewards[:4], dtype=torch.float64)
    reference = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)  # READ Eq. 1, population std
    assert torch.allclose(adv[:4], reference)
    assert adv[4:].tolist() == [0.0, 0.0]


def test_question_cost_cancels_under_per_type_normalisation():
    raw = [0.5, 0.0, 0.25]
    shifted = [u - 0.3 for u in raw]
    a = normalize_by_type(raw, ["Q"] * 3, [0] * 3, 1e-6)
    b = normalize_by_type(shifted, ["Q"] * 3, [0] * 3, 1e-6)
    assert torch.allclose(a, b)


def test_normalize_by_type_rejects_mismatched_lengths_and_nan():
    with pytest.raises(ValueError, match="one entry per action"):
        normalize_by_type([1.0, 2.0], ["Q"], [0, 0], 1e-6)
    with pytest.raises(ValueError, match="not finite"):
        normalize_by_type([1.0, float("nan")], ["Q", "Q"], [0, 0], 1e-6)


# ---------------------------------------------------------------- loss, Eq. 18-21 (clipped_objective)


def _loss_inputs():
    old = torch.full((2, 3), -1.0, dtype=torch.float64)  # [N, T]
    log_rho = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]] * 2, dtype=torch.float64)
    logprobs = (old + log_rho).clone()
    logprobs[:, 2] = float("-inf")  # padding: garbage that the mask must neutralise
    old = old.clone()
    old[:, 2] = float("nan")
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)  # [N, T]
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)  # [N], one per row (span)
    return logprobs.requires_grad_(True), old, advantages, mask


def test_loss_hand_computed_clipping_on_both_signs():
    logprobs, old, advantages, mask = _loss_inputs()
    out = clipped_objective(logprobs, old, advantages, mask, clip_eps=0.2)
    # min(rho A, clip(rho) A): (1.5,+1)->1.2 clipped, (0.5,+1)->0.5, (1.5,-1)->-1.5, (0.5,-1)->-0.8 clipped
    assert out["pg_loss"].item() == pytest.approx(-(1.2 + 0.5 - 1.5 - 0.8) / 4)
    assert out["loss"].item() == pytest.approx(0.15)
    assert out["clipfrac"].item() == pytest.approx(0.5)
    assert out["ratio"].item() == pytest.approx(1.0)
    assert out["kl"].item() == 0.0
    out["loss"].backward()
    # d/dlogp of -rho A / sum M where unclipped; clipped and masked tokens get exactly 0
    expected = torch.tensor([[0.0, -0.125, 0.0], [0.375, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(logprobs.grad, expected)
    assert logprobs.grad[~mask].eq(0).all()


def test_span_rows_equal_the_packed_eq18_row_by_hand():
    """Eq. 18 and 21 on one packed token row, written out here, equal clipped_objective on one row per
    trained span carrying its span's advantage (what training does). The row is a forced
    finalisation: q1 (3 tokens), answer (2, not trained), q2 (2), answer (1), final (4); no stop span."""
    g = torch.Generator().manual_seed(0)
    lengths, span_advantages = [3, 2, 2, 1, 4], [0.7, 0.0, -0.3, 0.0, 1.2]
    trained = [True, False, True, False, True]  # Instruct answers are environment text: M = 0
    logprobs = -torch.rand(sum(lengths), generator=g, dtype=torch.float64)
    old = logprobs + 0.3 * torch.randn(sum(lengths), generator=g, dtype=torch.float64)
    ref = logprobs + 0.2 * torch.randn(sum(lengths), generator=g, dtype=torch.float64)
    eps_clip, beta = 0.2, 0.1
    # Eq. 18: A^tok, every token of span i gets A_i; M masks the untrained spans
    a_tok = torch.cat([torch.full((n,), a, dtype=torch.float64) for n, a in zip(lengths, span_advantages)])
    m = torch.cat([torch.full((n,), float(t), dtype=torch.float64) for n, t in zip(lengths, trained)])
    rho = torch.exp(logprobs - old)
    surrogate = torch.minimum(rho * a_tok, rho.clamp(1 - eps_clip, 1 + eps_clip) * a_tok)
    delta = ref - logprobs
    k3 = torch.exp(delta) - delta - 1
    by_hand = -(m * surrogate).sum() / m.sum() + beta * (m * k3).sum() / m.sum()  # Eq. 21

    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    spans = [(s, n, a) for s, n, a, t in zip(starts, lengths, span_advantages, trained) if t]
    width = max(n for _, n, _ in spans)
    rows = {"logprobs": float("-inf"), "old": float("nan"), "ref": 0.0}  # padding garbage, masked out
    padded = {k: torch.full((len(spans), width), fill, dtype=torch.float64) for k, fill in rows.items()}
    mask = torch.zeros(len(spans), width, dtype=torch.bool)
    for i, (s, n, _) in enumerate(spans):
        for k, source in (("logprobs", logprobs), ("old", old), ("ref", ref)):
            padded[k][i, :n] = source[s : s + n]
        mask[i, :n] = True
    out = clipped_objective(
        padded["logprobs"], padded["old"], torch.tensor([a for _, _, a in spans], dtype=torch.float64), mask,
        clip_eps=eps_clip, beta=beta, ref_logprobs=padded["ref"], weights=token_weights(mask, dtype=torch.float64),
    )
    assert out["loss"].item() == pytest.approx(by_hand.item(), rel=1e-12)
    assert out["kl"].item() == pytest.approx(((m * k3).sum() / m.sum()).item(), rel=1e-12)


def test_loss_kl_k3_hand_computed():
    logprobs, old, advantages, mask = _loss_inputs()
    ref = (logprobs.detach() + math.log(2.0)).clone()  # pi_ref / pi_theta = 2 on every valid token
    ref[:, 2] = 0.0
    out = clipped_objective(logprobs, old, advantages, mask, clip_eps=0.2, beta=0.1, ref_logprobs=ref)
    k3 = 2.0 - math.log(2.0) - 1.0
    assert out["kl"].item() == pytest.approx(k3)
    assert out["loss"].item() == pytest.approx(0.15 + 0.1 * k3)
    out["loss"].backward()
    # d k3 / d logp = 1 - exp(delta) = -1 per valid token, times beta / sum M = 0.025
    expected = torch.tensor([[-0.025, -0.15, 0.0], [0.35, -0.025, 0.0]], dtype=torch.float64)
    assert torch.allclose(logprobs.grad, expected)


def test_loss_kl_logged_but_not_added_when_beta_zero():
    logprobs, old, advantages, mask = _loss_inputs()
    ref = torch.where(mask, logprobs.detach() + math.log(2.0), torch.zeros(()))
    out = clipped_objective(logprobs, old, advantages, mask, clip_eps=0.2, ref_logprobs=ref)
    assert out["kl"].item() == pytest.approx(2.0 - math.log(2.0) - 1.0)
    assert out["loss"].item() == pytest.approx(0.15)
    with pytest.raises(ValueError, match="ref_logprobs"):
        clipped_objective(logprobs, old, advantages, mask, clip_eps=0.2, beta=0.1)


def test_loss_micro_batches_sum_to_full_batch_with_global_token_count():
    torch.manual_seed(0)
    logprobs = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() + 0.3 * torch.randn(4, 5, dtype=torch.float64)
    mask = torch.rand(4, 5) > 0.3
    advantages = torch.randn(4, dtype=torch.float64)
    full = clipped_objective(logprobs, old, advantages, mask, clip_eps=0.2)["loss"]
    count = float(mask.sum())  # Eq. 21 divides by sum M over the whole batch
    parts = sum(
        clipped_objective(logprobs[i : i + 1], old[i : i + 1], advantages[i : i + 1], mask[i : i + 1], 0.2,
                          weights=token_weights(mask[i : i + 1], normalizer=count, dtype=logprobs.dtype))["loss"]
        for i in range(4)
    )
    assert parts.item() == pytest.approx(full.item())


def test_loss_all_masked_is_zero_not_nan():
    logprobs = torch.zeros(2, 3, requires_grad=True)
    out = clipped_objective(logprobs, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool), 0.2)
    assert out["loss"].item() == 0.0 and out["clipfrac"].item() == 0.0
    out["loss"].backward()
    assert logprobs.grad.eq(0).all()
