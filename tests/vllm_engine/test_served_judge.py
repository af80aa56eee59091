"""The examiner and coherence scorer served by a real ``vllm serve`` on loopback (SmolLM2-135M)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from agentcap.judges import build_examiner  # noqa: E402
from agentcap.judges.questions import LETTERS, Question  # noqa: E402
from agentcap.judges.served import ServedClient, ServedCoherenceScorer  # noqa: E402

NAME = "smollm2-judge"  # the --served-model-name of conftest.py's `server`

QUESTIONS = [
    Question("The dog barks ___ times.", ("two", "three", "five", "seven", "Not given"), "B"),
    Question("The beep is ___ in pitch.", ("low", "medium", "deep", "high", "Not given"), "D"),
]


def test_served_examiner_reads_letters_batched(server):
    examiner = build_examiner({"url": server, "model": NAME, "batch_size": 4, "timeout": 120})
    captions = ["The dog barks three times.", "A loud high beep sounds.", "The dog barks three times.", ""]
    questions = [QUESTIONS[0], QUESTIONS[1], QUESTIONS[0], QUESTIONS[1]]
    scores = examiner.letter_logits(captions, questions)
    assert scores.shape == (4, 5)
    assert torch.isfinite(scores).all(), "every letter is among the restricted top log-probs"
    assert torch.allclose(scores.exp().sum(1), torch.ones(4), atol=1e-3), "the readout is restricted to A-E"
    assert torch.equal(scores[0], scores[2])
    answers = examiner.answer(captions, questions)
    assert all(a in LETTERS for a in answers)


def test_served_coherence_scorer_matches_the_local_one(server, smollm2_folder):
    from agentcap.judges.coherence import CoherenceScorer

    client = ServedClient(server, NAME, timeout=120)
    served = ServedCoherenceScorer(client, str(smollm2_folder))
    local = CoherenceScorer.from_pretrained(smollm2_folder)
    contexts = [["A man opens the door."], ["Rain falls."], []]
    responses = ["He walks into the dark room.", "A woman runs to her car.", "Nothing."]
    a, b = served.score(contexts, responses), local.score(contexts, responses)
    assert torch.isnan(a[2]) and torch.isnan(b[2])
    assert torch.allclose(a[:2], b[:2], atol=1e-2), (a, b)
