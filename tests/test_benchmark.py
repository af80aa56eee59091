"""``agentcap evaluate --benchmark``: caption-as-evidence accuracy, its caches, the toy benchmark file,
LLM-AD-Eval's score parsing and the skipped-metric listing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from agentcap.core.manifests import ManifestError
from agentcap.evaluation.ad_eval import llm_ad_eval, parse_score
from agentcap.evaluation.benchmark import (
    Ask,
    LocalJudge,
    RuleJudge,
    benchmark_table,
    evaluate_benchmark,
    judge_prompt,
    parse_judge_spec,
    read_benchmark,
)
from agentcap.evaluation.skipped import skipped_metrics

# six questions on three clips; the scripted judge's letters below, hand-counted:
#   q1 mmau/sound/music-less  correct      q4 mmar Signal   wrong
#   q2 mmau/sound             wrong        q5 mmar Semantic correct (its clip fails to caption → wrong)
#   q3 mmau/speech            correct      q6 mmar Semantic unanswered → wrong
ROWS = [
    ("q1", "a.wav", "mmau", "sound", "sound", "event", None, ["dog", "cat"], "A"),
    ("q2", "a.wav", "mmau", "sound", "sound", "event", None, ["one", "two", "three"], "C"),
    ("q3", "b.wav", "mmau", "speech", "speech", None, None, ["man", "woman"], "B"),
    ("q4", "b.wav", "mmar", "reasoning", "sound", None, "Signal", ["x", "y", "z", "w"], "D"),
    ("q5", "bad.wav", "mmar", "reasoning", "music", None, "Semantic", ["p", "q"], "A"),
    ("q6", "a.wav", "mmar", "reasoning", "music", None, "Semantic", ["up", "down"], "B"),
]
SCRIPT = {"q1": "A", "q2": "B", "q3": "B", "q4": "A", "q6": None}


def write_rows(path: Path, rows=ROWS) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for id_, audio, bench, task, category, sub, layer, choices, answer in rows:
            handle.write(json.dumps({
                "id": id_, "audio": audio, "question": f"question {id_}?", "choices": choices, "answer": answer,
                "answer_text": choices[min("ABCDEFGHIJ".index(answer), len(choices) - 1)], "benchmark": bench, "task": task,
                "category": category, "subcategory": sub, "layer": layer, "duration": 1.0}) + "\n")
    return path


class Captioner:
    """Captions ``<name>`` as ``caption of <name>``; ``bad.wav`` fails. Counts the clips asked for."""

    def __init__(self):
        self.asked: list[str] = []

    def __call__(self, clips):
        self.asked += clips
        return {c: {"error": "undecodable"} if c.endswith("bad.wav") else {"caption": f"caption of {os.path.basename(c)}"}
                for c in clips}


class ScriptedJudge:
    """Answers from SCRIPT by the question's id; counts the asks."""

    def __init__(self, identity="scripted"):
        self.identity, self.asked = identity, []

    def choose(self, asks):
        self.asked += asks
        return [SCRIPT[a.question.split()[1].rstrip("?")] for a in asks]


def test_accuracy_matches_hand_counted_answers(tmp_path):
    rows = read_benchmark(str(write_rows(tmp_path / "bench.jsonl")))
    summary = evaluate_benchmark(rows, Captioner(), "cap", ScriptedJudge(), str(tmp_path / "out"))
    assert summary["overall"] == {"count": 6, "correct": 2, "accuracy": 2 / 6}
    by = summary["by"]
    assert by["benchmark"]["mmau"] == {"count": 3, "correct": 2, "accuracy": 2 / 3}
    assert by["benchmark"]["mmar"] == {"count": 3, "correct": 0, "accuracy": 0.0}
    assert by["category"] == {"sound": {"count": 3, "correct": 1, "accuracy": 1 / 3},
                              "speech": {"count": 1, "correct": 1, "accuracy": 1.0},
                              "music": {"count": 2, "correct": 0, "accuracy": 0.0}}
    assert by["subcategory"] == {"event": {"count": 2, "correct": 1, "accuracy": 0.5}}  # null values left out
    assert by["layer"]["Semantic"]["count"] == 2 and by["layer"]["Signal"]["count"] == 1
    assert summary["uncaptioned"] == 1 and summary["unanswered"] == 1 and summary["failed_clips"] == 1
    items = [json.loads(line) for line in (tmp_path / "out" / "benchmark_items.jsonl").read_text().splitlines()]
    assert [i["correct"] for i in items] == [True, False, True, False, False, False]
    assert items[4]["caption"] is None and "undecodable" in items[4]["error"]
    assert (items[1]["letter"], items[1]["answer"], items[1]["caption"]) == ("B", "C", "caption of a.wav")
    assert items[1]["choices"] == ["one", "two", "three"] and items[1]["question"] == "question q2?"
    assert json.loads((tmp_path / "out" / "benchmark_summary.json").read_text())["overall"]["correct"] == 2
    table = benchmark_table(summary)
    assert "33.3%" in table and "1 questions without a caption" in table


def test_second_run_and_second_judge_ask_nothing_twice(tmp_path):
    rows = read_benchmark(str(write_rows(tmp_path / "bench.jsonl")))
    out = str(tmp_path / "out")
    captioner, judge = Captioner(), ScriptedJudge()
    first = evaluate_benchmark(rows, captioner, "cap", judge, out)
    assert len(captioner.asked) == 3 and len(judge.asked) == 5  # 3 distinct clips; 5 captioned questions

    again_captioner, again_judge = Captioner(), ScriptedJudge()
    second = evaluate_benchmark(rows, again_captioner, "cap", again_judge, out)
    assert [a.question for a in again_judge.asked] == ["question q6?"]  # every letter cached; no answer: asked again
    assert again_captioner.asked == [str(tmp_path / "bad.wav")]  # only the failed clip is tried again
    assert second["overall"] == first["overall"]

    other_captioner, other_judge = Captioner(), ScriptedJudge("another judge")
    evaluate_benchmark(rows, other_captioner, "cap", other_judge, out)
    assert other_captioner.asked == [str(tmp_path / "bad.wav")] and len(other_judge.asked) == 5

    new_weights = Captioner()
    evaluate_benchmark(rows, new_weights, "cap after more training", ScriptedJudge(), out)
    assert len(new_weights.asked) == 3  # another captioner: captioned anew


def test_a_judge_that_fails_midway_keeps_the_answers_it_gave(tmp_path, monkeypatch):
    """Answers are cached chunk by chunk: after a judge dies on its third chunk, the rerun asks only
    what was not answered."""
    from agentcap.evaluation import benchmark
    from agentcap.judges.served import JudgeUnavailable

    monkeypatch.setattr(benchmark, "ASK_CHUNK", 2)
    rows = read_benchmark(str(write_rows(tmp_path / "bench.jsonl")))
    out = str(tmp_path / "out")

    class DiesOnThirdChunk(ScriptedJudge):
        def choose(self, asks):
            if len(self.asked) >= 4:
                raise JudgeUnavailable("the server went away")
            return super().choose(asks)

    with pytest.raises(JudgeUnavailable):
        evaluate_benchmark(rows, Captioner(), "cap", DiesOnThirdChunk(), out)
    judge = ScriptedJudge()
    summary = evaluate_benchmark(rows, Captioner(), "cap", judge, out)
    assert len(judge.asked) == 1  # 5 captioned questions, 4 answered before the failure
    assert summary["overall"]["correct"] == 2


def test_a_bad_benchmark_row_is_named(tmp_path):
    path = write_rows(tmp_path / "bench.jsonl", [("q1", "a.wav", "mmau", None, None, None, None, ["a", "b"], "C")])
    with pytest.raises(ManifestError, match=r"bench.jsonl:1: field 'answer'"):
        read_benchmark(str(path))


def test_repeated_benchmark_ids_are_refused_with_the_count(tmp_path):
    """Two rows with one id would count one question twice: refused, saying how many rows repeat."""
    rows = ROWS + [ROWS[0], ROWS[0], ("q3",) + ROWS[3][1:]]
    path = write_rows(tmp_path / "bench.jsonl", rows)
    with pytest.raises(ManifestError, match=r"bench\.jsonl: 3 of 9 rows repeat an earlier row's id \(2 ids: "
                                            r"'q1' at rows 1, 7, 8; 'q3' at rows 3, 9\)"):
        read_benchmark(str(path))


def test_rule_judge_reads_the_sentence_about_the_subject():
    caption = "From 0.1 s to 1.0 s, a loud high beep sounds twice. From 2.0 s to 3.0 s, a soft low hiss sounds once."
    judge = RuleJudge()
    asks = [Ask(caption, "How loud is the hiss?", ("loud", "soft", "very soft")),
            Ask(caption, "How high in pitch is the beep?", ("low", "very high", "high")),
            Ask(caption, "Which comes first, the beep or the hiss?", ("hiss", "beep")),
            Ask(caption, "At about what time does the hiss begin?", ("1.0 s", "2.0 s", "0.1 s")),
            Ask(caption, "What colour is the car?", ("red", "blue"))]
    assert judge.choose(asks) == ["B", "C", "B", "B", None]


def test_rule_judge_names_choices_by_their_quote_or_without_article_and_reads_later():
    caption = 'A woman says "Agent logged in". A bell dings. Then she says "Thank you".'
    judge = RuleJudge()
    asks = [Ask(caption, "Which comes later?", ('the speaker saying "Thank you"', 'the speaker saying "Agent logged in"')),
            Ask(caption, "Which comes first?", ('the speaker saying "Thank you"', 'the speaker saying "Agent logged in"')),
            Ask(caption, "Which sentence does the speaker say last?", ("Agent logged in", "You are now unmuted", "Thank you")),
            Ask(caption, "Which of these sounds can be heard?", ("the dog", "the bell", "the horn")),
            Ask(caption, 'Which word comes after "last"?', ("bell", "Thank you")),  # "last" inside a quote: not an order question
            Ask(caption, "Which comes later?", ("the horn", "the dog"))]  # neither named: no answer
    assert judge.choose(asks) == ["A", "B", "C", "B", "A", None]
    assert judge.identity == "rule-v3"  # older versions' cached answers are not reused


def test_rule_judge_reads_the_nearest_time_and_counts_sound_sentences():
    """v3: "at about what time" takes the choice nearest the subject's sentence's time (v2 needed the
    digits to match), "how many" counts the distinct sound sentences (v2 left it unanswered), and
    "the first one after "Q"" reads the sentences after Q's (v2 took the first choice anywhere)."""
    caption = ('From 0.3 s to 1.4 s, a bell dings. From 1.7 s to 3.7 s, a woman says "Information about '
               'your call". From 4.0 s to 4.6 s, a bell dings. From 5.1 s to 5.4 s, a chime rings.')
    judge = RuleJudge()
    asks = [Ask(caption, "At about what time does the chime start?", ("4.4 s", "5.0 s", "2.9 s")),
            Ask(caption, "At about what time does the bell start?", ("1.0 s", "0.2 s")),  # "about" in a quote is not the subject
            Ask(caption, "When does the chime end?", ("5.0 s", "5.5 s")),
            Ask(caption, 'At about what time does the speaker start saying "Your call"?', ("1.5 s", "3.5 s")),
            Ask(caption, "At about what time does the horn start?", ("1.0 s", "2.0 s")),  # not named: no answer
            Ask(caption, "Apart from the voice, how many sound effects can be heard?", ("none", "two", "one")),
            Ask(caption, "How many sounds can be heard?", ("2", "3", "4")),
            Ask(caption, "Apart from the voice, how many sound effects can be heard?", ("none", "one")),  # two: not a choice
            Ask(caption, 'Which sound effect is the first one after "Information about your call" is said?',
                ("chime", "bell", "horn")),
            Ask(caption, 'Which sound effect is the first one after "Goodbye" is said?', ("horn", "bell"))]  # not quoted: read as any
    assert judge.choose(asks) == ["B", "B", "B", "A", None, "B", "B", None, "B", "B"]


def test_local_judge_reads_only_the_asks_letters():
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentcap.agents.tokenizer import build_word_tokenizer
    from agentcap.judges.causal_lm import CausalLMJudge

    asks = [Ask("a dog barks", "What barks?", ("dog", "cat")),
            Ask("a dog barks", "How many?", tuple("one two three four five six seven eight nine ten".split()))]
    tokenizer = build_word_tokenizer([judge_prompt(a) for a in asks], extra_tokens=list("ABCDEFGHIJ"))
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    judge = LocalJudge(CausalLMJudge(LlamaForCausalLM(config).eval(), tokenizer), "tiny")
    letters = judge.choose(asks * 3)
    assert letters[0] in "AB" and letters[1] in "ABCDEFGHIJ"
    assert letters == letters[:2] * 3  # batched rows equal each other
    assert [tokenizer.decode([i]).strip() for i in judge.letter_ids] == list("ABCDEFGHIJ")


def test_judge_spec_strings(tmp_path):
    assert parse_judge_spec("rule") == "rule"
    assert parse_judge_spec("http://127.0.0.1:8000/v1#smol") == {"url": "http://127.0.0.1:8000/v1", "model": "smol"}
    assert parse_judge_spec('{"url": "http://h/v1", "model": "m", "timeout": 5}')["timeout"] == 5
    assert parse_judge_spec(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="--judge: 'nowhere' is not"):
        parse_judge_spec("nowhere")
    # a bare URL asks the server for its model; nobody listens on port 9 (discard): one line naming the URL
    with pytest.raises(ValueError, match=r"--judge: cannot list the models served at http://127\.0\.0\.1:9/v1"):
        parse_judge_spec("http://127.0.0.1:9/v1")


def test_toy_benchmark_validates_and_is_held_out(toy_soundscapes, tmp_path):
    from agentcap_envs.toy import soundscapes

    rows = read_benchmark(str(toy_soundscapes / "benchmark.jsonl"))  # every row passes check_benchmark_row
    tests = {r["id"]: r for r in map(json.loads, (toy_soundscapes / "test.jsonl").read_text().splitlines())}
    assert {r["audio"] for r in rows} == {t["audio"] for t in tests.values()}  # the test clips, all of them
    assert all(os.path.isfile(r["_clip"]) for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert {r["subcategory"] for r in rows} >= {"type", "pitch", "loudness", "count", "onset"}
    assert {r["category"] for r in rows} == {"perception", "temporal"}
    banks = {q["passage"] for t in tests.values() for q in t["cloze"] + t["mcq"]}
    assert not banks & {r["question"] for r in rows}  # worded unlike the training banks
    assert all(len(r["choices"]) < 5 and "Not given" not in r["choices"] for r in rows)
    soundscapes.main(["--out", str(tmp_path / "again"), "--train", "6", "--val", "3", "--test", "3"])
    assert (tmp_path / "again" / "benchmark.jsonl").read_bytes() == (toy_soundscapes / "benchmark.jsonl").read_bytes()
    soundscapes.main(["--out", str(tmp_path / "seed1"), "--seed", "1", "--train", "0", "--val", "0", "--test", "3"])
    assert (tmp_path / "seed1" / "benchmark.jsonl").read_bytes() != (toy_soundscapes / "benchmark.jsonl").read_bytes()


def test_ad_eval_scores_and_counts_unparsable_replies():
    assert [parse_score(t) for t in ['{"score": 4}', "Score: 2/5", "3", "I'd say 5.", "{'score': 0}", "7",
                                     "between 2 and 3", "3.5", "no idea"]] == [4, 2, 3, 5, None, None, None, None, None]

    class Client:  # an OpenAI-compatible server's replies, in order
        model = "judge"

        def __init__(self, replies):
            self.replies, self.payloads = replies, []

        def map(self, path, payloads):
            assert path == "/chat/completions"
            self.payloads += payloads
            return [{"choices": [{"message": {"content": r}}]} for r in self.replies]

    client = Client(['{"score": 4}', "2", "fine"])
    summary, rows = llm_ad_eval(client, ["he runs", "she sits", "x"], ["he runs away", "she stands", "y"])
    assert summary == {"llm_ad_eval": 3.0, "llm_ad_eval_scored": 2.0, "llm_ad_eval_unparsable": 1.0}
    assert [r["llm_ad_eval"] for r in rows] == [4, 2, None] and rows[2]["llm_ad_eval_reply"] == "fine"
    payload = client.payloads[0]
    assert payload["temperature"] == 0.0 and "he runs away" in payload["messages"][1]["content"]


def test_skipped_metrics_are_listed_with_their_reason():
    class ADTask:
        reference_field = "ad"

    skipped = skipped_metrics(ADTask(), {"bleu1": 0.1, "bertscore": 0.5}, no_meteor=True)
    assert skipped["spice"].startswith("skipped (needs Java + the Stanford CoreNLP models")
    assert skipped["meteor"] == "skipped (turned off by --no-meteor)"
    assert set(skipped) == {"spice", "meteor", "recall@5/16", "recall@1/5", "action", "llm_ad_eval", "logp"}
    assert "bertscore" not in skipped
    assert set(skipped_metrics(object(), {"meteor": 0.2, "bertscore": 0.5})) == {"spice"}


@pytest.mark.slow
def test_evaluate_table_shows_skipped_metrics(toy_movie, tmp_path, capsys):
    from agentcap.commands.evaluate import evaluate_command

    rows = [json.loads(line) for line in (toy_movie / "test.jsonl").read_text().splitlines()]
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps({"id": r["id"], "caption": r["ad"]}) + "\n" for r in rows))
    assert evaluate_command(["--predictions", str(predictions), "--env", "agentcap/ADClip-v0",
                             "--manifest", str(toy_movie / "test.jsonl"), "--no-meteor"]) == 0
    table = capsys.readouterr().out
    assert "skipped (needs Java + the Stanford CoreNLP models" in table
    assert "skipped (turned off by --no-meteor)" in table and "llm_ad_eval" in table


@pytest.mark.slow
def test_benchmark_end_to_end_with_an_untrained_toy_system(toy_soundscapes, tmp_path, capsys, monkeypatch):
    """`agentcap evaluate --benchmark` on the toy world's benchmark: a tiny untrained ClozeCaption policy
    captions the test clips, the rule judge answers; a rerun never runs the captioner."""
    from agentcap.commands import evaluate

    world = toy_soundscapes
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"seed_everything": 0, "model": {
        "run_dir": str(tmp_path / "run"),
        "env": {"id": "agentcap/ClozeCaption-v0", "kwargs": {"prompt": "compact", "examiner": "rule"},
                "train": {"manifest": str(world / "train.jsonl")}, "test": {"manifest": str(world / "test.jsonl")}},
        "agents": {"policy": {"toy": {"media": "audio", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                                      "intermediate_size": 32},
                              "build_tokenizer_from": [str(world / "texts.txt")], "max_new_tokens": 6}},
        "stages": [{"name": "evaluate", "kind": "evaluate", "split": "test"}]}}))
    bench = world / "benchmark.jsonl"
    out = tmp_path / "out"
    argv = ["--benchmark", str(bench), "--config", str(config), "--judge", "rule", "--out", str(out)]
    assert evaluate.evaluate_command(argv) == 0
    summary = json.loads((out / "benchmark_summary.json").read_text())
    n = len(bench.read_text().splitlines())
    assert summary["overall"]["count"] == n and summary["failed_clips"] == 0
    items = [json.loads(line) for line in (out / "benchmark_items.jsonl").read_text().splitlines()]
    assert len(items) == n and all(isinstance(i["caption"], str) for i in items)
    assert summary["overall"]["correct"] == sum(i["correct"] for i in items)
    assert "sound identification" in capsys.readouterr().out  # the per-task table

    def no_captioning(*args):
        raise AssertionError("the captions are cached; the captioner must not run")

    monkeypatch.setattr(evaluate, "caption_clips", no_captioning)
    assert evaluate.evaluate_command(argv) == 0
    assert json.loads((out / "benchmark_summary.json").read_text())["overall"] == summary["overall"]
