"""``agentcap data bank`` with a real ``vllm serve`` (SmolLM2-135M) as the writer: the flow completes
and its counts add up. A 135M model writes poor items; what is checked is the flow, not the items."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from agentcap.commands.bank import bank_command  # noqa: E402
from agentcap.data.question_bank import validate_cloze_item  # noqa: E402

NAME = "smollm2-judge"  # the --served-model-name of conftest.py's `server`

CLIPS = [
    {"id": "dog", "audio": "dog.wav", "caption": "A dog barks three times, then a car passes by loudly."},
    {"id": "rain", "audio": "rain.wav", "caption": "Heavy rain falls on a tin roof while a man speaks softly."},
]


def _rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_served_writer_flow_and_counts(server, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in CLIPS), encoding="utf-8")
    out = tmp_path / "bank.jsonl"
    # max-model-len is 512 on the test server: the prompt (~250 tokens) and the reply must fit
    args = ["--manifest", str(source), "--out", str(out), "--writer", server, "--model", NAME,
            "--batch-size", "2", "--max-new-tokens", "160", "--timeout", "600"]
    assert bank_command(args) == 0
    report = json.loads((tmp_path / "bank.report.json").read_text())
    assert report["complete"] and report["asked"] == 2 and report["clips_done"] == 2
    assert report["clips_kept"] + report["clips_rejected"] == 2

    bank, rejected = _rows(out), _rows(tmp_path / "bank.rejected.jsonl")
    captions = {clip["id"]: clip["caption"] for clip in CLIPS}
    assert len(bank) == report["clips_kept"]
    assert sum(len(row["cloze"]) for row in bank) == report["items_kept"]
    assert all(validate_cloze_item(item, captions[row["id"]]) == [] for row in bank for item in row["cloze"])
    assert sum(row["item"] is not None for row in rejected) == report["items_rejected"]
    assert all(row["reasons"] for row in rejected)
    # every clip is accounted for: in the bank, or filed with no valid item
    no_valid = {row["id"] for row in rejected} - {row["id"] for row in bank}
    assert no_valid == {clip["id"] for clip in CLIPS} - {row["id"] for row in bank}
    assert len(no_valid) == report["clips_rejected"]

    assert bank_command(args) == 0  # finished: nothing asked again
    again = json.loads((tmp_path / "bank.report.json").read_text())
    assert (again["asked"], again["resumed"], again["items_kept"]) == (0, 2, report["items_kept"])
