"""agentcap.data.question_bank (tools/build_cloze_bank.py): every item is validated (each rejection
reason hand-checked), the rule writer's items are answerable exactly from their own caption, and the
LLM writer's path keeps only valid items and files the rest with reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import read_jsonl
from transformers import LlamaConfig, LlamaForCausalLM

from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.core.manifests import ManifestError
from agentcap.data import question_bank as bank_tool
from agentcap.judges.examiner import Question, RuleExaminer
from agentcap.rewards.functional.cloze import evidence_sufficiency

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


def test_rule_mode_builds_answerable_items_deterministically(tmp_path):
    rows = [{"audio": "a.wav", "caption": CAPTION},
            {"audio": "b.wav", "caption": "A chirp sounds twice at 3 s."},
            {"audio": "c.wav", "caption": "Wind blows."}]
    source = _write_jsonl(tmp_path / "in.jsonl", rows)
    args = ["--input", str(source), "--rule", "--out", str(tmp_path / "bank.jsonl"),
            "--rejected", str(tmp_path / "rejected.jsonl")]
    counts = bank_tool.main(args)
    banks = read_jsonl(tmp_path / "bank.jsonl")
    rejected = read_jsonl(tmp_path / "rejected.jsonl")
    # caption 1: loudness, pitch, type, count for each of its two events; caption 2: type and count
    assert [len(b["cloze"]) for b in banks] == [8, 2] + [0]
    assert counts == {"rows": 3, "accepted": 10, "rejected": 1}
    assert rejected[0]["audio"] == "c.wav" and "no items" in rejected[0]["reasons"][0]
    assert rejected[0]["where"].endswith("in.jsonl:3")
    first = banks[0]["cloze"][1]
    assert first["passage"] == "From 0.5 s to 1.8 s, a loud ___ beep sounds three times."
    assert first["options"]["ABCD".index(first["answer"])] == "very high"  # the longest value was masked
    assert first["meta"] == {"attribute": "pitch", "subject": "beep"}

    # every item loads as a Question and is answered exactly from its own caption, and not from nothing
    for bank in banks[:2]:
        questions = [Question.from_row(item) for item in bank["cloze"]]
        assert RuleExaminer().answer([bank["caption"]] * len(questions), questions) == [x.answer for x in questions]
        assert evidence_sufficiency([""], [questions], RuleExaminer()).item() == -0.5

    before = (tmp_path / "bank.jsonl").read_bytes()
    bank_tool.main(args)
    assert (tmp_path / "bank.jsonl").read_bytes() == before


def test_rule_mode_custom_vocabulary_and_its_checks(tmp_path):
    source = _write_jsonl(tmp_path / "in.jsonl", [{"audio": "a.wav", "caption": "A dog barks twice."}])
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"animal": ["dog", "cat", "cow", "goat"],
                                 "count": ["once", "twice", "thrice", "often"]}))
    out, bad = tmp_path / "bank.jsonl", tmp_path / "rejected.jsonl"
    bank_tool.main(["--input", str(source), "--rule", "--vocab", str(vocab), "--subject-class", "animal",
                    "--out", str(out), "--rejected", str(bad)])
    items = read_jsonl(out)[0]["cloze"]
    assert [i["passage"] for i in items] == ["A ___ barks twice.", "A dog barks ___."]
    assert all(i["meta"]["subject"] == "dog" for i in items)
    vocab.write_text(json.dumps({"animal": ["dog", "cat", "cow"]}))
    with pytest.raises(ValueError, match="class 'animal' needs >= 4 distinct values"):
        bank_tool.main(["--input", str(source), "--rule", "--vocab", str(vocab), "--subject-class", "animal",
                        "--out", str(out), "--rejected", str(bad)])


def test_bad_input_rows_name_file_and_line(tmp_path):
    source = _write_jsonl(tmp_path / "in.jsonl", [{"audio": "a.wav", "caption": CAPTION}, {"audio": "b.wav"}])
    with pytest.raises(ManifestError, match=r"in\.jsonl:2: missing field 'caption'"):
        bank_tool.main(["--input", str(source), "--rule", "--out", str(tmp_path / "o"),
                        "--rejected", str(tmp_path / "r")])


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
    out, bad = tmp_path / "bank.jsonl", tmp_path / "rejected.jsonl"
    counts = bank_tool.main(["--input", str(source), "--model", str(tmp_path / "writer"), "--out", str(out),
                             "--rejected", str(bad), "--max-new-tokens", "12"])
    # whatever a random model writes, the bank holds only valid items and every rejection has reasons
    kept = read_jsonl(out)[0]["cloze"]
    assert all(validate(item, CAPTION) == [] for item in kept)
    filed = read_jsonl(bad)
    assert counts["accepted"] == len(kept) and counts["rejected"] == len(filed)
    assert all(row["reasons"] for row in filed)
