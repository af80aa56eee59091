"""Caption-as-evidence benchmark and LLM-AD-Eval against a real ``vllm serve`` on loopback (SmolLM2-135M)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from agentcap.evaluation.ad_eval import llm_ad_eval  # noqa: E402
from agentcap.evaluation.benchmark import (  # noqa: E402
    Ask, build_benchmark_judge, evaluate_benchmark, parse_judge_spec, read_benchmark,
)
from agentcap.judges.served import ServedClient  # noqa: E402

NAME = "smollm2-judge"  # the --served-model-name of conftest.py's `server`


def test_served_judge_answers_within_each_questions_letters(server):
    assert parse_judge_spec(server) == {"url": server, "model": NAME}  # the server's only model
    assert parse_judge_spec(f"{server}#{NAME}") == {"url": server, "model": NAME}
    judge = build_benchmark_judge(parse_judge_spec(json.dumps({"url": server, "model": NAME, "timeout": 120})))
    asks = [Ask("A dog barks twice.", "Which animal is heard?", ("cat", "dog")),
            Ask("A dog barks twice.", "How often does the dog bark?", ("once", "twice", "three times")),
            Ask("", "What is heard?", tuple(f"sound {k}" for k in range(10)))]
    letters = judge.choose(asks)
    assert letters[0] in "AB" and letters[1] in "ABC" and letters[2] in "ABCDEFGHIJ"
    assert judge.choose(asks) == letters  # greedy


def test_benchmark_flow_against_the_server(server, toy_soundscapes, tmp_path):
    rows = read_benchmark(str(toy_soundscapes / "benchmark.jsonl"))[:8]
    gold = {r["audio"]: r["caption"] for r in map(json.loads, (toy_soundscapes / "test.jsonl").read_text().splitlines())}
    by_clip = {r["_clip"]: gold[r["audio"]] for r in rows}

    def captioner(clips):
        return {c: {"caption": by_clip[c]} for c in clips}

    judge = build_benchmark_judge({"url": server, "model": NAME, "timeout": 120})
    summary = evaluate_benchmark(rows, captioner, "gold captions", judge, str(tmp_path))
    assert summary["overall"]["count"] == 8 and summary["unanswered"] == 0
    items = [json.loads(line) for line in (tmp_path / "benchmark_items.jsonl").read_text().splitlines()]
    assert all(i["letter"] in "ABCDEFGHIJ"[: len(i["choices"])] for i in items)

    class Refusing:
        identity = judge.identity

        def choose(self, asks):
            raise AssertionError("every answer is cached")

    assert evaluate_benchmark(rows, captioner, "gold captions", Refusing(), str(tmp_path))["overall"] == summary["overall"]


def test_llm_ad_eval_against_the_server(server):
    client = ServedClient(server, NAME, timeout=120)
    summary, rows = llm_ad_eval(client, ["He opens the door.", "She smiles."], ["He opens the door.", "A car drives off."])
    assert summary["llm_ad_eval_scored"] + summary["llm_ad_eval_unparsable"] == 2
    assert all(r["llm_ad_eval"] is None or 1 <= r["llm_ad_eval"] <= 5 for r in rows)
    assert all(isinstance(r["llm_ad_eval_reply"], str) for r in rows)
