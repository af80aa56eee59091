"""A served judge's replies are validated (agentcap.judges.replies): a letter outside the options, a
reply from another model, a non-finite log-prob, a malformed or oversized body is asked again, then
counted and never read as an answer; a judge past the invalid share stops the run; a benchmark never
caches an invalid answer. The judge is a loopback stand-in for ``vllm serve``."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentcap.judges.questions import Question
from agentcap.judges.replies import MAX_REPLY_BYTES, InvalidReply, TooManyInvalidReplies

MODEL = "examiner"
QUESTION = Question("A ___ sounds.", ("beep", "hiss", "knock", "bell", "Not given"), "A")


def reply(letter: str, *, model: str = MODEL, logprob: float = -0.1) -> dict:
    return {"model": model, "choices": [{"message": {"role": "assistant", "content": letter},
                                         "logprobs": {"content": [{"token": letter, "logprob": logprob,
                                                                   "top_logprobs": [{"token": letter, "logprob": logprob}]}]}}]}


#: What the server answers to a caption starting with each mode (the first asks of "flaky": "Z").
MODES = {
    "good": lambda: json.dumps(reply("B")),
    "Z": lambda: json.dumps(reply("Z")),
    "F": lambda: json.dumps(reply("F")),  # one past the examiner's last option E
    "lower": lambda: json.dumps(reply("b")),
    "foreign": lambda: json.dumps(reply("B", model="another-model")),
    "nan": lambda: json.dumps(reply("B", logprob=float("nan"))),  # Python writes NaN, as a broken server may
    "inf": lambda: json.dumps(reply("B", logprob=float("inf"))),
    "malformed": lambda: '{"choices": [',
    "nochoices": lambda: json.dumps({"model": MODEL, "choices": []}),
    "huge": lambda: json.dumps({**reply("B"), "padding": "x" * (MAX_REPLY_BYTES + 10)}),
}


@pytest.fixture
def judge_server():
    """Answers ``/v1/chat/completions`` by the mode the caption names (``state["always"]``: that mode,
    whatever the caption); ``/tokenize`` one id per letter. ``state["repaired"]`` makes every mode
    answer "B" properly; ``asked`` counts requests per mode."""
    asked: Counter = Counter()
    state = {"repaired": False}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":
                body = json.dumps({"tokens": [ord(payload["prompt"])]})
            else:
                text = payload["messages"][-1]["content"]
                mode = state.get("always") or next(m for m in sorted(MODES, key=len, reverse=True)
                                                   if f"Caption: {m} " in text)
                asked[mode] += 1
                body = MODES["good" if state["repaired"] else mode]()
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # 30 questions in flight at once: no connection dropped by a short backlog

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", asked, state
    finally:
        server.shutdown()
        server.server_close()


def client(url, **kwargs):
    from agentcap.judges.served import ServedClient

    return ServedClient(url, MODEL, backoff=0.01, **{"retries": 2, **kwargs})


def test_invalid_examiner_replies_are_retried_counted_and_never_read_as_answers(judge_server):
    from agentcap.judges.served import ServedExaminer

    url, asked, _ = judge_server
    examiner = ServedExaminer(client(url))
    bad = [m for m in MODES if m != "good"]
    captions = [f"{m} sound." for m in bad] + [f"good sound {i}." for i in range(20)]  # 9 invalid of 29: 31 %
    with pytest.raises(TooManyInvalidReplies) as stopped:
        examiner.answer(captions, [QUESTION] * len(captions))
    line = str(stopped.value)
    assert "\n" not in line and url in line and f"model '{MODEL}'" in line and "9 of 29 replies invalid (31.0%" in line
    assert {m: asked[m] for m in bad} == {m: 3 for m in bad}  # each asked 1 + 2 retries
    assert examiner.tally.invalid == 9


def test_below_the_share_invalid_answers_are_none_and_the_rest_are_read(judge_server):
    from agentcap.judges.replies import invalid_count
    from agentcap.judges.served import ServedExaminer

    url, asked, _ = judge_server
    examiner = ServedExaminer(client(url))
    before = invalid_count()
    captions = ["Z sound."] + ["good sound."] + [f"good sound {i}." for i in range(30)]
    letters = examiner.answer(captions, [QUESTION] * len(captions))
    assert letters[0] is None and letters[1:] == ["B"] * 31  # never "A"
    assert invalid_count() == before + 1 and examiner.tally.asked == 32


def test_a_reply_valid_on_retry_is_read(judge_server):
    from agentcap.judges.served import ServedExaminer

    url, asked, state = judge_server
    flaky = ServedExaminer(client(url, retries=0))
    assert flaky.answer(["nan sound."], [QUESTION]) == [None]
    state["repaired"] = True
    assert flaky.answer(["nan sound."], [QUESTION]) == ["B"]


def test_rewards_leave_invalid_answers_out():
    from agentcap.rewards.functional.cloze import evidence_sufficiency

    class Examiner:
        def answer(self, captions, questions):
            return [None if c == "bad" else "A" for c in captions]

    class OneBad:
        def answer(self, captions, questions):
            return [None if q.passage.startswith("X") else "B" for q in questions]

    other = Question("X ___ sounds.", QUESTION.options, "A")
    assert evidence_sufficiency(["good"], [[QUESTION]], Examiner()).tolist() == [1.0]
    assert evidence_sufficiency(["c"], [[QUESTION, other]], OneBad()).tolist() == [-1.0]  # the valid one only
    with pytest.raises(TooManyInvalidReplies, match="no valid answer to any of caption 0's 1 questions"):
        evidence_sufficiency(["bad"], [[QUESTION]], Examiner())


def test_without_a_validator_an_invalid_reply_is_one_line_naming_the_url(judge_server):
    url, _, _ = judge_server
    with pytest.raises(InvalidReply, match=r"/v1/chat/completions \(model 'examiner'\): invalid reply after 1 "):
        client(url, retries=0).post("/chat/completions", {"messages": [{"content": "Caption: malformed x"}]})


# --- the benchmark judge ----------------------------------------------------------------------------
def test_benchmark_invalid_answers_are_not_cached_and_a_rerun_asks_them_again(judge_server, tmp_path):
    from agentcap.evaluation.benchmark import ServedJudge, evaluate_benchmark

    url, asked, state = judge_server
    modes = ["good", "Z", "C", "foreign", "nan"]  # "C": one past the last of two options (A, B)
    rows = [{"id": f"q{i}", "_clip": f"/clips/{m}.wav", "audio": f"{m}.wav", "question": "What sounds?",
             "choices": ["beep", "hiss"], "answer": "B"} for i, m in enumerate(modes)]
    MODES["C"] = lambda: json.dumps(reply("C"))
    try:
        captioner = lambda clips: {c: {"caption": c.rsplit("/", 1)[-1].removesuffix(".wav") + " sound."}  # noqa: E731
                                   for c in clips}
        out = str(tmp_path / "out")
        first = evaluate_benchmark(rows, captioner, "cap", ServedJudge(client(url)), out)
        assert first["invalid"] == 4 and first["overall"]["correct"] == 1 and first["unanswered"] == 0
        items = [json.loads(line) for line in open(f"{out}/benchmark_items.jsonl")]
        assert [i["letter"] for i in items] == ["B", None, None, None, None]
        assert "another-model" in items[3]["invalid"] and "'C', not one of the options A–B" in items[2]["invalid"]
        state["repaired"] = True
        asked.clear()
        second = evaluate_benchmark(rows, captioner, "cap", ServedJudge(client(url)), out)
        assert sum(asked.values()) == 4 and "good" not in asked  # the valid answer cached, the invalid asked again
        assert second["invalid"] == 0 and second["overall"]["correct"] == 5
    finally:
        del MODES["C"]


def test_benchmark_stops_past_the_invalid_share(judge_server, tmp_path):
    from agentcap.evaluation.benchmark import ServedJudge, evaluate_benchmark

    url, _, _ = judge_server
    rows = [{"id": f"q{i}", "_clip": f"/clips/{'Z' if i < 3 else 'good'}{i}.wav", "audio": "x.wav",
             "question": "What sounds?", "choices": ["beep", "hiss"], "answer": "B"} for i in range(30)]
    captioner = lambda clips: {c: {"caption": ("Z" if "/Z" in c else "good") + " sound " + c[-6:]}  # noqa: E731
                               for c in clips}
    with pytest.raises(TooManyInvalidReplies, match=r"benchmark judge served:http://127\.0\.0\.1:\d+/v1#examiner: "
                                                     r"3 of 30 replies invalid \(10\.0%, more than 5%"):
        evaluate_benchmark(rows, captioner, "cap", ServedJudge(client(url, retries=0)), str(tmp_path / "out"))


def test_local_benchmark_judge_reads_non_finite_scores_as_invalid():
    from agentcap.evaluation.benchmark import Ask, _best_letters
    from agentcap.judges.replies import Invalid

    asks = [Ask("c", "q", ("a", "b"))] * 3
    out = _best_letters([[0.0, float("nan")] + [0.0] * 8, [-1.0, -0.5] + [float("nan")] * 8,
                         [float("inf"), 0.0] + [0.0] * 8], asks)
    assert isinstance(out[0], Invalid) and out[1] == "B" and isinstance(out[2], Invalid)


# --- the commands: one line, no traceback ---------------------------------------------------------------
def test_evaluate_benchmark_past_the_share_is_one_line_naming_the_judge(judge_server, tmp_path, capsys):
    """``TooManyInvalidReplies`` reached the user as a traceback (tools/repro_faults.py case 1c)."""
    from agentcap.commands.evaluate import evaluate_command

    url, _, state = judge_server
    state["always"] = "nan"
    bench, captions = tmp_path / "bench.jsonl", tmp_path / "captions.jsonl"
    bench.write_text("".join(json.dumps({"id": f"q{i}", "audio": f"c{i}.wav", "question": "What sounds?",
                                         "choices": ["beep", "hiss"], "answer": "B", "answer_text": "hiss", "benchmark": "mmau",
                                         "task": "sound", "category": "sound", "subcategory": None, "layer": None,
                                         "duration": 1.0}) + "\n"
                             for i in range(24)))
    captions.write_text("".join(json.dumps({"id": f"q{i}", "caption": f"a hiss {i}."}) + "\n" for i in range(24)))
    judge = json.dumps({"url": url, "model": MODEL, "retries": 0})
    with pytest.raises(SystemExit) as stopped:
        evaluate_command(["--benchmark", str(bench), "--predictions", str(captions), "--judge", judge,
                          "--out", str(tmp_path / "out")])
    assert str(stopped.value).startswith(f"agentcap evaluate: benchmark judge served:{url}#{MODEL}: 24 of 24 replies "
                                         "invalid (100.0%, more than 5%; last: the chosen token's log-prob is nan")


@pytest.mark.slow  # a tiny ACE-Cap fit in process
def test_fit_with_an_examiner_past_the_share_is_one_line_naming_it(judge_server, tmp_path, toy_soundscapes,
                                                                   make_game_config, capsys):
    """The fit stopped with ``TooManyInvalidReplies``'s traceback (tools/repro_faults.py case 1a)."""
    from agentcap.cli import main

    url, _, state = judge_server
    state["always"] = "Z"
    stages = [{"name": "g", "kind": "grpo", "agent": "captioner", "steps": 2, "env": {"mode": "captioner"}}]
    config = make_game_config(tmp_path / "run", toy_soundscapes, stages)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), "--model.env.kwargs.examiner",
              json.dumps({"url": url, "model": MODEL, "retries": 0})])
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"agentcap: examiner {url} (model '{MODEL}'): ")
    assert "replies invalid (100.0%, more than 5%; last: answered 'Z', not one of the options A–E)" in err
