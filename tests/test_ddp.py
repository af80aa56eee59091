"""Data parallel on CPU: two processes train, and equal one process on the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import read_jsonl

from agentcap.resume.checkpoints import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def fit(config: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
    )


def weights(run: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(str(run / "checkpoints" / "last.ckpt"))["state_dict"]  # a file, or grpo_fsdp's folder


@pytest.mark.slow  # `agentcap fit` in subprocesses, 2 DDP ranks
def test_two_processes_equal_one(tmp_path, toy_movie, make_read_config):
    """Same global batch of demonstrations per step, split over 2 ranks: same weights and same synced
    held-out metrics as one process, up to float tolerance."""
    stages = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 4},
        {"name": "after", "kind": "evaluate", "split": "test"},
    ]
    single = make_read_config(tmp_path / "one", toy_movie, stages, sft_batch_size=4)
    double = make_read_config(tmp_path / "two", toy_movie, stages, sft_batch_size=4)  # global, like every batch size
    one = fit(single)
    assert one.returncode == 0, one.stderr[-3000:]
    two = fit(double, "--trainer.devices=2", "--trainer.strategy=ddp")
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())["after"]
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())["after"]
    assert s1.keys() == s2.keys()
    for key in s1:
        assert abs(s1[key] - s2[key]) < 1e-5, (key, s1[key], s2[key])


@pytest.mark.slow  # `agentcap fit` in subprocesses, 2 DDP ranks
def test_grpo_trains_under_ddp(tmp_path, toy_movie, make_read_config):
    stages = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
        {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2},
        {"name": "after", "kind": "evaluate", "split": "test"},
    ]
    config = make_read_config(tmp_path / "run", toy_movie, stages, sft_batch_size=2)
    result = fit(config, "--trainer.devices=2", "--trainer.strategy=ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["agentcap"]["tick"] == 5
    metrics = next((tmp_path / "run").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "reward/policy/accuracy" in metrics and "loss/policy/pg_loss" in metrics
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"reward", "accuracy"} <= set(summary["after"])


# --- per-trajectory sampling ------------------------------------------------------------------
def tiny_agent(tmp_path):
    from agentcap.agents import AgentConfig, build_agent

    texts = tmp_path / "texts.txt"
    texts.write_text("Anna opens the red door .\nTom picks up the key .\n")
    torch.manual_seed(0)
    return build_agent("policy", AgentConfig(
        toy={"media": "features", "feature_dim": 8, "hidden_size": 16, "num_layers": 1, "num_heads": 2,
             "intermediate_size": 32}, build_tokenizer_from=[str(texts)], max_new_tokens=8, temperature=2.0))


def test_a_seeded_row_samples_the_same_alone_as_in_any_batch(tmp_path):
    """What makes a trajectory independent of the split: its tokens follow its own seed only."""
    import numpy as np

    agent = tiny_agent(tmp_path)
    rng = np.random.default_rng(0)
    obs = [{"agent": "policy", "messages": [{"role": "user", "content": "Anna opens the" + " door" * (i % 3)}],
            "media": {"features": rng.standard_normal((3, 8)).astype(np.float32)}} for i in range(6)]
    seeds = [11, 12, 13, 14, 15, 16]
    together = [g.completion_ids.tolist() for g in agent.generate(obs, seeds=seeds, batch_size=6)]
    torch.manual_seed(123)  # the global RNG plays no part
    chunked = [g.completion_ids.tolist() for g in agent.generate(obs[::-1], seeds=seeds[::-1], batch_size=4)][::-1]
    alone = [agent.generate([o], seeds=[s])[0].completion_ids.tolist() for o, s in zip(obs, seeds)]
    assert together == chunked == alone
    other = [g.completion_ids.tolist() for g in agent.generate(obs, seeds=[s + 100 for s in seeds])]
    assert other != together  # the seed matters (temperature 2 on a random model: near-uniform)


def test_row_sampler_draws_from_the_tempered_top_p_softmax():
    from agentcap.agents.sampling import RowSampler, top_p_filter

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    sampler = RowSampler([7], temperature=1.5)
    counts = torch.zeros(5)
    for _ in range(4000):
        counts[int(sampler(None, logits).argmax())] += 1
    expected = torch.softmax(logits[0] / 1.5, -1)
    assert torch.allclose(counts / 4000, expected, atol=0.03), (counts / 4000, expected)
    kept = top_p_filter(logits, 0.8)[0]
    probs = torch.softmax(logits[0], -1)  # 0.64, 0.24, 0.09, …: 0.64 < 0.8 ≤ 0.88 keeps two tokens
    assert torch.isfinite(kept).tolist() == [True, True, False, False, False], probs


# --- a whole schedule: one process equals two -------------------------------------------------
#: SFT, sampled GRPO of two agents (the Captioner alone, then the Composer in the game), and a sampled
#: and a greedy evaluation: every place where batch sizes, seeds or minibatches could depend on ranks.
SCHEDULE = [
    {"name": "sft", "kind": "sft", "agent": "captioner", "steps": 2},
    {"name": "captioner_grpo", "kind": "grpo", "agent": "captioner", "steps": 1, "env": {"mode": "captioner"}},
    {"name": "composer_grpo", "kind": "grpo", "agent": "composer", "steps": 1},
    {"name": "sampled", "kind": "evaluate", "split": "test", "greedy": False},
    {"name": "greedy", "kind": "evaluate", "split": "test"},
]


def max_differences(one: Path, two: Path, load=weights) -> tuple[float, float]:
    """(largest |Δ| over summary.json values, largest |Δ| over weights) of two runs."""
    s1, s2 = (json.loads((run / "summary.json").read_text()) for run in (one, two))
    assert s1.keys() == s2.keys() and all(s1[k].keys() == s2[k].keys() for k in s1)
    summary = max(abs(s1[k][m] - s2[k][m]) for k in s1 for m in s1[k])
    a, b = load(one), load(two)
    assert a.keys() == b.keys()
    weight = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    return summary, weight


#: Logged figures that measure the machine, not the run: each process's wall time, memory and speed.
MACHINE_MEASURES = ("time/", "throughput/", "memory/")


def logged(run: Path) -> dict[tuple[int, str], float]:
    """Every value the run's CSVLogger wrote, by (step, key)."""
    import csv

    values = {}
    for path in run.rglob("metrics.csv"):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                for key, value in row.items():
                    if key != "step" and value not in ("", None):
                        values[(int(float(row["step"])), key)] = float(value)
    return values


def logged_differences(one: Path, two: Path) -> dict[str, float]:
    """Largest |Δ| per logged key, relative to values above 1 (machine measures left out); both runs must
    log the same (step, key)s."""
    a, b = ({k: v for k, v in logged(run).items() if not k[1].startswith(MACHINE_MEASURES)} for run in (one, two))
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:10]
    worst: dict[str, float] = {}
    for (step, key), value in a.items():
        worst[key] = max(worst.get(key, 0.0), abs(value - b[(step, key)]) / max(1.0, abs(value)))
    return worst


@pytest.mark.slow  # `agentcap fit` in subprocesses, 2 DDP ranks
def test_a_whole_schedule_in_two_processes_equals_one(tmp_path, toy_soundscapes, make_game_config):
    """1 process, 2 under grpo_ddp and 2 sharded (grpo_fsdp, also in micro-batches of one row), each
    with a KL reference (full fine-tune, beta > 0):
    same summary.json, same weights."""
    runs = {}
    for name, extra in (
        ("one", ()),
        ("ddp", ("--trainer.devices=2", "--trainer.strategy=grpo_ddp")),
        ("fsdp", ("--trainer.devices=2", "--trainer.strategy=grpo_fsdp")),
        # one row per pass: the ranks hold different numbers of demonstrations and rollouts, and a
        # sharded forward is a collective, so the short rank must run stand-in passes (else: a hang)
        ("fsdp_micro", ("--trainer.devices=2", "--trainer.strategy=grpo_fsdp", "--model.micro_batch_size=1")),
    ):
        config = make_game_config(tmp_path / name, toy_soundscapes, SCHEDULE, beta=0.05)  # with a KL reference
        result = fit(config, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = tmp_path / name
        if name == "fsdp":
            assert "sharded captioner, composer, instruct with FSDP2 over 2 processes" in result.stderr
    for name in ("ddp", "fsdp", "fsdp_micro"):
        summary, weight = max_differences(runs["one"], runs[name])
        print(f"1 vs 2 processes ({name}): summary max |diff| {summary:.3g}, weights max |diff| {weight:.3g}")
        assert summary < 1e-5 and weight < 1e-5, name
        # every logged figure is the global value: losses, ratio, clip fraction, KL, entropy, rewards, lengths
        worst = logged_differences(runs["one"], runs[name])
        assert {"loss/captioner/ratio", "loss/composer/clipfrac", "loss/composer/kl", "loss/captioner/entropy",
                "reward/composer/total", "rollout/composer/response_length", "loss/captioner/sft"} <= set(worst), sorted(worst)
        print(f"1 vs 2 processes ({name}): {len(worst)} logged keys, largest |diff| "
              + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items(), key=lambda kv: -kv[1])[:3]))
        assert all(v < 1e-5 for v in worst.values()), {k: v for k, v in worst.items() if v >= 1e-5}


@pytest.mark.slow  # three fits, two of them with 2 processes
def test_an_sft_step_that_demonstrates_on_one_process_only_equals_one_process(tmp_path, toy_soundscapes,
                                                                              make_game_config):
    """Only one training clip has QA pairs, so the SFT step that draws it demonstrates Instruct turns on
    one process and none on the other. That one adds zero gradients (grpo_ddp: no pass; grpo_fsdp:
    stand-in passes at scale 0, every sharded pass being a collective): same weights as one process
    (was: the step was refused, 'raise sft_batch_size')."""
    world = tmp_path / "world"
    world.mkdir()
    rows = read_jsonl(toy_soundscapes / "train.jsonl")
    for i, row in enumerate(rows):
        row["audio"] = str(toy_soundscapes / row["audio"])
        row["qa"] = row["qa"] if i == 0 else []
    (world / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name in ("val.jsonl", "test.jsonl", "texts.txt", "audio"):
        (world / name).symlink_to(toy_soundscapes / name)
    schedule = [{"name": "sft_instruct", "kind": "sft", "agent": "instruct", "steps": 6, "env": {"demo_questions": 1}},
                {"name": "greedy", "kind": "evaluate", "split": "test"}]
    runs = {}
    for name, extra in (("one", ()), ("ddp", ("--trainer.devices=2", "--trainer.strategy=grpo_ddp")),
                        ("fsdp", ("--trainer.devices=2", "--trainer.strategy=grpo_fsdp"))):
        result = fit(make_game_config(tmp_path / name, world, schedule), *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = tmp_path / name
    trained = {key for _, key in logged(runs["one"])}
    assert {"loss/instruct/sft", "sft/instruct/empty_steps"} <= trained, "the clip with QA pairs was never drawn"
    for name in ("ddp", "fsdp"):
        summary, weight = max_differences(runs["one"], runs[name])
        assert summary < 1e-5 and weight < 1e-5, (name, summary, weight)


@pytest.mark.slow  # three fits, two of them with 2 processes
def test_every_logged_metric_of_two_processes_equals_one(tmp_path, toy_movie, make_read_config):
    """READ's rewards spread within groups, and two epochs of two minibatches at a high lr with a KL
    reference move the policy between minibatches: the logged loss, ratio, clip fraction, KL,
    entropy, gradient norm, rewards and lengths are all away from their trivial values, and equal
    one process's on 2 processes (each rank's share summed, not one rank's share)."""
    stages = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 40, "lr": 5e-3},  # answers in READ's format
        {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2, "lr": 3e-3},
    ]
    settings = dict(sft_batch_size=4, group_size=4, rollout_batch_size=8, minibatch_size=4, ppo_epochs=2,
                    beta=0.05, clip_eps=0.02)
    runs = {}
    for name, extra in (("one", ()), ("ddp", ("--trainer.devices=2", "--trainer.strategy=grpo_ddp")),
                        ("fsdp", ("--trainer.devices=2", "--trainer.strategy=grpo_fsdp"))):
        result = fit(make_read_config(tmp_path / name, toy_movie, stages, **settings), *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = tmp_path / name
    one = logged(runs["one"])
    for key in ("pg_loss", "ratio", "clipfrac", "kl", "entropy", "grad_norm"):
        values = [v for (step, k), v in one.items() if k == f"loss/policy/{key}"]
        trivial = 1.0 if key == "ratio" else 0.0
        assert values and any(abs(v - trivial) > 1e-4 for v in values), (key, values)  # a real test of the sum
    for name in ("ddp", "fsdp"):
        worst = logged_differences(runs["one"], runs[name])
        print(f"1 vs 2 processes ({name}), READ: {len(worst)} logged keys, largest |diff| "
              + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items(), key=lambda kv: -kv[1])[:3]))
        # 40 SFT steps at lr 5e-3 carry float32 summation-order differences (~1e-7 in the weights)
        # to ~1e-5 in the GRPO step's gradient norm; one rank's share would be off by ~50 %
        assert all(v < 1e-4 for v in worst.values()), {k: v for k, v in worst.items() if v >= 1e-4}


# --- held-out evaluation: one process equals two ------------------------------------------------
@pytest.mark.slow  # `agentcap fit` in subprocesses, 2 DDP ranks
def test_held_out_evaluation_in_two_processes_equals_one(tmp_path, toy_soundscapes, make_game_config):
    """3 held-out ACE-Cap games over 2 ranks (2 + 1: nothing padded, nothing counted twice), one per
    generate call (so rank 1 makes an empty call), sampled (each game from its own seed): the
    per-item rows in item order, summary.json and the console table equal one process's."""
    stages = [{"name": "held_out", "kind": "evaluate", "split": "test", "greedy": False}]
    runs, tables = {}, {}
    for name, extra in (("one", ()), ("two", ("--trainer.devices=2", "--trainer.strategy=grpo_ddp"))):
        config = make_game_config(tmp_path / name, toy_soundscapes, stages, eval_limit=3, generation_batch_size=1)
        result = fit(config, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = tmp_path / name
        lines = result.stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("agentcap fit:"))
        tables[name] = lines[start + 1 : -1]  # the title and the last line name the run folder
    rows = {name: [json.loads(line) for line in (run / "eval" / "held_out.jsonl").read_text().splitlines()]
            for name, run in runs.items()}
    test_ids = [json.loads(line)["id"] for line in (toy_soundscapes / "test.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows["one"]] == [r["id"] for r in rows["two"]] == test_ids[:3]  # item order, once each
    assert len({r["trace"] for r in rows["one"]}) == 3  # sampled: every game its own
    for a, b in zip(rows["one"], rows["two"]):
        assert a.keys() == b.keys() and {"caption", "reference", "trace", "reward", "g2p_final", "events"} <= set(a)
        for key, value in a.items():
            if isinstance(value, float):
                assert abs(value - b[key]) < 1e-6, (a["id"], key, value, b[key])
            else:
                assert value == b[key], (a["id"], key)
    assert sorted(p.name for p in (runs["two"] / "eval").iterdir()) == ["held_out.jsonl"]  # rank 0 alone wrote
    s1, s2 = (json.loads((run / "summary.json").read_text())["held_out"] for run in runs.values())
    assert s1.keys() == s2.keys() and {"reward", "g2p_final", "questions", "events"} <= set(s1)
    for key in s1:
        assert abs(s1[key] - s2[key]) < 1e-6, (key, s1[key], s2[key])
    assert any(line.startswith("g2p_final") for line in tables["one"]) and tables["one"] == tables["two"]
