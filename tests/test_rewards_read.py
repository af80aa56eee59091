"""READ rewards (Eq. 3–6): hand-computed values and rouge_score as the independent reference, on
the functions the READ environment calls (``read_rewards`` and its functional components)."""

from __future__ import annotations

import pytest
import torch
from rouge_score import rouge_scorer

from agentcap.judges.anti_copy import anti_copy_mask
from agentcap.rewards.functional.read import (
    accuracy_reward,
    coherence_reward,
    extract_answer,
    format_reward,
    length_window_reward,
)
from agentcap.rewards.read import READ_WEIGHTS, read_rewards

NAN = float("nan")


def wrap(answer: str, think: str = "I look at the clip.") -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


# ---------------------------------------------------------------- answer extraction and format


def test_extract_answer():
    assert extract_answer(wrap("  A man runs.  ")) == "A man runs."
    assert extract_answer("no tags at all") is None
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("<answer> \n </answer>") == ""
    assert extract_answer("<answer>first</answer> then <answer>last</answer>") == "last"
    assert extract_answer("<answer>unclosed") is None
    assert extract_answer("<answer>two\nlines</answer>") == "two\nlines"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (wrap("A man runs."), 1.0),
        ("  \n<think>\nhmm\n</think>\n\n<answer> A man runs. </answer>\n ", 1.0),
        ("<think></think><answer>A man runs.</answer>", 1.0),  # empty reasoning is still the format
        (wrap(""), 0.0),  # empty answer
        (wrap("   "), 0.0),
        ("<answer>A man runs.</answer>", 0.0),  # no think
        ("<think>x</think>", 0.0),  # no answer tag
        ("<answer>A</answer><think>x</think>", 0.0),  # wrong order
        ("Sure! " + wrap("A man runs."), 0.0),  # text outside the tags
        (wrap("A man runs.") + " done", 0.0),
        (wrap("A") + "<answer>B</answer>", 0.0),  # two answers
        ("<think>a <answer>x</answer></think><answer>B</answer>", 0.0),  # tag inside think
        ("<think>x</think><answer>a <think>y</think></answer>", 0.0),
        ("plain text", 0.0),
    ],
)
def test_format_reward(response, expected):
    assert format_reward([response]).tolist() == [expected]


def test_format_reward_batch_dtype_and_shape():
    values = format_reward([wrap("a"), "b", wrap("c")])
    assert values.dtype == torch.float64 and values.shape == (3,)
    assert values.tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(TypeError):
        format_reward(wrap("a"))


# ---------------------------------------------------------------- Eq. 3 accuracy


def test_accuracy_hand_computed():
    # gold "the cat sat on the mat" (6 words) vs answer "the cat is on the mat" (6 words):
    # ROUGE-1: clipped overlap the×2, cat, on, mat = 5 → P = R = F = 5/6
    # ROUGE-2: answer bigrams {the cat, cat is, is on, on the, the mat}; 3 in gold → F = 3/5
    # ROUGE-L: LCS "the cat on the mat" = 5 → F = 5/6
    value = accuracy_reward([wrap("the cat is on the mat")], ["the cat sat on the mat"])
    assert value.dtype == torch.float64
    assert value.item() == pytest.approx((5 / 6 + 3 / 5 + 5 / 6) / 3, abs=1e-12)


def test_accuracy_asymmetric_lengths_hand_computed():
    # gold "a man opens the door" (5) vs answer "the man opens" (3)
    # R1: overlap man, opens, the = 3 → P = 1, R = 3/5, F = 2·1·0.6/1.6 = 0.75
    # R2: answer {the man, man opens}; gold {a man, man opens, opens the, the door}: overlap 1
    #     → P = 1/2, R = 1/4, F = 1/3
    # RL: LCS "man opens" = 2 (or "the": 1) → P = 2/3, R = 2/5, F = 2·(2/3)(2/5)/(2/3+2/5) = 1/2
    value = accuracy_reward([wrap("the man opens")], ["a man opens the door"]).item()
    assert value == pytest.approx((0.75 + 1 / 3 + 0.5) / 3, abs=1e-12)


def test_accuracy_matches_rouge_score():
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    pairs = [
        ("Anna picks up the red cup.", "Anna slowly picks up a red cup"),
        ("Tom walks to the door and opens it.", "Tom opens the door."),
        ("Maria reads the letter.", "Ben drops the book quickly."),
        ("Lucy gives the key to Sam.", "Lucy gives the key to Sam."),
        ("He runs.", "HE RUNS!"),  # rouge_score lower-cases and drops punctuation
    ]
    got = accuracy_reward([wrap(answer) for _, answer in pairs], [gold for gold, _ in pairs])
    for value, (gold, answer) in zip(got.tolist(), pairs):
        s = scorer.score(gold, answer)
        assert value == pytest.approx((s["rouge1"].fmeasure + s["rouge2"].fmeasure + s["rougeL"].fmeasure) / 3)
    assert got[3].item() == pytest.approx(1.0) and got[4].item() == pytest.approx(1.0)
    # only "the" shared (4 vs 5 words): R1 = RL = 2·(1/5)(1/4)/(1/5 + 1/4) = 2/9, R2 = 0
    assert got[2].item() == pytest.approx((2 / 9 + 0 + 2 / 9) / 3)


def test_accuracy_no_answer_and_empty_answer_score_zero():
    gold = ["a man runs"] * 3
    values = accuracy_reward(["a man runs", wrap(""), "<answer>   </answer>"], gold)
    assert values.tolist() == [0.0, 0.0, 0.0]


def test_accuracy_bad_input():
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        accuracy_reward([wrap("a"), wrap("b")], ["a"])
    with pytest.raises(ValueError, match="reference 1 is empty"):
        accuracy_reward([wrap("a"), wrap("b")], ["a", " "])


# ---------------------------------------------------------------- length reward


def test_length_reward_hand_computed():
    gold = "one two three four five six"  # wc = 6, Λ = 4 → answers of 2..10 words pass
    responses = [
        wrap("w " * 2),  # |2 − 6| = 4 → 1
        wrap("w " * 1),  # 5 → 0
        wrap("w " * 10),  # 4 → 1
        wrap("w " * 11),  # 5 → 0
        wrap("  spaced   out\twords \n here "),  # 4 words → 1
        "w w w w w w",  # no answer tag → 0
        wrap(""),  # empty answer → 0 even though |0 − 2| ≤ 4 below
    ]
    values = length_window_reward(responses, [gold] * 6 + ["a b"])
    assert values.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert length_window_reward([wrap("w " * 7)], [gold], tolerance=1).tolist() == [1.0]
    assert length_window_reward([wrap("w " * 8)], [gold], tolerance=1).tolist() == [0.0]
    with pytest.raises(ValueError, match="tolerance"):
        length_window_reward([wrap("a")], ["a"], tolerance=-1)


# ---------------------------------------------------------------- Eq. 4 anti-copy mask


def test_anti_copy_mask_hand_computed():
    context = [9, 2, 3, 4, 8]
    assert anti_copy_mask([1, 2, 3, 4, 5], context) == [1, 0, 0, 0, 1]
    assert anti_copy_mask([1, 2, 3, 5, 4], context) == [1, 1, 1, 1, 1]  # no 3-gram shared
    assert anti_copy_mask([2, 3, 4, 8, 7], context) == [0, 0, 0, 0, 1]  # overlapping windows
    assert anti_copy_mask([9, 2, 3, 4, 8], context) == [0, 0, 0, 0, 0]  # verbatim copy
    assert anti_copy_mask([2, 3, 4, 1, 2, 3, 4], context) == [0, 0, 0, 1, 0, 0, 0]
    assert anti_copy_mask([2, 3], context) == [1, 1]  # shorter than n
    assert anti_copy_mask([], context) == []
    # n = 4: the shared 3-gram (2, 3, 4) no longer counts, (2, 3, 4, 8) does
    assert anti_copy_mask([1, 2, 3, 4, 5], context, n=4) == [1, 1, 1, 1, 1]
    assert anti_copy_mask([1, 2, 3, 4, 8], context, n=4) == [1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="n-gram size"):
        anti_copy_mask([1], [1], n=0)


# ---------------------------------------------------------------- Eq. 5 coherence reward


def test_coherence_reward_ranks_within_groups():
    scores = torch.tensor([-1.0, -3.0, -2.0, -0.5, -4.0, -2.5, -1.5])
    accuracies = torch.tensor([0.5, 0.5, 0.5, 0.05, 0.3, 0.3, 0.12], dtype=torch.float64)
    groups = [0, 0, 0, 0, 1, 1, 1]
    # group 0: #3 is below τ; eligible −1 > −2 > −3 → levels 1, 0.5, 0
    # group 1: #6 has accuracy exactly τ (eligible); −1.5 > −2.5 > −4 → #6: 1, #5: 0.5, #4: 0
    got = coherence_reward(scores, accuracies, groups)
    assert got.dtype == torch.float64
    assert got.tolist() == [1.0, 0.0, 0.5, 0.0, 0.0, 0.5, 1.0]
    assert coherence_reward(scores, accuracies, groups, top_k=1, levels=(2.0,)).tolist() == [
        2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0,
    ]


def test_coherence_reward_all_below_tau_and_nan_are_zero():
    scores = torch.tensor([-1.0, -2.0, -3.0])
    assert coherence_reward(scores, torch.tensor([0.1, 0.0, 0.119]), [0, 0, 0]).tolist() == [0.0, 0.0, 0.0]
    # NaN s_i (no context / fully masked) is never ranked, even with high accuracy; the rest move up
    got = coherence_reward(torch.tensor([NAN, -2.0, -3.0]), torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0])
    assert got.tolist() == [0.0, 1.0, 0.5]
    assert coherence_reward(torch.full((2,), NAN), torch.ones(2), [0, 0]).tolist() == [0.0, 0.0]


def test_coherence_reward_ties_share_the_better_rank():
    ones = torch.ones(4, dtype=torch.float64)
    # tie at the top: ranks 1, 1, 3 → the runner-up level is skipped
    assert coherence_reward(torch.tensor([-1.0, -1.0, -2.0]), ones[:3], [0, 0, 0]).tolist() == [1.0, 1.0, 0.0]
    # tie in second place: ranks 1, 2, 2, 4 → both tied responses get λ_2
    got = coherence_reward(torch.tensor([-0.5, -1.0, -1.0, -2.0]), ones, [0] * 4)
    assert got.tolist() == [1.0, 0.5, 0.5, 0.0]
    # the rule does not depend on the rollout order
    permutation = [3, 1, 0, 2]
    permuted = coherence_reward(torch.tensor([-0.5, -1.0, -1.0, -2.0])[permutation], ones, [0] * 4)
    assert permuted.tolist() == got[permutation].tolist()


def test_coherence_reward_bad_input():
    with pytest.raises(ValueError, match="one entry per response"):
        coherence_reward(torch.zeros(3), torch.zeros(3), [0, 0])
    with pytest.raises(ValueError, match="top_k=3"):
        coherence_reward(torch.zeros(3), torch.zeros(3), [0, 0, 0], top_k=3, levels=(1.0, 0.5))


# ---------------------------------------------------------------- components over a batch


def test_components_score_each_response_of_a_batch_on_its_own():
    """One value per response, in batch order, whatever else shares the batch."""
    responses = [wrap("a"), "b", wrap("c"), wrap("d"), "e"]
    assert format_reward(responses).tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert format_reward(responses[2:]).tolist() == [1.0, 1.0, 0.0]

    golds = ["the cat sat on the mat", "a man opens the door"]
    answers = [wrap("the cat is on the mat"), wrap("the man opens")]
    accuracy = accuracy_reward(answers, golds)
    expected = [(5 / 6 + 3 / 5 + 5 / 6) / 3, (0.75 + 1 / 3 + 0.5) / 3]  # the hand computations above
    assert accuracy.tolist() == pytest.approx(expected, abs=1e-12)
    assert accuracy[1:].tolist() == accuracy_reward(answers[1:], golds[1:]).tolist()

    # Λ = 0: 6 vs 6 and 3 vs 3 words match, 1 vs 2 does not
    length = length_window_reward([*answers, wrap("x")], ["w w w w w w", "w w w", "x y"], tolerance=0)
    assert length.tolist() == [1.0, 1.0, 0.0]


# ---------------------------------------------------------------- Eq. 6 read_rewards


class RecordingScorer:
    """Duck-typed CoherenceScorer: s_i = −(answer word count), recording every call."""

    def __init__(self):
        self.calls = []

    def score(self, contexts, responses, n=3):
        self.calls.append((list(map(list, contexts)), list(responses), n))
        return torch.tensor([-float(len(r.split())) for r in responses], dtype=torch.float64)


def test_read_rewards_combines_components_eq6():
    gold = "the cat sat on the mat"
    responses = [
        wrap("the cat sat on the mat"),  # acc 1, 6 words → s = −6
        wrap("the cat sat"),  # acc high, 3 words → s = −3 (best coherence)
        wrap("dogs bark loudly outside today"),  # acc 0 → not eligible
        "the cat sat on the mat",  # no tag → acc 0, fmt 0, len 0
        wrap("the cat sat on a mat"),  # group 1, but plain instance (no context) → not scored
        wrap("the cat"),  # group 1, with context → ranked first in its group
    ]
    contexts = [["A cat enters."]] * 4 + [[], ["A cat enters.", "It looks around."]]
    groups = [0, 0, 0, 0, 1, 1]
    scorer = RecordingScorer()
    total, components = read_rewards(responses, [gold] * 6, contexts, groups, scorer, ngram=4)

    assert len(scorer.calls) == 1  # one batched call for the whole batch
    called_contexts, called_answers, called_n = scorer.calls[0]
    assert called_answers == ["the cat sat on the mat", "the cat sat", "the cat"]  # answers, not responses
    assert called_contexts == [["A cat enters."], ["A cat enters."], ["A cat enters.", "It looks around."]]
    assert called_n == 4

    assert set(components) == set(READ_WEIGHTS)
    assert components["coherence"].tolist() == [0.5, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert components["format"].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert components["length"].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    accuracy = components["accuracy"]
    assert accuracy[0].item() == pytest.approx(1.0) and accuracy[2].item() == 0.0 and accuracy[3].item() == 0.0
    expected = accuracy + 0.08 * components["format"] + 0.05 * components["length"] + 0.05 * components["coherence"]
    torch.testing.assert_close(total, expected)
    assert total.dtype == torch.float64 and total.shape == (6,)


def test_read_rewards_without_scorer_and_gating():
    responses = [wrap("the cat sat"), wrap("a bird flies")]
    total, components = read_rewards(responses, ["the cat sat on the mat"] * 2, [["x y z"]] * 2, [0, 0], None)
    assert components["coherence"].tolist() == [0.0, 0.0]
    torch.testing.assert_close(total, components["accuracy"] + 0.08 + 0.05)

    scorer = RecordingScorer()  # every response below τ → the scorer is not called at all
    _, components = read_rewards(responses, ["dogs bark"] * 2, [["x y z"]] * 2, [0, 0], scorer)
    assert scorer.calls == [] and components["coherence"].tolist() == [0.0, 0.0]

    with pytest.raises(KeyError, match="unweighted"):
        read_rewards(responses, ["a b"] * 2, [[]] * 2, [0, 0], None, weights={"accuracy": 1.0})
    with pytest.raises(ValueError, match="one entry per response"):
        read_rewards(responses, ["a b"] * 2, [[]], [0, 0], None)


def test_rust_rouge_is_the_backend_and_scores_identically_to_rouge_score():
    """rouge-score-rs (pinned, installed by tools/setup.sh) gives bit-identical F1s on varied text."""
    pytest.importorskip("rouge_score_rs")
    import random

    from agentcap.rewards.functional.read import read_rouge_scorer

    assert type(read_rouge_scorer()).__module__.startswith("rouge_score_rs")
    reference = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    rng = random.Random(0)
    words = "a the man woman opens opened door red cup Anna's café naïve 42 3.5 -- runs RUNS !".split()
    golds = [" ".join(rng.choices(words, k=rng.randint(1, 14))) for _ in range(300)]
    answers = [" ".join(rng.choices(words, k=rng.randint(1, 14))) for _ in range(300)]
    got = accuracy_reward([wrap(a) for a in answers], golds)
    for value, gold, answer in zip(got.tolist(), golds, answers):
        s = reference.score(gold, answer)
        assert value == (s["rouge1"].fmeasure + s["rouge2"].fmeasure + s["rougeL"].fmeasure) / 3
