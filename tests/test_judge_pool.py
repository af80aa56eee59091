"""Judges load once per process, and shard with FSDP2: two gloo processes asking different numbers
of questions (none at all, too) get the answers a replicated judge gives."""

from __future__ import annotations

import json
import os

import pytest
import torch
from gloo import process_group, run_in_two_processes
from transformers import LlamaConfig, LlamaForCausalLM

from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.judges import build_examiner, build_temporal_examiner, pool
from agentcap.judges.examiner import LLMExaminer
from agentcap.judges.questions import Question
from agentcap.judges.temporal import LLMTemporalExaminer

CAPTIONS = [
    "From 0.5 s to 1.8 s, a loud very high beep sounds three times.",
    "A soft low hiss sounds once at 2 s.",
    "",
    "A beep.",
]
QUESTIONS = [
    Question("a loud ___ beep", ("low", "high", "very high", "mid", "Not given"), "C"),
    Question("the hiss sounds ___", ("once", "twice", "three times", "four times", "Not given"), "A"),
    Question("What sound is heard first?", ("hiss", "beep", "knock", "chirp", "Not given"), "B"),
]
EVENTS = ["the beep", "the hiss"]


def tiny_judge():
    texts = CAPTIONS + [q.prompt_text() for q in QUESTIONS] + EVENTS
    tokenizer = build_word_tokenizer(texts, extra_tokens=["A", "B", "C", "D", "E", "Answer", ":", "Caption", "Event"])
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval(), tokenizer


@pytest.fixture
def clean_pool():
    pool.clear()
    yield
    pool.clear()


def test_a_judge_folder_loads_once_and_again_when_rewritten(tmp_path, clean_pool):
    model, tokenizer = tiny_judge()
    model.save_pretrained(tmp_path / "judge")
    tokenizer.save_pretrained(tmp_path / "judge")
    first = build_examiner(str(tmp_path / "judge"))
    assert build_examiner(str(tmp_path / "judge")).model is first.model  # a second environment: the same copy
    options = build_examiner(str(tmp_path / "judge"), readout="options")
    assert options.readout == "options" and options.model is first.model  # another readout, the same model
    assert build_temporal_examiner(str(tmp_path / "judge"), 0.5).model is first.model
    model.save_pretrained(tmp_path / "judge")  # rewritten in place: new weights, a new load
    os.utime(tmp_path / "judge" / "config.json", ns=(1, 1))
    assert build_examiner(str(tmp_path / "judge")).model is not first.model


# --- two processes -------------------------------------------------------------------------------
PAIRS = [(c, q) for c in CAPTIONS for q in QUESTIONS]
EVENT_PAIRS = [(c, e) for c in CAPTIONS for e in EVENTS]
# (rank 0's pairs, rank 1's pairs) per call: unequal, and one side empty
LETTER_CALLS = [(slice(0, 12), slice(0, 3)), (slice(0, 2), slice(0, 0)), (slice(0, 0), slice(3, 7))]
OPTION_CALLS = [(slice(0, 1), slice(0, 5))]
TEMPORAL_CALLS = [(slice(0, 5), slice(0, 0)), (slice(2, 3), slice(0, 8))]


def _calls(rank: int):
    def pick(pairs, calls):
        return [pairs[call[rank]] for call in calls]

    return pick(PAIRS, LETTER_CALLS), pick(PAIRS, OPTION_CALLS), pick(EVENT_PAIRS, TEMPORAL_CALLS)


def _readouts(letters, options, temporal, rank):
    letter_calls, option_calls, temporal_calls = _calls(rank)
    out = {"letters": [], "options": [], "temporal": []}
    for pairs in letter_calls:
        out["letters"].append(letters.letter_logits([c for c, _ in pairs], [q for _, q in pairs]).tolist())
    for pairs in option_calls:
        out["options"].append(options.option_gains([c for c, _ in pairs], [q for _, q in pairs]).tolist())
    for pairs in temporal_calls:
        out["temporal"].append(temporal.locate([c for c, _ in pairs], [e for _, e in pairs]))
    return out


def _judges():
    model, tokenizer = pool.load_once("tiny", lambda where: tiny_judge(), "cpu", model_of=lambda loaded: loaded[0])
    return (LLMExaminer(model, tokenizer, batch_size=2), LLMExaminer(model, tokenizer, batch_size=2, readout="options"),
            LLMTemporalExaminer(model, tokenizer, batch_size=2, max_new_tokens=6))


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from agentcap.parallel.sharding import is_sharded

    with process_group(rank, port):
        try:
            pool.clear()
            judges = _judges()  # loaded before sharding begins, like a judge an earlier stage used
            pool.shard_judges(init_device_mesh("cpu", (2,)))
            assert all(j.sharded for j in judges) and is_sharded(judges[0].model)
            with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
                json.dump(_readouts(*judges, rank), handle)
        finally:
            pool.clear()


@pytest.mark.slow  # two gloo processes
def test_sharded_judges_answer_like_a_replicated_one_with_unequal_calls(tmp_path, clean_pool):
    run_in_two_processes(_worker, str(tmp_path))
    for rank in (0, 1):
        sharded = json.loads((tmp_path / f"rank{rank}.json").read_text())
        pool.clear()
        replicated = _readouts(*_judges(), rank)
        for kind in ("letters", "options"):
            for got, want in zip(sharded[kind], replicated[kind], strict=True):
                torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=1e-5)
        temporal = [[None if x is None else tuple(x) for x in call] for call in sharded["temporal"]]
        assert temporal == replicated["temporal"]
    assert sum(len(call) for call in sharded["letters"]) == 3 + 0 + 4  # rank 1's own rows only


@pytest.mark.slow  # `agentcap fit` in subprocesses, one of 2 ranks
def test_a_sharded_examiner_scores_a_run_like_one_process(tmp_path, toy_soundscapes, make_game_config, clean_pool):
    """ACE-Cap with a (tiny) LLM examiner: one Composer GRPO step and 3 sampled held-out games over
    2 sharded ranks (2 + 1 games: unequal examiner passes) give one process's summary.json."""
    import subprocess
    import sys
    from pathlib import Path

    from agentcap.judges.examiner import INSTRUCTION

    texts = (toy_soundscapes / "texts.txt").read_text().splitlines() + [INSTRUCTION]
    tokenizer = build_word_tokenizer(texts, extra_tokens=["A", "B", "C", "D", "E", "Answer", ":", "Caption", "Question"])
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "examiner")
    tokenizer.save_pretrained(tmp_path / "examiner")
    stages = [{"name": "composer", "kind": "grpo", "agent": "composer", "steps": 1},
              {"name": "held_out", "kind": "evaluate", "split": "test", "greedy": False}]
    summaries = {}
    for name, extra in (("one", ()), ("fsdp", ("--trainer.devices=2", "--trainer.strategy=grpo_fsdp"))):
        run = make_game_config(tmp_path / name, toy_soundscapes, stages, eval_limit=3, generation_batch_size=1)
        result = subprocess.run(
            [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(run), *extra,
             f"--model.env.kwargs.examiner={tmp_path / 'examiner'}"],
            cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=900,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert (f"sharded the judge {tmp_path / 'examiner'} with FSDP2 over 2 processes" in result.stderr) == (
            name == "fsdp"), result.stderr[-3000:]
        summaries[name] = json.loads((tmp_path / name / "summary.json").read_text())
    one, two = summaries["one"]["held_out"], summaries["fsdp"]["held_out"]
    assert one.keys() == two.keys() and "g2p_final" in one
    for key in one:
        assert abs(one[key] - two[key]) < 1e-5, (key, one[key], two[key])
