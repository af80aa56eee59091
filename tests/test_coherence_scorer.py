"""Coherence scorer (READ Eq. 4) and its fine-tuning tool: hand-computed Eq. 4 with a deterministic
bigram LM, anti-copy masking defeating a copying response, batched == one-by-one with a tiny GPT-2,
and the tool's saved scorer loading back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.judges import coherence_training
from agentcap.judges.coherence import CoherenceScorer, encode_context_response, serialize_context
from agentcap.rewards.functional.read import coherence_reward

NAN = float("nan")
HIGH = 4.0  # logit of a bigram the fake LM "knows"


class BigramLM(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the current token: logits = W[token]."""

    def __init__(self, vocab_size: int, known: list[tuple[int, int]]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(vocab_size, vocab_size))
        with torch.no_grad():
            for a, b in known:
                self.weight[a, b] = HIGH
        self.config = SimpleNamespace(n_positions=64)
        self.calls = 0

    def forward(self, input_ids, attention_mask=None):
        self.calls += 1
        return SimpleNamespace(logits=self.weight[input_ids])


CONTEXT = ["the man opens the door"]
TEXTS = [*CONTEXT, "the man opens the door quietly", "a woman smiles", "Anna picks up the red cup .",
         "Tom walks to the window slowly .", "Maria reads a letter ."]


@pytest.fixture(scope="module")
def tokenizer():
    return build_word_tokenizer(TEXTS)


@pytest.fixture(scope="module")
def bigram_scorer(tokenizer):
    ids = tokenizer.convert_tokens_to_ids
    # the LM knows every bigram of the context (so copying it is likely) and "a woman" (AD style)
    known = [(ids(a), ids(b)) for a, b in [("the", "man"), ("man", "opens"), ("opens", "the"), ("the", "door"),
                                           ("a", "woman")]]
    return CoherenceScorer(BigramLM(len(tokenizer), known), tokenizer, batch_size=8)


def test_serialize_context():
    assert serialize_context(["A man runs. ", "  ", "He stops."]) == "A man runs.\nHe stops.\n"
    assert serialize_context([]) == ""
    with pytest.raises(TypeError):
        serialize_context("A man runs.")


def test_encode_context_response_prefix_and_truncation(tokenizer):
    ids = tokenizer.convert_tokens_to_ids
    prefix, response, context = encode_context_response(tokenizer, CONTEXT, " a woman smiles ")
    assert prefix == [tokenizer.bos_token_id] + ids(["the", "man", "opens", "the", "door"])
    assert response == ids(["a", "woman", "smiles"]) and context == prefix[1:]
    # 6 positions: BOS + 3 response tokens leaves 2 context tokens, the most recent ones
    prefix, response, context = encode_context_response(tokenizer, CONTEXT, "a woman smiles", max_length=6)
    assert prefix == [tokenizer.bos_token_id] + ids(["the", "door"]) and len(response) == 3 and len(context) == 5
    # a response too long to fit keeps its head and one context token
    prefix, response, _ = encode_context_response(tokenizer, CONTEXT, "a woman smiles a woman smiles", max_length=4)
    assert prefix == [tokenizer.bos_token_id, ids("door")] and response == ids(["a", "woman"])


def test_eq4_hand_computed_and_anti_copy(bigram_scorer, tokenizer):
    vocab = len(tokenizer)
    uniform = -math.log(vocab)  # a token whose row has no known bigram
    known_1 = HIGH - math.log(math.exp(HIGH) + vocab - 1)  # the one known bigram of its row
    known_2 = HIGH - math.log(2 * math.exp(HIGH) + vocab - 2)  # "the" has two known successors

    copy_verbatim = "the man opens the door"
    copy_plus = "the man opens the door quietly"
    fresh = "a woman smiles"
    responses = [copy_verbatim, copy_plus, fresh]

    masked = bigram_scorer.score([CONTEXT] * 3, responses, n=3)
    # copy_plus: the first five tokens sit in copied 3-grams; only "quietly" | "door" counts (row of
    # "door" is all zeros). fresh: "a" | "door", "woman" | "a", "smiles" | "woman".
    assert math.isnan(masked[0])
    assert masked[1].item() == pytest.approx(uniform, abs=1e-6)
    assert masked[2].item() == pytest.approx((uniform + known_1 + uniform) / 3, abs=1e-6)

    # without the mask (n longer than any response) the copy wins through its copied tokens
    plain = bigram_scorer.score([CONTEXT] * 3, responses, n=50)
    # copy_plus: the|door, man|the, opens|man, the|opens, door|the, quietly|door
    expected_copy_plus = (uniform + known_2 + known_1 + known_1 + known_2 + uniform) / 6
    assert plain[1].item() == pytest.approx(expected_copy_plus, abs=1e-6)
    assert plain[0].item() == pytest.approx((uniform + known_2 + known_1 + known_1 + known_2) / 5, abs=1e-6)
    assert plain[0] > plain[2] and plain[1] > plain[2]

    # Eq. 5 on top: with masking the non-copying response ranks first; without, a copy takes it
    accuracies = torch.ones(3, dtype=torch.float64)
    assert coherence_reward(masked, accuracies, [0, 0, 0]).tolist() == [0.0, 0.5, 1.0]
    assert coherence_reward(plain, accuracies, [0, 0, 0]).tolist() == [1.0, 0.5, 0.0]


def test_unscorable_queries_are_nan(bigram_scorer):
    got = bigram_scorer.score(
        [[], ["", "  "], CONTEXT, CONTEXT, CONTEXT],
        ["a woman smiles", "a woman smiles", "", "   ", "the man opens the door"],
    )
    assert got.dtype == torch.float64 and got.shape == (5,)
    assert torch.isnan(got).all()
    with pytest.raises(ValueError, match="2 contexts but 1 responses"):
        bigram_scorer.score([CONTEXT, CONTEXT], ["a"])
    with pytest.raises(TypeError, match=r"contexts\[0\]"):
        bigram_scorer.score(["the man opens the door"], ["a woman smiles"])


def test_duplicates_scored_once_and_tie_exactly(bigram_scorer):
    bigram_scorer.model.calls = 0
    got = bigram_scorer.score([CONTEXT] * 4, ["a woman smiles", "the man opens the door quietly"] * 2)
    assert bigram_scorer.model.calls == 1
    assert got[0] == got[2] and got[1] == got[3]


@pytest.fixture(scope="module")
def gpt2_scorer(tokenizer):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_layer=2, n_head=2, n_embd=32,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return CoherenceScorer(GPT2LMHeadModel(config), tokenizer, batch_size=3)


def test_batched_equals_one_by_one_and_reference(gpt2_scorer, tokenizer):
    contexts = [
        ["Anna picks up the red cup .", "Tom walks to the window slowly ."],
        ["Maria reads a letter ."],
        [],
        ["the man opens the door", "Anna picks up the red cup .", "Maria reads a letter ."],
        ["Tom walks to the window slowly ."],
        CONTEXT,
        ["Anna picks up the red cup ."],
    ]
    responses = ["Tom reads the letter slowly .", "a woman smiles", "a woman smiles", "the man opens a window",
                 "Anna picks up the red cup . Tom smiles", "the man opens the door", "Maria picks up the cup ."]
    calls = []
    hook = gpt2_scorer.model.register_forward_hook(lambda *_: calls.append(1), with_kwargs=True)
    try:
        batched = gpt2_scorer.score(contexts, responses)
        assert len(calls) == 2  # 5 scorable queries, batch_size 3 → two forward passes
        one_by_one = torch.cat([gpt2_scorer.score([c], [r]) for c, r in zip(contexts, responses)])
    finally:
        hook.remove()
    assert torch.isnan(batched[[2, 5]]).all()  # no context; verbatim copy
    torch.testing.assert_close(batched, one_by_one, equal_nan=True, rtol=1e-5, atol=1e-5)

    # independent reference for one query: unpadded forward, explicit Eq. 4 sum
    # contexts[4] and responses[4], tokenised by hand:
    ids = tokenizer.convert_tokens_to_ids
    prefix = [tokenizer.bos_token_id] + ids(["Tom", "walks", "to", "the", "window", "slowly", "."])
    target = ids(["Anna", "picks", "up", "the", "red", "cup", ".", "Tom", "smiles"])
    mask = [1, 1, 1, 1, 1, 1, 1, 1, 1]  # "Tom" . "Tom" never forms a context 3-gram; nothing copied
    with torch.no_grad():
        logits = gpt2_scorer.model(input_ids=torch.tensor([prefix + target])).logits[0]
    logprobs = logits.double().log_softmax(-1)
    terms = [logprobs[len(prefix) + t - 1, token].item() for t, token in enumerate(target)]
    assert batched[4].item() == pytest.approx(sum(m * x for m, x in zip(mask, terms)) / sum(mask), abs=1e-5)
    # query 3 copies "the man opens" (3-gram of its first context AD): only "a window" is scored
    prefix3, target3, _ = encode_context_response(tokenizer, contexts[3], responses[3])
    with torch.no_grad():
        logprobs3 = gpt2_scorer.model(input_ids=torch.tensor([prefix3 + target3])).logits[0].double().log_softmax(-1)
    kept = [logprobs3[len(prefix3) + t - 1, target3[t]].item() for t in (3, 4)]
    assert batched[3].item() == pytest.approx(sum(kept) / 2, abs=1e-5)


def test_from_pretrained_missing_path_names_the_tool(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        CoherenceScorer.from_pretrained(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(error.value) and "tools/train_coherence_scorer.py" in str(error.value)


# ------------------------------------- agentcap.judges.coherence_training (tools/train_coherence_scorer.py)


def write_corpus(path: Path, rows: int = 20) -> None:
    people, things = ["Anna", "Tom", "Maria"], ["cup", "door", "box"]
    actions = ["picks up", "opens", "looks at", "drops"]
    ads = [f"{people[i % 3]} {actions[i % 4]} the {things[i % 3]} ." for i in range(rows + 1)]
    with path.open("w") as handle:
        for i in range(1, rows + 1):
            handle.write(json.dumps({"context": ads[max(0, i - 4) : i], "ad": ads[i]}) + "\n")


def test_tool_builds_labels_on_the_ad_only(tokenizer):
    tool = coherence_training
    row = (["Maria reads a letter ."], "a woman smiles")
    (ids, labels), = tool.build_examples([row], tokenizer, 64, 3, "ad")
    prefix, response, _ = encode_context_response(tokenizer, *row)
    assert ids == prefix + response + [tokenizer.eos_token_id]  # same serialization as the scorer
    assert labels == [tool.IGNORE] * len(prefix) + response + [tokenizer.eos_token_id]
    (_, labels_all), = tool.build_examples([row], tokenizer, 64, 3, "all")
    assert labels_all == ids
    # only the last context_size ADs are kept
    ids_last, _ = tool.build_examples([(["a woman smiles", "Maria reads"], "a")], tokenizer, 64, 1, "ad")[0]
    assert ids_last == [tokenizer.bos_token_id] + tokenizer.convert_tokens_to_ids(["Maria", "reads", "a"]) + [
        tokenizer.eos_token_id
    ]


@pytest.mark.slow
def test_tool_tiny_trains_saves_and_loads(tmp_path, tokenizer, capsys):
    tool = coherence_training
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus)
    tokenizer_dir = tmp_path / "tokenizer"
    ads = [json.loads(line)["ad"] for line in corpus.read_text().splitlines()]
    build_word_tokenizer(ads).save_pretrained(tokenizer_dir)
    out = tmp_path / "scorer"
    argv = ["--corpus", str(corpus), "--tiny", "--tokenizer", str(tokenizer_dir), "--out", str(out),
            "--batch-size", "4", "--grad-accum", "2", "--lr", "3e-3", "--max-steps", "3", "--log-every", "1"]
    assert tool.main(argv) == 0
    printed = capsys.readouterr().out
    assert "step 3/3 loss" in printed and "wall time" in printed
    summary = json.loads((out / "train_coherence_scorer.json").read_text())
    assert summary["steps"] == 3 and math.isfinite(summary["final_loss"])

    scorer = CoherenceScorer.from_pretrained(out, batch_size=4)
    scores = scorer.score([["Anna picks up the cup ."], ["Tom opens the door ."], []],
                          ["Tom opens the door .", "Maria looks at the box .", "Anna drops the cup ."])
    assert torch.isfinite(scores[:2]).all() and math.isnan(scores[2])

    # no --tokenizer: the tiny model gets a word tokenizer built from the corpus
    assert tool.main(["--corpus", str(corpus), "--tiny", "--out", str(tmp_path / "scorer2"), "--max-steps", "1",
                      "--batch-size", "4", "--grad-accum", "1"]) == 0
    own = CoherenceScorer.from_pretrained(tmp_path / "scorer2").tokenizer
    assert own.convert_tokens_to_ids("Maria") != own.unk_token_id


def reference_fit(model, examples, pad_id, args, warmup_steps, total_steps) -> list[float]:
    """The tool's training written out by hand: a seeded order per epoch, a token-weighted loss mean
    over each accumulation window, clipping, AdamW and a linear schedule stepped per window."""
    from transformers import get_linear_schedule_with_warmup

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
    generator, losses = torch.Generator().manual_seed(args.seed), []
    model.train()
    for _ in range(args.epochs):
        order = torch.randperm(len(examples), generator=generator).tolist()
        micro = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]
        for first in range(0, len(micro), args.grad_accum):
            if len(losses) == total_steps:
                break
            window = [coherence_training.collate([examples[i] for i in m], pad_id)
                      for m in micro[first : first + args.grad_accum]]
            n_targets = sum(int((b["labels"][:, 1:] != coherence_training.IGNORE).sum()) for b in window)
            total = 0.0
            for batch in window:
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(),
                    ignore_index=coherence_training.IGNORE, reduction="sum") / n_targets
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
    return losses


@pytest.mark.slow
def test_tool_lightning_fit_equals_reference_loop_and_learns(tmp_path, tokenizer, monkeypatch):
    """Under L.Trainer, accumulation (a partial last window included), clipping, the schedule and the
    data order give bit-identical weights to the loop written out by hand, the loss falls, and
    Lightning writes no logs or checkpoints."""
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, rows=22)
    examples = coherence_training.build_examples(coherence_training.read_corpus(corpus), tokenizer, 64, 3, "ad")
    # 22 rows / 4 = 6 micro-batches: windows of 4 and 2 (partial), 2 steps per epoch; 5 steps end in epoch 3
    args = SimpleNamespace(lr=1e-2, weight_decay=0.0, seed=3, epochs=3, batch_size=4, grad_accum=4,
                           max_grad_norm=0.5, device="cpu", log_every=100, out=tmp_path / "unused")
    total_steps, warmup_steps = 5, 1  # stops inside the third epoch

    def tiny_gpt2():
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_layer=1, n_head=2, n_embd=16,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))

    reference, trained = tiny_gpt2(), tiny_gpt2()
    pad = tokenizer.pad_token_id
    expected = reference_fit(reference, examples, pad, args, warmup_steps, total_steps)
    losses = coherence_training.fit(trained, examples, pad, args, warmup_steps, total_steps, started=0.0)
    assert losses == expected and len(losses) == total_steps
    assert losses[-1] < 0.9 * losses[0], losses  # it learns: 3.85 -> 3.40 here
    for (name, a), b in zip(reference.named_parameters(), trained.parameters()):
        assert torch.equal(a, b), (name, (a - b).abs().max())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]


def test_tool_rejects_bad_input(tmp_path):
    tool = coherence_training
    corpus = tmp_path / "bad.jsonl"
    rows = [{"context": [], "ad": "fine"}, {"context": ["x"], "ad": ""}]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: 'ad' must be a non-empty string"):
        tool.read_corpus(corpus)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        tool.read_corpus(tmp_path / "missing.jsonl")
    good = tmp_path / "good.jsonl"
    write_corpus(good, rows=2)
    with pytest.raises(FileNotFoundError, match="not a local HF model folder"):
        tool.main(["--corpus", str(good), "--base", str(tmp_path / "gpt2"), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        tool.parse_args(["--corpus", "c", "--out", "o"])  # neither --base nor --tiny
