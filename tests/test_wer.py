"""Word error rate of a caption's quoted speech (agentcap.evaluation.wer)."""

from __future__ import annotations

import math

from agentcap.evaluation.wer import edit_distance, quoted_spans, quoted_wer, speech_metrics, transcripts_of, words

ITEM = {"events": [
    {"type": "speech", "onset": 3.0, "offset": 4.0, "transcript": "Please hold"},
    {"type": "effect", "onset": 0.2, "offset": 0.5, "transcript": None},
    {"type": "speech", "onset": 1.0, "offset": 2.0, "transcript": "I'm sorry"},
]}


def test_edit_distance_counts_substitutions_deletions_insertions():
    assert edit_distance([], ["a", "b"]) == 2
    assert edit_distance(["a", "b"], []) == 2
    assert edit_distance(["a", "x", "c"], ["a", "b", "c"]) == 1
    assert edit_distance(["a", "c"], ["a", "b", "c"]) == 1
    assert edit_distance(["kitten"], ["kitten"]) == 0


def test_quotes_words_and_transcripts_in_time_order():
    caption = 'From 1.0 s to 2.0 s, a woman says "I\'m sorry". Then she says \u201cplease, HOLD!\u201d'
    assert quoted_spans(caption) == ["I'm sorry", "please, HOLD!"]
    assert words("please, HOLD!") == ["please", "hold"]
    assert transcripts_of(ITEM) == ["I'm sorry", "Please hold"]
    assert transcripts_of({"events": [{"type": "effect", "transcript": None}]}) == []
    assert transcripts_of({"caption": "toy"}) is None
    assert quoted_wer([caption], [transcripts_of(ITEM)]) == (0.0, 0, 4)


def test_corpus_wer_and_the_metric_only_for_items_with_transcripts():
    value, edits, total = quoted_wer(['she says "sorry"', "no quotes at all"], [["I'm sorry"], ["please hold"]])
    assert (edits, total) == (3, 4) and math.isclose(value, 0.75)
    assert speech_metrics([ITEM], ['"I\'m sorry" then "please wait"']) == {"wer": 0.25}
    assert speech_metrics([{"caption": "x"}], ["x"]) == {}  # not a real-speech world: no metric
