"""AudioMap / ACE-Cap rewards: hand-computed values for every branch of Eq. 3, 5 and 7, the batching
contract (one examiner call per batch, repeated pairs asked once), on the functions the
environments call."""

from __future__ import annotations

import pytest
import torch

from agentcap.judges.questions import Question
from agentcap.judges.rule import RuleExaminer
from agentcap.judges.temporal import RuleTemporalExaminer
from agentcap.rewards.base import weighted_sum
from agentcap.rewards.functional.cloze import (
    answer_scores,
    curriculum_weights,
    event_count_reward,
    event_temporal_reward,
    evidence_sufficiency,
    gold_to_prediction,
    length_ramp_reward,
    temporal_iou,
)

NG = "Not given"


def q(passage: str, answer: str = "A", *options: str) -> Question:
    options = options or ("w", "x", "y", "z")
    return Question(passage, tuple(options) + (NG,), answer)


class ScriptedExaminer:
    """Answers from a table keyed by (caption, passage); records every call."""

    def __init__(self, table: dict[tuple[str, str], str]):
        self.table = table
        self.calls: list[list[tuple[str, str]]] = []

    def answer(self, captions, questions):
        self.calls.append([(c, x.passage) for c, x in zip(captions, questions)])
        return [self.table[(c, x.passage)] for c, x in zip(captions, questions)]


class ScriptedLocator:
    def __init__(self, table):
        self.table = table
        self.calls = []

    def locate(self, captions, events):
        self.calls.append(list(zip(captions, events)))
        return [self.table[(c, e)] for c, e in zip(captions, events)]


# --- Eq. 3 ------------------------------------------------------------------------------------------
def test_answer_scores_every_branch():
    scores = answer_scores(["A", "E", "C", "D"], ["A", "B", "B", "D"])
    assert scores.tolist() == [1.0, -0.5, -1.0, 1.0]  # correct, "Not given", wrong, correct
    custom = answer_scores(["B", "E", "A"], ["B", "B", "B"], r_pos=2.0, r_abs=0.0, r_neg=-3.0)
    assert custom.tolist() == [2.0, 0.0, -3.0]


@pytest.mark.parametrize("scores", [dict(r_abs=-1.0, r_neg=-1.0), dict(r_abs=0.1), dict(r_pos=0.0)])
def test_answer_scores_refuses_scores_outside_eq3(scores):
    with pytest.raises(ValueError, match="r_neg < r_abs <= 0 < r_pos"):
        answer_scores(["A"], ["A"], **scores)


def test_answer_scores_bad_letters():
    with pytest.raises(ValueError, match="predicted answer 1 .* got 'F'"):
        answer_scores(["A", "F"], ["A", "B"])
    with pytest.raises(ValueError, match="gold answer 0 .* got 'E'"):
        answer_scores(["A"], ["E"])
    with pytest.raises(ValueError, match="2 predicted answers but 1 gold"):
        answer_scores(["A", "B"], ["A"])


# --- ESR / G2P ---------------------------------------------------------------------------------------
def test_evidence_sufficiency_hand_computed_in_one_call():
    bank_one = [q("p1", "A"), q("p2", "B"), q("p3", "C")]
    bank_two = [q("p1", "A"), q("p4", "D")]
    table = {("c1", "p1"): "A", ("c1", "p2"): "E", ("c1", "p3"): "D",  # +1, -0.5, -1
             ("c2", "p1"): "E", ("c2", "p4"): "D"}  # -0.5, +1
    examiner = ScriptedExaminer(table)
    rewards = evidence_sufficiency(["c1", "c2", "c1"], [bank_one, bank_two, bank_one], examiner)
    assert rewards.tolist() == pytest.approx([-0.5 / 3, 0.25, -0.5 / 3])
    assert len(examiner.calls) == 1  # the whole batch in one examiner call
    assert sorted(examiner.calls[0]) == sorted(table)  # the repeated caption's pairs asked once
    scaled = evidence_sufficiency(["c2"], [bank_two], examiner, r_pos=2.0, r_abs=-1.0, r_neg=-2.0)
    assert scaled.tolist() == [0.5]


def test_gold_to_prediction_is_the_same_computation():
    assert gold_to_prediction is evidence_sufficiency


def test_evidence_sufficiency_bad_input():
    examiner = ScriptedExaminer({})
    with pytest.raises(ValueError, match="question bank 1 is empty"):
        evidence_sufficiency(["a", "b"], [[q("p")], []], examiner)
    with pytest.raises(ValueError, match="2 captions but 1 question banks"):
        evidence_sufficiency(["a", "b"], [[q("p")]], examiner)
    with pytest.raises(TypeError, match="unknown score names"):
        evidence_sufficiency(["a"], [[q("p")]], examiner, r_bad=1.0)
    with pytest.raises(TypeError, match="bank 0, question 1: expected a Question"):
        evidence_sufficiency(["a"], [[q("p"), {"passage": "p"}]], examiner)


def test_evidence_sufficiency_with_the_rule_examiner_on_a_toy_caption():
    caption = "From 0.5 s to 1.8 s, a loud high beep sounds three times."
    bank = [
        Question("a loud ___ beep", ("low", "mid", "high", "very high", NG), "C", {"subject": "beep"}),
        Question("the beep sounds ___", ("once", "twice", "three times", "four times", NG), "D", {"subject": "beep"}),
        Question("a ___ hiss", ("low", "mid", "high", "very high", NG), "A", {"subject": "hiss"}),
    ]
    # correct (+1), a wrong concrete claim (-1), the hiss is never mentioned (-0.5)
    assert evidence_sufficiency([caption], [bank], RuleExaminer()).tolist() == [pytest.approx(-0.5 / 3)]


# --- Eq. 5 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ((1.0, 3.0), (2.0, 4.0), 1 / 3),  # I = 1, U = 3
        ((2.0, 4.0), (2.0, 4.0), 1.0),
        ((0.0, 1.0), (2.0, 4.0), 0.0),  # disjoint
        (None, (2.0, 4.0), 0.0),  # null
        ((2.0, 2.0), (2.0, 2.0), 0.0),  # U = 0
        ((2.5, 2.5), (2.0, 4.0), 0.0),  # a zero-length prediction inside: I = 0, U = 2
        ((0.0, 0.7), (0.0, 1.0), 0.7),  # a point at 0.2 widened by 0.5 and clamped at 0
    ],
)
def test_temporal_iou(pred, gold, expected):
    assert temporal_iou(pred, gold) == pytest.approx(expected)


def test_temporal_iou_refuses_reversed_intervals():
    with pytest.raises(ValueError, match="gold interval"):
        temporal_iou((1.0, 2.0), (3.0, 2.0))
    with pytest.raises(ValueError, match="predicted interval"):
        temporal_iou((2.0, 1.0), (1.0, 3.0))


def test_event_temporal_reward_hand_computed():
    caption = ("From 0.5 s to 1.8 s, a loud high beep sounds three times. "
               "From 2.1 s to 4.0 s, a soft low hiss sounds once. A dog barks at 0.2 s.")
    anchors = [
        {"event": "the loud high beep", "start": 0.5, "end": 1.8},  # exact: 1
        {"event": "the soft low hiss", "start": 2.0, "end": 4.0},  # I = 1.9, U = 2.0
        {"event": "the dog barking", "start": 0.0, "end": 1.0},  # point → [0, 0.7]: 0.7
        {"event": "a trumpet", "start": 1.0, "end": 2.0},  # null: 0
    ]
    no_times = "A loud high beep sounds."
    rewards = event_temporal_reward([caption, no_times], [anchors, anchors[:1]], RuleTemporalExaminer(0.5))
    assert rewards.tolist() == pytest.approx([(1 + 0.95 + 0.7 + 0) / 4, 0.0])


def test_event_temporal_reward_one_locate_call_and_bad_anchors():
    locator = ScriptedLocator({("c1", "e1"): (0.0, 2.0), ("c1", "e2"): None, ("c2", "e1"): (1.0, 2.0)})
    rewards = event_temporal_reward(
        ["c1", "c2"],
        [[{"event": "e1", "start": 0, "end": 1}, {"event": "e2", "start": 1, "end": 2}],
         [{"event": "e1", "start": 0, "end": 2}]],
        locator,
    )
    assert rewards.tolist() == pytest.approx([(0.5 + 0.0) / 2, 0.5])
    assert len(locator.calls) == 1 and len(locator.calls[0]) == 3
    with pytest.raises(ValueError, match="anchor list 0 is empty"):
        event_temporal_reward(["c1"], [[]], locator)
    with pytest.raises(ValueError, match="caption 0, anchor 0: missing field 'end'"):
        event_temporal_reward(["c1"], [[{"event": "e1", "start": 0}]], locator)
    with pytest.raises(ValueError, match="start=3, end=1"):
        event_temporal_reward(["c1"], [[{"event": "e1", "start": 3, "end": 1}]], locator)


# --- R_len (our definition) -------------------------------------------------------------------------
def test_length_reward_hand_computed():
    reference = "one two three four five six seven eight"  # 8 words: band 2, zero at 4 off
    captions = [" ".join(["w"] * n) for n in (8, 10, 6, 11, 12, 3, 20)]
    expected = [1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0]
    assert length_ramp_reward(captions, [reference] * 7).tolist() == pytest.approx(expected)
    assert length_ramp_reward(["a b", "a b c"], ["x y", "x y"], tolerance=0).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="reference 1 is empty"):
        length_ramp_reward(["a", "b"], ["x", "  "])
    with pytest.raises(ValueError, match="tolerance"):
        length_ramp_reward(["a"], ["x"], tolerance=-0.1)


# --- R_count (ours) -----------------------------------------------------------------------------------
def test_count_reward_charges_a_missing_and_an_invented_event_alike():
    anchors = [{"event": "the bell", "start": 0.2, "end": 0.4}, {"event": "a woman says", "start": 1.2, "end": 2.9}]
    two = 'From 0.2 s to 0.4 s, a bell dings. From 1.2 s to 2.9 s, a woman says "Thank you, goodbye".'
    captions = [two,
                two + " From 3.0 s to 3.5 s, a chime plays.",  # an event the clip lacks: 2 of 3
                "From 0.2 s to 0.4 s, a bell dings.",  # one missing: 1 of 2
                "A bell dings, then a woman speaks.",  # nothing timed
                "A bell at 0.2 s and a woman from 1.2 to 2.9 s."]  # two timed clauses in one sentence
    assert event_count_reward(captions, [anchors] * 5).tolist() == pytest.approx([1.0, 2 / 3, 0.5, 0.0, 1.0])
    with pytest.raises(ValueError, match="anchor list 0 is empty"):
        event_count_reward(["c"], [[]])


# --- Eq. 7 ------------------------------------------------------------------------------------------
def test_curriculum_switches_from_r1_to_r2():
    before = curriculum_weights(step=99, switch_step=100, esr=1.0, ectr=0.5, length=0.2)
    after = curriculum_weights(step=100, switch_step=100, esr=1.0, ectr=0.5, length=0.2)
    assert before == {"esr": 1.0, "ectr": 0.0, "length": 0.2}
    assert after == {"esr": 1.0, "ectr": 0.5, "length": 0.2}
    components = {"esr": torch.tensor([0.5]), "ectr": torch.tensor([0.8]), "length": torch.tensor([1.0])}
    assert weighted_sum(components, before).item() == pytest.approx(0.5 + 0.2)
    assert weighted_sum(components, after).item() == pytest.approx(0.5 + 0.4 + 0.2)
    with pytest.raises(ValueError, match="step"):
        curriculum_weights(step=-1, switch_step=0, esr=1, ectr=1, length=1)


# --- one value per caption, in batch order ----------------------------------------------------------
def test_rewards_score_each_caption_of_a_batch_on_its_own():
    examiner = ScriptedExaminer({("c1", "p1"): "A", ("c2", "p1"): "E", ("c3", "p1"): "B"})
    esr = evidence_sufficiency(["c1", "c2", "c3"], [[q("p1")]] * 3, examiner)
    assert esr.tolist() == [1.0, -0.5, -1.0]  # correct, "Not given", wrong
    assert evidence_sufficiency(["c2", "c3"], [[q("p1")]] * 2, examiner).tolist() == esr[1:].tolist()

    anchors = [{"event": "beep", "start": 2, "end": 4}]
    ectr = event_temporal_reward(["A beep from 1 to 3 s.", "A beep."], [anchors, anchors], RuleTemporalExaminer(0.5))
    assert ectr.tolist() == pytest.approx([1 / 3, 0.0])  # tIoU of [1, 3] and [2, 4]; no span stated

    length = length_ramp_reward(["a b c d e f g h i j k", "a b c d e f g h"], ["1 2 3 4 5 6 7 8"] * 2, 0.25)
    assert length.tolist() == pytest.approx([0.5, 1.0])


# --- precision (each failed before the fix: float32 results, a float64 default dtype crashed) -------
def test_functional_rewards_are_float64_exact():
    scores = answer_scores(["A", "E", "B"], ["A", "A", "A"])
    assert scores.dtype == torch.float64 and scores.tolist() == [1.0, -0.5, -1.0]
    locator = ScriptedLocator({("c", "e1"): (0.0, 0.3), ("c", "e2"): (0.0, 1.0)})
    ectr = event_temporal_reward(["c"], [[{"event": "e1", "start": 0, "end": 1}, {"event": "e2", "start": 0, "end": 1}]], locator)
    assert ectr.dtype == torch.float64 and ectr.item() == (0.3 + 1.0) / 2
    length = length_ramp_reward(["a b c d e f g h i j k"], ["one two three four five six seven eight"])
    assert length.dtype == torch.float64


def test_event_temporal_reward_under_a_float64_default_dtype():
    locator = ScriptedLocator({("c", "e"): (0.0, 0.5)})
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        rewards = event_temporal_reward(["c"], [[{"event": "e", "start": 0, "end": 1}]], locator)
    finally:
        torch.set_default_dtype(previous)
    assert rewards.tolist() == [0.5]
