"""tools/instruct_probe.py: what an Instruct claims about each sound, against the gold events and c0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import instruct_probe  # noqa: E402

from agentcap_envs.real.speech import EFFECTS  # noqa: E402


@pytest.mark.parametrize("answer, expected", [
    ("The bell is heard from 0.2 s to 0.4 s.", (True, 0.2)),
    ("The bell is heard at 12 s.", (True, 12.0)),
    ("The bell is not heard.", (False, None)),
    ("No bell is heard from 0.2 s to 0.4 s.", (False, None)),
    ("A bell dings.", (False, None)),  # no time: not a claim the game can place
])
def test_claim(answer, expected):
    assert instruct_probe.claim(answer) == expected


def test_rows_split_claims_by_presence_and_by_c0():
    bell, shutter = (next(e for e in EFFECTS if e.key == k) for k in ("bell", "shutter"))
    items = [{"id": "a", "events": [{"type": "effect", "label": "bell", "onset": 1.0},
                                    {"type": "effect", "label": "camera shutter", "onset": 3.0},
                                    {"type": "speech", "label": "speech", "onset": 4.0}]}]
    answers = ["The bell is heard from 1.2 s to 1.5 s.", "The camera shutter is heard from 0.2 s to 0.4 s."]
    rows = instruct_probe.probe_rows(items, ["From 1.0 s to 1.4 s, a bell dings."], answers, [bell, shutter])
    assert [(r["present"], r["in_c0"], r["claims"], r["on_time"]) for r in rows] == \
        [(True, True, True, True), (True, False, True, False)]  # the shutter's claim is 2.8 s early
    # a yes-sayer on a clip lacking the shutter: the same claim rate on present and absent sounds
    rows += instruct_probe.probe_rows([{"id": "b", "events": []}], ["", ""], answers, [bell, shutter])
    table = instruct_probe.table(rows)
    assert "| all | 1.00 (2) | 1.00 (2) |" in table
    assert "| not named in c0 (what the game can add) | 1.00 (1) | 1.00 (2) |" in table
    assert "on time (0.5 s): 1 of 2" in table
