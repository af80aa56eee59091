"""The papers' metrics agree with their reference implementations on real caption pairs.

Pairs: the READ demo's 40 test ADs (recurrent inference after GRPO) against their references
(``tests/data/read_demo_captions.jsonl``), plus a few captions with the punctuation, brackets,
quotes and clitics that tokenisers treat differently.

Measured agreement (pycocoevalcap 1.2, Java 17, bert-score 0.3.13):
- BLEU-1…4, METEOR, ROUGE-L, CIDEr-D: identical to pycocoevalcap's own pipeline (PTBTokenizer then
  each scorer), |Δ| = 0.
- BERTScore F1: |Δ| < 1e-6 per pair against bert-score's ``bert_cos_score_idf`` with the same encoder.
- Without Java, the Python tokeniser differs from the jar on 1 of 88 captions here (a sentence-final
  "s." the jar keeps as an abbreviation) and moves each metric by under 1 %; METEOR is absent.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pycocoevalcap")
from agentcap.evaluation import captioning as captioning_module  # noqa: E402
from agentcap.evaluation.captioning import CaptionMetrics, java_available, ptb_tokenize, python_ptb_tokenize  # noqa: E402
from agentcap.evaluation.retrieval import neighbour_windows, recall_at_k  # noqa: E402
from agentcap.evaluation.tasks import coherence_metrics, question_metrics, task_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = [json.loads(line) for line in (ROOT / "tests/data/read_demo_captions.jsonl").read_text().splitlines()]
TRICKY = [
    ("A man (John) walks, into the room.", "A man walks into the room!"),
    ('She said "hello" to him; he didn\'t answer.', "She says hello to him, he does not answer."),
    ("It's 4.5 s long -- the dog's bark, then a cat's meow...", "A dog barks at 1.0 s and a cat meows at 3.5 s."),
    ("", "Tom gives Maria the book."),
]
PREDICTIONS = [p["caption"] for p in PAIRS] + [p for p, _ in TRICKY]
REFERENCES = [[p["reference"]] for p in PAIRS] + [[r] for _, r in TRICKY]
needs_java = pytest.mark.skipif(not java_available(), reason="pycocoevalcap's METEOR and PTB tokenizer need Java")


@pytest.fixture(scope="module")
def metrics():
    with CaptionMetrics() as m:  # one METEOR JVM (~12 s start) for the whole module
        yield m


def reference_scores(meteor) -> dict[str, float]:
    """pycocoevalcap's own pipeline, as its COCOEvalCap runs it."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(REFERENCES)})
    res = tokenizer.tokenize({i: [{"caption": p}] for i, p in enumerate(PREDICTIONS)})
    with contextlib.redirect_stdout(io.StringIO()):
        bleu, _ = Bleu(4).compute_score(gts, res)
    return {
        **{f"bleu{n + 1}": bleu[n] for n in range(4)},
        "meteor": meteor.compute_score(gts, res)[0],
        "rouge_l": Rouge().compute_score(gts, res)[0],
        "cider_d": Cider().compute_score(gts, res)[0],
    }


@pytest.mark.slow  # pycocoevalcap's Java METEOR and PTB tokenizer, ~30 s
@needs_java
def test_coco_metrics_equal_pycocoevalcap(metrics):
    ours = metrics(PREDICTIONS, REFERENCES)
    reference = reference_scores(metrics.meteor)
    for name, value in reference.items():
        assert ours[name] == pytest.approx(value, abs=1e-12), name
    # the READ demo's figures, as the issue scored them by hand (BLEU-4 0.683, ROUGE-L 0.825)
    demo = metrics([p["caption"] for p in PAIRS], [[p["reference"]] for p in PAIRS])
    assert round(demo["bleu4"], 3) == 0.683 and round(demo["rouge_l"], 3) == 0.825


@needs_java
def test_jar_tokenisation_equals_ptbtokenizer_and_python_approximates_it():
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    texts = PREDICTIONS + [r for refs in REFERENCES for r in refs]
    reference = PTBTokenizer().tokenize({i: [{"caption": t}] for i, t in enumerate(texts)})
    jar = ptb_tokenize(texts)
    assert jar == [reference[i][0] for i in range(len(texts))]
    python = python_ptb_tokenize(texts)
    differ = [(p, j) for p, j in zip(python, jar) if p != j]
    # measured: 1 of 88 lines differs (the jar keeps a sentence-final "s." as an abbreviation)
    assert len(differ) <= 1, differ


@pytest.mark.slow  # starts the METEOR JVM (~12 s)
@needs_java
def test_python_tokeniser_moves_the_metrics_little(metrics, monkeypatch):
    jar = metrics(PREDICTIONS, REFERENCES)
    monkeypatch.setattr(metrics, "java", False)
    python = metrics(PREDICTIONS, REFERENCES)
    for name in ("bleu1", "bleu4", "meteor", "rouge_l", "cider_d"):
        assert abs(python[name] - jar[name]) < 0.01 * max(1.0, abs(jar[name])), (name, python[name], jar[name])


def test_without_java_meteor_is_left_out_with_a_message(monkeypatch):
    monkeypatch.setattr(captioning_module, "java_available", lambda: False)
    with CaptionMetrics(bertscore=False) as m:
        scores = m(PREDICTIONS, REFERENCES)
        assert "meteor" not in scores and {"bleu4", "rouge_l", "cider_d"} <= set(scores)
        assert any("METEOR left out" in note and "default-jre-headless" in note for note in m.notes)
    with pytest.raises(RuntimeError, match="METEOR needs Java"):
        CaptionMetrics(meteor=True)


def test_bertscore_equals_bert_score(metrics):
    """Against bert-score 0.3.13's core (its package __init__ imports matplotlib and pandas, which the
    scoring never uses, so only its ``utils`` module is loaded)."""
    import importlib.util
    import types
    from collections import defaultdict

    spec = importlib.util.find_spec("bert_score")
    if spec is None:
        pytest.skip("bert-score (the reference) is not installed")
    if "bert_score" not in sys.modules:
        package = types.ModuleType("bert_score")
        package.__path__ = list(spec.submodule_search_locations)
        package.__version__ = "0.3.13"
        sys.modules["bert_score"] = package
    from bert_score.utils import bert_cos_score_idf

    model, tokenizer = metrics.encoder()
    # not the empty caption: bert-score encodes "" with a tokenizer method transformers 5 removed
    hyps, refs = PREDICTIONS[:20] + PREDICTIONS[-4:-1], [r[0] for r in REFERENCES[:20] + REFERENCES[-4:-1]]
    idf = defaultdict(lambda: 1.0)
    idf[tokenizer.sep_token_id] = idf[tokenizer.cls_token_id] = 0.0
    reference = bert_cos_score_idf(model, refs, hyps, tokenizer, idf, device="cpu", all_layers=False)[:, 2]
    ours = metrics.bertscore(hyps, refs)
    assert torch.allclose(ours.float(), reference.float(), atol=1e-6)
    # several references: the best one
    two = metrics.bertscore([hyps[0]], [[refs[1], refs[0]]])
    assert float(two[0]) == pytest.approx(float(reference[0]), abs=1e-6)
    assert float(metrics.bertscore([""], ["Tom gives Maria the book."])[0]) == 0.0


def test_neighbour_windows_hold_n_around_each_ad():
    movies, positions = ["a"] * 6 + ["b"] * 2, [0, 1, 2, 3, 4, 5, 0, 1]
    windows = neighbour_windows(movies, positions, 3)
    assert windows[0] == [0, 1, 2] and windows[2] == [1, 2, 3] and windows[5] == [3, 4, 5]
    assert windows[6] == [6, 7] and windows[7] == [6, 7]  # a short movie: all of it


def test_recall_at_k_of_n_by_hand():
    refs = ["r0", "r1", "r2", "r3"]
    # prediction i is most similar to reference (i + shift[i]); the own reference ranks 1st or 2nd
    table = {("p0", "r0"): 0.9, ("p0", "r1"): 0.1, ("p0", "r2"): 0.2, ("p0", "r3"): 0.0,
             ("p1", "r0"): 0.8, ("p1", "r1"): 0.5, ("p1", "r2"): 0.1, ("p1", "r3"): 0.0,
             ("p2", "r0"): 0.1, ("p2", "r1"): 0.3, ("p2", "r2"): 0.3, ("p2", "r3"): 0.0,  # a tie: retrieved
             ("p3", "r0"): 0.9, ("p3", "r1"): 0.9, ("p3", "r2"): 0.9, ("p3", "r3"): 0.1}
    sim = lambda hyps, rs: torch.tensor([table[(h, r)] for h, r in zip(hyps, rs)])  # noqa: E731
    preds, movies, positions = ["p0", "p1", "p2", "p3"], ["m"] * 4, [0, 1, 2, 3]
    assert recall_at_k(preds, refs, movies, positions, 1, 4, sim) == 0.5  # p0, p2
    assert recall_at_k(preds, refs, movies, positions, 2, 4, sim) == 0.75  # + p1
    assert recall_at_k(preds, refs, movies, positions, 4, 4, sim) == 1.0


def tiny_scorer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = sorted({w for p in PAIRS for w in (p["caption"] + " " + p["reference"]).split()})
    vocab = {"<unk>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=16, n_layer=1, n_head=2))
    from agentcap.judges.coherence import CoherenceScorer

    return CoherenceScorer(model, tokenizer)


def test_logp_masked_logp_and_ppl(tmp_path):
    scorer = tiny_scorer(tmp_path)
    contexts = [[PAIRS[0]["reference"], PAIRS[1]["reference"]], [PAIRS[2]["reference"]], []]
    captions = [PAIRS[2]["caption"], PAIRS[2]["reference"], PAIRS[3]["caption"]]  # the 2nd copies its context
    out = coherence_metrics(scorer, contexts, captions, ngram=3)
    # plain mean token log-prob by hand, for the first two (the third has no context: not scored)
    by_hand, lengths = [], []
    for context, caption in zip(contexts[:2], captions[:2]):
        tok = scorer.tokenizer
        prefix = [tok.eos_token_id] + tok("".join(c + "\n" for c in context), add_special_tokens=False)["input_ids"]
        target = tok(caption, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prefix + target])
        with torch.no_grad():
            logprobs = scorer.model(input_ids=ids).logits.log_softmax(-1)[0]
        by_hand.append(float(sum(logprobs[len(prefix) + t - 1, tid] for t, tid in enumerate(target)) / len(target)))
        lengths.append(len(target))
    assert out["logp"] == pytest.approx(sum(by_hand) / 2, abs=1e-5)
    # corpus perplexity: exp of the mean NLL over every scored token, not a mean of per-AD perplexities
    nll = -sum(v * n for v, n in zip(by_hand, lengths)) / sum(lengths)
    assert out["ppl"] == pytest.approx(math.exp(nll), rel=1e-5)
    assert out["ppl"] != pytest.approx(sum(math.exp(-v) for v in by_hand) / 2, rel=1e-6)
    # Eq. 4: the copy of the context is fully masked, so only the first AD counts
    assert out["masked_logp"] == pytest.approx(float(scorer.score(contexts[:1], captions[:1], n=3)[0]), abs=1e-9)


class _Env:
    required_fields = {"mcq": list}

    def __init__(self):
        from agentcap.judges import RuleExaminer

        self.examiner = RuleExaminer()


def test_question_accuracy_and_g2p_with_the_examiner(sound_rows):
    from agentcap.judges import RuleExaminer
    from agentcap.judges.questions import question_bank
    from agentcap.rewards.functional.cloze import answer_scores

    items = sound_rows[:4]
    captions = [items[0]["caption"], items[1]["short_caption"] if "short_caption" in items[1] else "", "", items[3]["caption"]]
    env = _Env()
    out = question_metrics(env, items, captions)
    accuracy, g2p = [], []
    for item, caption in zip(items, captions):
        bank = question_bank(item, "mcq")
        letters = RuleExaminer().answer([caption] * len(bank), bank)
        accuracy.append(sum(a == q.answer for a, q in zip(letters, bank)) / len(bank))
        g2p.append(float(answer_scores(letters, [q.answer for q in bank]).mean()))
    assert out["mcq_accuracy"] == pytest.approx(sum(accuracy) / 4)
    assert out["g2p"] == pytest.approx(sum(g2p) / 4, abs=1e-6)
    assert out["mcq_accuracy"] > 0  # the gold captions answer their own questions


def test_tiou_and_cloze_metrics_of_the_audiomap_env(toy_soundscapes):
    import gymnasium as gym

    env = gym.make("agentcap/ClozeCaption-v0", manifest=str(toy_soundscapes / "test.jsonl")).unwrapped
    items = env.items[:3]
    rows = [{"caption": items[0]["caption"]}, {"caption": "a sound ."}, {"caption": items[2]["caption"]}]
    with CaptionMetrics(meteor=False) as metrics:  # the task's own metrics; no METEOR JVM (~10 s) for them
        out = task_metrics(env, items, rows, metrics)
    from agentcap.rewards.functional.cloze import event_temporal_reward

    expected = event_temporal_reward([r["caption"] for r in rows], [i["anchors"] for i in items], env.temporal)
    assert out["tiou"] == pytest.approx(float(expected.mean()))
    assert 0 < out["cloze_accuracy"] <= 1 and "esr" in out and "recall@5/16" not in out


@pytest.mark.slow  # two `agentcap evaluate` subprocesses
def test_evaluate_command_on_a_predictions_file(tmp_path, toy_movie):
    rows = [json.loads(line) for line in (toy_movie / "test.jsonl").read_text().splitlines()][:8]
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps({"id": r["id"], "caption": r["ad"].replace(".", "")}) + "\n" for r in rows))
    result = subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "evaluate", "--env", "agentcap/ADClip-v0", "--manifest",
         str(toy_movie / "test.jsonl"), "--predictions", str(predictions), "--no-meteor"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cells = [line.split("|") for line in result.stdout.splitlines() if line.count("|") == 1]
    table = {name.strip(): value.strip() for name, value in cells}
    assert table["bleu4"] == "1.0000" and table["rouge_l"] == "1.0000" and "recall@1/5" in table
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "nope", "caption": "x"}) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "evaluate", "--env", "agentcap/ADClip-v0", "--manifest",
         str(toy_movie / "test.jsonl"), "--predictions", str(bad), "--no-meteor"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode != 0 and "not in the manifest" in result.stderr and "nope" in result.stderr


def test_write_summary_replaces_or_merges(tmp_path):
    """The one summary.json writer: a training run's evaluations replace the file; ``validate`` /
    ``test`` and ``agentcap evaluate --run`` merge their entry into it."""
    from agentcap.evaluation.rollouts import write_summary

    run = tmp_path / "run"
    path = write_summary(str(run), {"before": {"reward": 0.25}})
    assert path == str(run / "summary.json") and not (run / "summary.json.tmp").exists()
    write_summary(str(run), {"evaluate": {"reward": 0.5}, "before": {"reward": 0.75}}, merge=True)
    assert json.loads((run / "summary.json").read_text()) == {"before": {"reward": 0.75}, "evaluate": {"reward": 0.5}}
    write_summary(str(run), {"after": {"reward": 1.0}})
    assert json.loads((run / "summary.json").read_text()) == {"after": {"reward": 1.0}}


def test_evaluation_rows_and_their_means():
    """A row per item under summary.json's names; means skip NaN and items without the value; a
    component that would overwrite a row's own field is refused, naming it."""
    from types import SimpleNamespace

    from agentcap.evaluation.rollouts import means
    from agentcap.evaluation.tasks import item_row

    env = SimpleNamespace(items=[{"id": "c0", "caption": "a dog barks"}, {"caption": "a cat"}])
    episode = SimpleNamespace(item=env.items[1], actions=[SimpleNamespace(agent="captioner", kind="caption", text=" a cat ")],
                              state={})
    score = SimpleNamespace(reward=0.5, components={"g2p": 0.5}, extras={"questions": 2, "stopped": True, "note": "x"})
    row = item_row(env, 1, episode, score)
    assert row == {"id": "1", "caption": "a cat", "reference": "a cat", "reward": 0.5, "g2p": 0.5,
                   "questions": 2.0, "stopped": 1.0}  # an item without id is named by its index
    assert means([row, {"id": "c0", "reward": float("nan"), "g2p": 1.5}]) == {
        "reward": 0.5, "g2p": 1.0, "questions": 2.0, "stopped": 1.0}
    assert math.isnan(means([{"reward": float("nan")}])["reward"])
    with pytest.raises(ValueError, match=r"named \['caption'\]"):
        item_row(env, 1, episode, SimpleNamespace(reward=0.0, components={"caption": 1.0}, extras={}))
