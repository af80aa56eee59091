"""tools/real_analysis.py: a caption read against its clip's event list and, split by attribute, its cloze bank."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import real_analysis  # noqa: E402

REFERENCE = ('From 0.3 s to 1.5 s, an error tone sounds. From 2.0 s to 2.9 s, a woman says "I\'m sorry". '
             'From 3.3 s to 4.9 s, a woman says "The number I have is".')
ITEM = {
    "id": "train-0002",
    "caption": REFERENCE,
    "events": [
        {"type": "effect", "label": "error tone", "onset": 0.3, "offset": 1.5, "transcript": None},
        {"type": "speech", "label": "speech", "onset": 2.0, "offset": 2.9, "transcript": "I'm sorry"},
        {"type": "speech", "label": "speech", "onset": 3.3, "offset": 4.9, "transcript": "The number I have is"},
    ],
    "cloze": [
        {"passage": "From 0.3 s to 1.5 s, a ___ sounds.", "options": ["error tone", "alarm clock", "bell", "paper", "Not given"],
         "answer": "A", "meta": {"event": 0, "subject": "error tone", "attribute": "name"}},
        {"passage": "From ___ to 1.5 s, an error tone sounds.", "options": ["2.7 s", "0.3 s", "2.5 s", "5.9 s", "Not given"],
         "answer": "B", "meta": {"event": 0, "subject": "error tone", "attribute": "onset"}},
        {"passage": 'From 2.0 s to 2.9 s, a woman says "I\'m ___".', "options": ["matches", "sorry", "volume", "failed", "Not given"],
         "answer": "B", "meta": {"event": 1, "subject": "woman", "attribute": "word"}},
        {"passage": 'From 3.3 s to 4.9 s, a woman says "The ___ I have is".',
         "options": ["number", "again", "exit", "truncating", "Not given"],
         "answer": "A", "meta": {"event": 2, "subject": "woman", "attribute": "word"}},
    ],
}
TRAINING = frozenset({"my favorite item is currently the only one in the list", "i'm sorry"})


def test_a_looked_up_quote_and_moved_onsets_show_in_their_own_figures():
    item = json.loads(json.dumps(ITEM))  # question_bank keeps the parsed bank on the item it is given
    gold = real_analysis.caption_figures(REFERENCE, item, TRAINING)
    assert gold["exact quotes"] == 1.0 and gold["another recording's transcript"] == 0.0
    assert gold["ESR name"] == gold["ESR onset"] == gold["ESR word"] == 1.0
    assert math.isnan(gold["ESR order"])  # this bank asks no order question
    moved = ('From 0.2 s to 1.4 s, an error tone sounds. From 1.6 s to 3.0 s, a woman says "I\'m sorry". '
             'From 3.4 s to 5.4 s, a woman says "My favorite item is currently the only one in the list".')
    figures = real_analysis.caption_figures(moved, item, TRAINING)
    assert figures["exact quotes"] == 0.5 and figures["another recording's transcript"] == 0.5
    assert figures["ESR name"] == 1.0  # the effect is still named
    assert figures["ESR onset"] < 1.0  # 0.2 s is none of the options: the onset question is lost
    assert figures["ESR word"] == 0.25  # "sorry" kept (+1), "number" no longer said: Not given (-0.5)
    assert figures["effect recall"] == 1.0


def test_the_table_pairs_stages_in_their_order(tmp_path):
    manifest = tmp_path / "clips.jsonl"
    manifest.write_text(json.dumps(ITEM) + "\n")
    training = tmp_path / "train.jsonl"
    training.write_text(json.dumps(ITEM) + "\n")
    for run, caption in (("a", REFERENCE), ("b", REFERENCE)):
        (tmp_path / run / "eval").mkdir(parents=True)
        for stage, text in (("before", caption), ("after", caption.replace("0.3 s to", "0.2 s to"))):
            (tmp_path / run / "eval" / f"{stage}.jsonl").write_text(json.dumps({"id": "train-0002", "caption": text}) + "\n")
    text = real_analysis.main([str(tmp_path / "a"), str(tmp_path / "b"), "--stages", "before,after",
                               "--manifest", str(manifest), "--training", str(training)])
    assert "| figure | before | after | before → after |" in text
    onset = next(line for line in text.splitlines() if line.startswith("| ESR onset |"))
    assert "1.000" in onset and "(-1.50, -1.50)" in onset  # 0.3 s → 0.2 s: +1 becomes -0.5 on both runs


def test_stored_benchmark_captions_are_judged_again_by_the_current_rule_judge(tmp_path):
    """A stage judged by an older judge version keeps its figure, and gains the current version's."""
    stage = tmp_path / "run" / "benchmarks" / "after"
    stage.mkdir(parents=True)
    caption = "From 0.3 s to 1.5 s, an error tone sounds. From 2.0 s to 2.2 s, a bell dings."
    rows = [{"question": "At about what time does the bell start?", "choices": ["2.1 s", "4.0 s"], "answer": "A",
             "category": "temporal order", "subcategory": "onset", "caption": caption, "correct": False},
            {"question": "Apart from the voice, how many sound effects can be heard?", "choices": ["one", "two"],
             "answer": "B", "category": "sound events", "subcategory": "effect count", "caption": caption, "correct": False},
            {"question": "Which of these sounds can be heard?", "choices": ["bell", "chime"], "answer": "A",
             "category": "sound events", "subcategory": "effect", "caption": None, "correct": False}]  # no caption: stays wrong
    stage.joinpath("benchmark_items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = real_analysis.benchmark_figures(str(tmp_path / "run"), "after")
    assert figures["benchmark (as run)"] == 0.0
    assert figures["benchmark (rule-v3)"] == 2 / 3
    assert figures["benchmark (rule-v3) onset"] == figures["benchmark (rule-v3) effect count"] == 1.0
    assert figures["benchmark (rule-v3) sound events"] == 0.5
    assert math.isnan(real_analysis.benchmark_figures(str(tmp_path / "run"), "before")["benchmark (rule-v3)"])


def test_each_kind_of_sentence_gets_its_leave_one_out_share_of_the_runs_reward():
    """ESR alone: without the effect sentence its name and onset go unanswered (1 - 0.25 = 0.75);
    without one quote, one word blank does (1 - 0.625 = 0.375)."""
    item = json.loads(json.dumps(ITEM))
    item["anchors"] = [{"event": "error tone", "start": 0.3, "end": 1.5}]
    item["audio"] = "unused.wav"
    (shares,) = real_analysis.sentence_shares([REFERENCE], [item], {"weights": {"esr": 1.0}, "manifest": "x.jsonl"})
    assert shares == {"share, quote sentence": 0.375, "share, effect sentence": 0.75,
                      "quote - effect share": -0.375, "quote - effect share, esr": -0.375}
    # the length term alone pays the longer (quote) sentences: 0.5 x (ramp loss without each sentence)
    (both,) = real_analysis.sentence_shares([REFERENCE], [item], {"weights": {"esr": 1.0, "length": 0.5}})
    # the sentences count 10, 11 and 14 of the caption's 35 words: band 0.25 x 35, ramp to 0 at twice it
    ramp = [0.5 * (1 - (n - 8.75) / 8.75) for n in (10, 11, 14)]
    length_gap = ((0.5 - ramp[1]) + (0.5 - ramp[2])) / 2 - (0.5 - ramp[0])
    assert both["quote - effect share, length"] == pytest.approx(length_gap) and length_gap > 0.14
    assert both["quote - effect share"] == pytest.approx(length_gap - 0.375)
    assert both["quote - effect share, esr"] == -0.375
    (alone,) = real_analysis.sentence_shares(['From 2.0 s to 2.9 s, a woman says "I\'m sorry".'], [item],
                                             {"weights": {"esr": 1.0}})
    assert math.isnan(alone["share, effect sentence"]) and math.isnan(alone["quote - effect share"])
