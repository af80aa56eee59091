"""agentcap.data.question_bank and ``agentcap data bank`` (tools/build_cloze_bank.py): every item is
validated (each rejection reason hand-checked), the rule writer's items are answerable exactly from
their own caption, the LLM writers keep only valid items and file the rest with reasons, a served
writer sends ``--batch-size`` requests at once, and a killed or failed run resumes without asking a
finished clip again (an in-process OpenAI-compatible server counts the requests)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from conftest import read_jsonl
from transformers import LlamaConfig, LlamaForCausalLM

from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.commands.bank import bank_command
from agentcap.data import question_bank as bank_tool
from agentcap.judges.questions import Question
from agentcap.judges.rule import RuleExaminer
from agentcap.rewards.functional.cloze import evidence_sufficiency
from agentcap_envs.cloze_caption import ClozeCaptionEnv
from agentcap_envs.evidence_game import EvidenceGameEnv

validate = bank_tool.validate_cloze_item

CAPTION = ("From 0.5 s to 1.8 s, a loud very high beep sounds three times. "
           "From 2.1 s to 4.0 s, a soft low hiss sounds once.")
GOOD = {"passage": "From 0.5 s to 1.8 s, a loud ___ beep sounds three times.",
        "options": ["low", "very high", "mid", "high", "Not given"], "answer": "B"}


def test_a_valid_item_has_no_reasons():
    assert validate(GOOD, CAPTION) == []
    assert validate({**GOOD, "answer": "b"}, CAPTION) == []  # letters are read case-insensitively


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"passage": "a ___ beep sounds ___."}, "exactly one blank '___', got 2"),
        ({"passage": "a loud beep."}, "exactly one blank '___', got 0"),
        ({"answer": "E"}, "field 'answer' is 'E'"),
        ({"answer": "Q"}, "must be one of A, B, C, D, got 'Q'"),
        ({"options": ["low", "very high", "mid", "Not given"]}, "exactly 5 options"),
        ({"options": ["low", "very high", "mid", "Low", "Not given"]}, "duplicate option 'Low'"),
        ({"options": ["low", "very high", "mid", "high", "None"]}, "option E must be 'Not given'"),
        ({"options": ["low", "very high", "mid", "high", "Not given"], "answer": "C"},
         "gold option C 'mid' (the masked fact) does not occur in the caption"),
        ({"passage": "The very high beep is ___."}, "already contains the gold option 'very high'"),
    ],
)
def test_each_rejection_reason(change, needle):
    reasons = validate({**GOOD, **change}, CAPTION)
    assert any(needle in reason for reason in reasons), reasons


def test_malformed_items_and_several_reasons_at_once():
    assert validate(["not", "a", "dict"], CAPTION)[0].startswith("item must be a JSON object")
    assert "missing field(s) ['answer']" in validate({"passage": "x ___", "options": []}, CAPTION)[0]
    reasons = validate({"passage": "no blank", "options": ["a", "a", "b", "c", "d"], "answer": "E"}, CAPTION)
    assert len(reasons) == 4  # option E, duplicate, gold E, blank count


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _bank(tmp_path: Path, *args: str) -> int:
    return bank_command(["--out", str(tmp_path / "bank.jsonl"), *args])


def _report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "bank.report.json").read_text())


def test_rule_mode_builds_answerable_items_deterministically(tmp_path):
    rows = [{"audio": "a.wav", "caption": CAPTION},
            {"audio": "b.wav", "caption": "A chirp sounds twice at 3 s."},
            {"audio": "c.wav", "caption": "Wind blows."}]
    source = _write_jsonl(tmp_path / "in.jsonl", rows)
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "rule") == 0
    banks = read_jsonl(tmp_path / "bank.jsonl")
    rejected = read_jsonl(tmp_path / "bank.rejected.jsonl")
    # caption 1: loudness, pitch, type, count for each of its two events; caption 2: type and count;
    # caption 3 has no item: left out of the bank (the environments refuse an empty one), filed as rejected
    assert [len(b["cloze"]) for b in banks] == [8, 2]
    assert [b["id"] for b in banks] == ["a.wav", "b.wav"]  # no id field: the audio path is the clip id
    assert all(b["mcq"] == b["cloze"] for b in banks)
    report = _report(tmp_path)
    assert {k: report[k] for k in ("clips", "clips_kept", "clips_rejected", "items_kept", "items_rejected")} == {
        "clips": 3, "clips_kept": 2, "clips_rejected": 1, "items_kept": 10, "items_rejected": 0}
    assert rejected[0]["audio"] == "c.wav" and "no items" in rejected[0]["reasons"][0]
    assert rejected[0]["where"].endswith("in.jsonl:3")
    first = banks[0]["cloze"][1]
    assert first["passage"] == "From 0.5 s to 1.8 s, a loud ___ beep sounds three times."
    assert first["options"]["ABCD".index(first["answer"])] == "very high"  # the longest value was masked
    assert first["meta"] == {"attribute": "pitch", "subject": "beep"}

    # every item loads as a Question and is answered exactly from its own caption, and not from nothing
    for bank in banks:
        questions = [Question.from_row(item) for item in bank["cloze"]]
        assert RuleExaminer().answer([bank["caption"]] * len(questions), questions) == [x.answer for x in questions]
        assert evidence_sufficiency([""], [questions], RuleExaminer()).item() == -0.5

    other = tmp_path / "again"
    other.mkdir()
    assert _bank(other, "--manifest", str(source), "--writer", "rule") == 0
    again = read_jsonl(other / "bank.jsonl")  # the same items again; audio paths relative to the bank's folder
    assert [row["audio"] for row in again] == ["../a.wav", "../b.wav"]
    assert [{**row, "audio": None} for row in again] == [{**row, "audio": None} for row in banks]
    # a finished bank, rerun: nothing asked, nothing changed
    before = (tmp_path / "bank.jsonl").read_bytes()
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "rule") == 0
    assert (tmp_path / "bank.jsonl").read_bytes() == before
    assert _report(tmp_path)["asked"] == 0 and _report(tmp_path)["resumed"] == 3


def test_rule_mode_custom_vocabulary_and_its_checks(tmp_path, capsys):
    source = _write_jsonl(tmp_path / "in.jsonl", [{"id": "x", "audio": "a.wav", "caption": "A dog barks twice."}])
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"animal": ["dog", "cat", "cow", "goat"],
                                 "count": ["once", "twice", "thrice", "often"]}))
    args = ["--manifest", str(source), "--writer", "rule", "--vocab", str(vocab), "--subject-class", "animal",
            "--fields", "cloze", "qa"]
    assert _bank(tmp_path, *args) == 0
    row = read_jsonl(tmp_path / "bank.jsonl")[0]
    items = row["cloze"]
    assert [i["passage"] for i in items] == ["A ___ barks twice.", "A dog barks ___."]
    assert all(i["meta"]["subject"] == "dog" for i in items)
    assert "mcq" not in row
    assert row["qa"] == [{"question": "What fills the blank: A ___ barks twice.", "answer": "A dog barks twice."},
                         {"question": "What fills the blank: A dog barks ___.", "answer": "A dog barks twice."}]
    vocab.write_text(json.dumps({"animal": ["dog", "cat", "cow"]}))
    (tmp_path / "bank.progress.jsonl").unlink()
    assert _bank(tmp_path, *args) == 2
    assert "class 'animal' needs >= 4 distinct values" in capsys.readouterr().err


def test_bad_input_rows_name_file_and_line(tmp_path, capsys):
    source = _write_jsonl(tmp_path / "in.jsonl", [{"audio": "a.wav", "caption": CAPTION}, {"audio": "b.wav"}])
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "rule") == 2
    assert "in.jsonl:2: missing field 'caption'" in capsys.readouterr().err
    source = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "audio": "a.wav", "caption": CAPTION},
                                                  {"id": "a", "audio": "b.wav", "caption": CAPTION}])
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "rule") == 2
    assert "in.jsonl:2: clip id 'a' repeats" in capsys.readouterr().err
    assert not (tmp_path / "bank.jsonl").exists()  # refused before anything is written


def test_items_from_llm_text():
    reply = 'Here you go:\n[{"passage": "a ___ beep", "options": ["x"], "answer": "A"}]\nDone.'
    assert bank_tool.items_from_text(reply) == [{"passage": "a ___ beep", "options": ["x"], "answer": "A"}]
    cut = 'Items: {"passage": "p1 ___"} and {"passage": "p2 ___", "options": ['  # a truncated reply
    assert bank_tool.items_from_text(cut) == [{"passage": "p1 ___"}]
    assert bank_tool.items_from_text("no json here") == []
    echoed = 'Caption... {"passage": "a ___", "options": ["two", "three", "five", "six", "Not given"], "ans'
    assert bank_tool.items_from_text(echoed) == []  # the echoed options list is not a list of items


def test_llm_mode_with_a_tiny_model_files_its_output(tmp_path):
    tokenizer = build_word_tokenizer([bank_tool.WRITER_PROMPT, CAPTION, "JSON [ ] { } passage options answer"])
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=32, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "writer")
    tokenizer.save_pretrained(tmp_path / "writer")
    source = _write_jsonl(tmp_path / "in.jsonl", [{"audio": "a.wav", "caption": CAPTION}])
    _bank(tmp_path, "--manifest", str(source), "--writer", f"hf:{tmp_path / 'writer'}", "--max-new-tokens", "12")
    # whatever a random model writes, the bank holds only valid items and every rejection has reasons
    kept = [item for row in read_jsonl(tmp_path / "bank.jsonl") for item in row["cloze"]]
    assert all(validate(item, CAPTION) == [] for item in kept)
    filed = read_jsonl(tmp_path / "bank.rejected.jsonl")
    report = _report(tmp_path)
    assert report["complete"] and report["items_kept"] == len(kept)
    assert sum(row["item"] is not None for row in filed) == report["items_rejected"]
    assert all(row["reasons"] for row in filed)


def test_the_bank_loads_in_both_environments(tmp_path, toy_soundscapes):
    """The bank of a manifest in another folder (relative audio paths rewritten) is what ClozeCaption
    (``cloze``, with the input's ``anchors``) and EvidenceGame (``mcq``, the input's ``qa``) read."""
    source = toy_soundscapes / "train.jsonl"
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "rule") == 0
    banks = {row["id"]: row for row in read_jsonl(tmp_path / "bank.jsonl")}
    assert len(banks) == len(read_jsonl(source))
    # both decode every clip's audio at load: the paths, relative to the bank's folder, find the files
    cloze = ClozeCaptionEnv(manifest=str(tmp_path / "bank.jsonl"))
    game = EvidenceGameEnv(manifest=str(tmp_path / "bank.jsonl"))
    for env, field in ((cloze, "cloze"), (game, "mcq")):
        assert len(env.items) == len(banks)
        for item in env.items:
            assert [q.passage for q in item["_questions"]] == [q["passage"] for q in banks[item["id"]][field]]


# --- a served writer: an in-process OpenAI-compatible server ----------------------------------------
class FakeWriterServer:
    """``/v1/chat/completions`` on loopback that writes items by ``reply(caption)`` (an int: that HTTP
    error status instead), counts requests and
    the most in flight at once, waits ``delay`` s per request, and answers 500 once ``fail_after``
    requests have been answered."""

    def __init__(self, reply, delay: float = 0.0, fail_after: int | None = None):
        self.reply, self.delay, self.fail_after = reply, delay, fail_after
        self.captions: list[str] = []  # the captions of answered requests
        self.requests = self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                caption = body["messages"][0]["content"].rsplit("Caption: ", 1)[1]
                with fake.lock:
                    fake.requests += 1
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                time.sleep(fake.delay)
                with fake.lock:
                    fake.in_flight -= 1
                    failing = fake.fail_after is not None and len(fake.captions) >= fake.fail_after
                    if not failing:
                        fake.captions.append(caption)
                content = fake.reply(caption)
                if failing or isinstance(content, int):  # an int reply: that HTTP error status
                    self.send_response(500 if failing else content)
                    self.end_headers()
                    self.wfile.write(b"overloaded" if failing else b"bad request")
                    return
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def writer_server():
    servers = []

    def start(reply, **kwargs):
        servers.append(FakeWriterServer(reply, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _valid_and_invalid(caption: str) -> str:
    """The rule writer's items for the caption, plus one invalid item (gold E) — as an LLM reply."""
    items = bank_tool.rule_items(caption, bank_tool.DEFAULT_VOCAB)
    bad = {**items[0], "answer": "E"}
    return "Here are the items:\n" + json.dumps([*items, bad])


def _clips(n: int) -> list[dict]:
    counts = ["once", "twice", "three times", "four times"]
    return [{"id": f"c{i}", "audio": f"c{i}.wav", "caption": f"In clip {i} a loud beep sounds {counts[i % 4]}."}
            for i in range(n)]


def _served(tmp_path: Path, server, source: Path, *extra: str) -> int:
    return _bank(tmp_path, "--manifest", str(source), "--writer", server.url, "--model", "writer", "--retries", "0",
                 "--timeout", "10", *extra)


def test_served_writer_sends_batch_size_requests_at_once(tmp_path, writer_server):
    server = writer_server(_valid_and_invalid, delay=0.1)
    source = _write_jsonl(tmp_path / "in.jsonl", _clips(10))
    assert _served(tmp_path, server, source, "--batch-size", "4") == 0
    assert server.requests == 10 and server.max_in_flight == 4
    assert [row["id"] for row in read_jsonl(tmp_path / "bank.jsonl")] == [f"c{i}" for i in range(10)]


def test_served_writer_rejects_and_counts_invalid_items(tmp_path, writer_server):
    def reply(caption):
        return "I cannot do that." if "three" in caption else _valid_and_invalid(caption)

    server = writer_server(reply)
    source = _write_jsonl(tmp_path / "in.jsonl", _clips(4))
    assert _served(tmp_path, server, source) == 0
    report = _report(tmp_path)
    # 3 clips × (loudness, type, count items kept + 1 with gold E rejected); c2 ("three times") replied no JSON
    assert {k: report[k] for k in ("clips_kept", "clips_rejected", "items_kept", "items_rejected")} == {
        "clips_kept": 3, "clips_rejected": 1, "items_kept": 9, "items_rejected": 3}
    filed = read_jsonl(tmp_path / "bank.rejected.jsonl")
    assert len(filed) == 4
    assert [row["id"] for row in filed if row["item"] is None] == ["c2"]
    assert "I cannot do that." in next(row for row in filed if row["item"] is None)["reasons"][0]
    assert all("field 'answer' is 'E'" in row["reasons"][0] for row in filed if row["item"] is not None)
    assert [row["id"] for row in read_jsonl(tmp_path / "bank.jsonl")] == ["c0", "c1", "c3"]


def test_served_writer_resumes_after_a_failure_and_a_kill(tmp_path, writer_server, capsys):
    server = writer_server(_valid_and_invalid, fail_after=5)
    clips = _clips(12)
    source = _write_jsonl(tmp_path / "in.jsonl", clips)
    assert _served(tmp_path, server, source, "--batch-size", "3") == 1
    assert "rerun the same command to ask the other 7 clips" in capsys.readouterr().err
    report = _report(tmp_path)
    assert not report["complete"] and report["clips_done"] == 5 and report["error"].startswith("JudgeUnavailable")
    done = [row["id"] for row in read_jsonl(tmp_path / "bank.progress.jsonl")]
    assert sorted(done) == sorted(clip["id"] for clip in clips if clip["caption"] in server.captions)
    assert len(done) == 5 and len(read_jsonl(tmp_path / "bank.jsonl")) == 5

    # a kill mid-clip: the last progress line torn, and a bank row written before its progress line
    # (its clip is asked again, and is then in the bank once)
    with open(tmp_path / "bank.progress.jsonl", "a") as handle:
        handle.write('{"id": "c11", "ke')
    row = dict(read_jsonl(tmp_path / "bank.jsonl")[0], id="c11")
    with open(tmp_path / "bank.jsonl", "a") as handle:
        handle.write(json.dumps(row) + "\n")

    server.fail_after, server.requests, server.captions = None, 0, []
    assert _served(tmp_path, server, source, "--batch-size", "3") == 0
    assert server.requests == 7  # only the unfinished clips were asked, each once
    assert sorted(server.captions) == sorted(clip["caption"] for clip in clips if clip["id"] not in done)
    report = _report(tmp_path)
    assert (report["resumed"], report["asked"], report["clips_done"], report["complete"]) == (5, 7, 12, True)
    assert (report["items_kept"], report["items_rejected"]) == (36, 12)
    bank = read_jsonl(tmp_path / "bank.jsonl")
    assert sorted(row["id"] for row in bank) == sorted(f"c{i}" for i in range(12))  # each clip once
    assert len(read_jsonl(tmp_path / "bank.rejected.jsonl")) == 12
    progress = read_jsonl(tmp_path / "bank.progress.jsonl")
    assert sorted(row["id"] for row in progress) == sorted(row["id"] for row in bank)


def test_progress_of_another_manifest_is_refused(tmp_path, capsys):
    _write_jsonl(tmp_path / "bank.progress.jsonl", [{"id": "elsewhere", "kept": 1, "rejected": 0}])
    source = _write_jsonl(tmp_path / "in.jsonl", _clips(2))
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "rule") == 2
    assert "clip id(s) ['elsewhere'] are not in the manifest" in capsys.readouterr().err


def test_writer_arguments_and_a_refused_request(tmp_path, writer_server, capsys):
    source = _write_jsonl(tmp_path / "in.jsonl", _clips(3))
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "gpt") == 2
    assert "--writer 'gpt': expected rule, hf:PATH or http://HOST:PORT/v1" in capsys.readouterr().err
    assert _bank(tmp_path, "--manifest", str(source), "--writer", "http://127.0.0.1:9/v1") == 2
    assert "needs --model NAME" in capsys.readouterr().err
    # a refused request (4xx) is not retried and stops the run; the clips answered are kept
    server = writer_server(lambda caption: 400 if "clip 2" in caption else _valid_and_invalid(caption))
    assert _served(tmp_path, server, source, "--batch-size", "1") == 1
    assert "rerun the same command to ask the other 1 clips" in capsys.readouterr().err
    assert server.requests == 3 and [row["id"] for row in read_jsonl(tmp_path / "bank.jsonl")] == ["c0", "c1"]
