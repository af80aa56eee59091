"""Bounded-staleness asynchronous GRPO (issue 24): ``model.max_staleness: K``.

Step s samples with θ_{max(0, s−K)} exactly (agentcap.rollout.pipeline); K = 0 is the serial step.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import yaml

from fake_vllm import fake_vllm  # noqa: F401  (a fixture)

from agentcap.algorithms.offpolicy import STALE_TIS_CAP, effective_tis_cap
from agentcap.core.settings import ConfigError
from agentcap.rollout.pipeline import RolloutPipeline

ROOT = Path(__file__).resolve().parents[1]

GRPO = [
    {"name": "sft", "kind": "sft", "agent": "policy", "steps": 80},
    {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 4},
    {"name": "after", "kind": "evaluate", "split": "test"},
]


# --- the pipeline on its own ------------------------------------------------------------------
def _policy():
    from tiny_agents import tiny_agent

    agent = tiny_agent("qwen2", max_new_tokens=4)
    agent.set_trainable(True)
    return agent


def _fingerprint(agent) -> float:
    """The sum of ``agent.model``'s weights (an agent's, or a fake engine's copy)."""
    return float(sum(p.detach().double().sum() for p in agent.model.parameters()))


def _run_steps(pipeline: RolloutPipeline, agent, steps: int, calls: list[int] | None = None):
    """Take every step's 'rollout' (the sampler's version and weights), then 'update' in place."""
    seen, before = [], []

    def request(step):
        if calls is not None:
            calls.append(step)
        return lambda stand_ins: (stand_ins[agent.name].backend.version, _fingerprint(stand_ins[agent.name]))

    for step in range(steps):
        before.append(_fingerprint(agent))
        (version, weights), staleness = pipeline.take(step, steps - 1, agent, request)
        seen.append((version, weights, staleness))
        with torch.no_grad():
            for p in agent.trainable_parameters():
                p.add_(0.01 * (step + 1))  # θ_step → θ_step+1, in place, while later steps may be sampling
    return seen, before


@pytest.mark.parametrize("k", [1, 2])
def test_step_s_samples_with_the_weights_of_step_s_minus_k(k):
    agent = _policy()
    pipeline = RolloutPipeline(k)
    pipeline.begin(0, agent)
    calls: list[int] = []
    seen, before = _run_steps(pipeline, agent, 6, calls)
    for step, (version, weights, staleness) in enumerate(seen):
        assert version == max(0, step - k) and staleness == step - version
        assert weights == before[max(0, step - k)]  # exactly θ_{max(0, s−K)}, whatever the thread timing
    assert sorted(calls) == list(range(6)), "each step requested once, none past the stage's last"
    assert pipeline.state() is None  # nothing in flight after the stage's last step
    pipeline.close()


def test_max_staleness_0_runs_inline_without_a_thread_or_a_copy():
    agent = _policy()
    pipeline = RolloutPipeline(0)
    pipeline.begin(0, agent)
    threads = threading.active_count()
    batch, staleness = pipeline.take(0, 3, agent, lambda step: lambda stand_ins: stand_ins)
    assert batch is None and staleness == 0  # the driver runs with its own agents
    assert pipeline._executor is None and pipeline._sampler is None and threading.active_count() == threads


def test_a_stage_boundary_drains_the_batches_in_flight():
    agent = _policy()
    pipeline = RolloutPipeline(2)
    pipeline.begin(0, agent)
    pipeline.take(0, 9, agent, lambda step: lambda stand_ins: step)
    assert pipeline.state()["pending"] and [p["step"] for p in pipeline.state()["pending"]] == [1, 2]
    pipeline.begin(1, None)  # e.g. an evaluate stage
    assert pipeline.state() is None and pipeline._sampler is None
    pipeline.close()


def test_pending_batches_survive_a_weights_only_checkpoint_and_resample_the_same():
    agent = _policy()
    pipeline = RolloutPipeline(1)
    pipeline.begin(3, agent)
    request = lambda step: lambda stand_ins: _fingerprint(stand_ins[agent.name])  # noqa: E731
    pipeline.take(0, 5, agent, request)
    expected = _fingerprint(agent)  # θ_0: what R_1 is sampled with
    buffer = io.BytesIO()
    torch.save({"agentcap": {"rollouts": pipeline.state()}}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["agentcap"]["rollouts"]
    pipeline.close()
    with torch.no_grad():
        for p in agent.trainable_parameters():
            p.add_(1.0)  # the resumed learner holds θ_1
    resumed = RolloutPipeline(1)
    resumed.load_state(saved)
    resumed.begin(3, agent)
    value, staleness = resumed.take(1, 5, agent, request)
    assert value == expected and staleness == 1
    resumed.close()


def test_the_sampler_copy_scores_its_samples_as_the_learner_does():
    """At staleness 0 the sampler's log-probs are the learner's: the gap and the TIS weights then vanish."""
    from agentcap.agents.backends.snapshot import sampler_copy
    from agentcap.agents.tokens import pad_right

    agent = _policy()
    twin = sampler_copy(agent)
    assert twin.model is not agent.model and not twin.trainable_parameters()
    assert all(p.requires_grad for p in agent.trainable_parameters())  # the learner is untouched
    observations = [{"agent": "policy", "messages": [{"role": "user", "content": "a b c"}]}] * 3
    generations = twin.generate(observations, seeds=[1, 2, 3], old_logprobs=False)
    completion, mask = pad_right([g.completion_ids for g in generations], agent.tokenizer.pad_token_id)
    learner = agent.completion_logprobs(agent.encode(observations), completion, mask)
    for g, row in zip(generations, learner):
        torch.testing.assert_close(g.sampler_logprobs, row[: g.completion_ids.numel()].detach())
    same = agent.generate(observations, seeds=[1, 2, 3], old_logprobs=False)
    assert [g.text for g in same] == [g.text for g in generations]  # same weights, same seeds: same samples


@pytest.mark.usefixtures("fake_vllm")
@pytest.mark.parametrize("k", [1, 2])
def test_a_vllm_engine_takes_each_batchs_snapshot_in_the_rollout_thread(k, tmp_path):
    """With the vLLM backend the stand-in drives the learner's own engine (tests/fake_vllm.py): the
    rollout thread installs θ_{max(0, s−K)} before each batch, verified on the probe, never during a
    generation, and the main thread never touches the engine while the stage runs."""
    from fake_vllm import engine_agent, observation, step

    agent = engine_agent("policy", [], tmp_path)
    agent.set_trainable(True)
    engine, backend = agent.backend._llm, agent.backend
    pipeline = RolloutPipeline(k)
    pipeline.begin(0, agent)
    twin = pipeline._sampler
    assert twin.model is agent.model and twin.tokenizer is not agent.tokenizer  # a stand-in, not a copy
    assert all(p.requires_grad for p in agent.trainable_parameters())

    def request(_step):
        def run(stand_ins):
            sampled = stand_ins["policy"].generate([observation("policy")], seeds=[0], old_logprobs=False)
            return _fingerprint(engine), sampled[0]
        return run

    torch.manual_seed(0)
    before = []
    for s in range(5):
        before.append(_fingerprint(agent))
        (held, sampled), staleness = pipeline.take(s, 4, agent, request)
        assert staleness == s - max(0, s - k) and held == before[max(0, s - k)]
        assert sampled.sampler_logprobs is not None  # the engine's own, for the TIS correction
        step(agent, lr=0.05)  # the update, in place; marks the engine stale
    pipeline.close()
    assert backend.syncs == 5 and backend.gap < 1e-4  # one verified install per batch
    assert set(engine.threads) == {"agentcap-rollout_0"}
    agent.set_trainable(False)
    agent.generate([observation("policy")], old_logprobs=False)  # after the stage: a plain sync, in this thread
    assert engine.threads[-2:] == ["MainThread"] * 2 and _fingerprint(engine) == _fingerprint(agent)


def test_settings_are_checked():
    from agentcap.agents.agent import AgentConfig

    assert effective_tis_cap(None, 1) == STALE_TIS_CAP and effective_tis_cap(None, 0) is None
    assert effective_tis_cap(5.0, 1) == 5.0
    shared = {"a": AgentConfig(tiny={"model_type": "gpt2"}), "b": AgentConfig(share_base_with="a")}
    with pytest.raises(ConfigError, match="agents.b.share_base_with"):
        RolloutPipeline.check(1, shared)
    RolloutPipeline.check(0, shared)
    with pytest.raises(ConfigError, match="grpo_fsdp"):
        RolloutPipeline.check_sharded(1)
    RolloutPipeline.check(1, {"a": AgentConfig(model="folder", backend="vllm")})  # vLLM samples ahead too


# --- fits -------------------------------------------------------------------------------------
def _fit(config: Path, *extra: str) -> None:
    from agentcap.cli import main

    main(["fit", "--config", str(config), *extra])


def _results(run: Path) -> tuple[dict, dict[str, torch.Tensor], list[dict]]:
    summary = json.loads((run / "summary.json").read_text())
    weights = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    rows = list(csv.DictReader(next(run.rglob("metrics.csv")).open()))
    # a GRPO step's row: its trained agent's reward/<agent>/total (ACE-Cap: captioner, instruct, composer)
    steps = [r for r in rows if any(k.startswith("reward/") and k.endswith("/total") and v for k, v in r.items())]
    return summary, weights, steps


def test_k1_repeats_exactly_and_logs_its_staleness_and_gap(tmp_path, toy_movie, make_read_config):
    runs = []
    for name in ("a", "b"):
        _fit(make_read_config(tmp_path / name, toy_movie, GRPO, max_staleness=1))
        runs.append(_results(tmp_path / name))
    (s1, w1, rows1), (s2, w2, rows2) = runs
    assert s1 == s2
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert [r["reward/policy/total"] for r in rows1] == [r["reward/policy/total"] for r in rows2]
    assert [float(r["async/staleness"]) for r in rows1] == [0.0, 1.0, 1.0, 1.0]
    gaps = [float(r["loss/policy/sampler_gap_mean"]) for r in rows1]
    assert gaps[0] == 0.0 and max(gaps[1:]) > 0  # R_1… come from θ_0…, which the update has left


def test_k1_with_one_grpo_step_equals_k0(tmp_path, toy_movie, make_read_config):
    """One step: R_0 is sampled with θ_0 either way; only the thread and the copy differ."""
    stages = [dict(GRPO[0]), {**GRPO[1], "steps": 1}, GRPO[2]]
    for name, k in (("k0", 0), ("k1", 1)):
        _fit(make_read_config(tmp_path / name, toy_movie, stages, max_staleness=k))
    (s0, w0, _), (s1, w1, _) = _results(tmp_path / "k0"), _results(tmp_path / "k1")
    assert s0 == s1
    for key in w0:
        torch.testing.assert_close(w0[key], w1[key], atol=1e-6, rtol=1e-5, msg=key)


def _subprocess_fit(config: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests"), **(env or {})},
    )


@pytest.mark.slow  # three `agentcap fit` subprocesses
def test_k1_kill_and_resume_equals_an_uninterrupted_run(tmp_path, toy_movie, make_read_config):
    stages = [dict(GRPO[0]), {**GRPO[1], "steps": 6}, GRPO[2]]
    whole = make_read_config(tmp_path / "whole", toy_movie, stages, max_staleness=1)
    assert _subprocess_fit(whole, "--checkpoint_every", "2").returncode == 0
    config = make_read_config(tmp_path / "killed", toy_movie, stages, max_staleness=1)
    config = config.rename(tmp_path / "killed.yaml")
    # killed after tick 84 (GRPO step 4): the newest checkpoint is tick 84's, written with R_5 in flight
    killed = _subprocess_fit(config, "--checkpoint_every", "2", "--trainer.callbacks+=kill_switch.KillAtTick",
                             "--trainer.callbacks.tick=85")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=True)["agentcap"]
    assert saved["tick"] == 84 and [p["step"] for p in saved["rollouts"]["pending"]] == [4]
    assert saved["rollouts"]["pending"][0]["version"] == 3
    resumed = _subprocess_fit(config, "--checkpoint_every", "2")
    assert resumed.returncode == 0 and "resuming from" in resumed.stderr, resumed.stderr[-3000:]
    (s1, w1, rows1), (s2, w2, rows2) = _results(tmp_path / "whole"), _results(tmp_path / "killed")
    assert s1 == s2
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    tail = {r["step"]: r["reward/policy/total"] for r in rows2}
    assert all(tail[r["step"]] == r["reward/policy/total"] for r in rows1 if r["step"] in tail)


@pytest.mark.slow  # `agentcap fit` in subprocesses, 2 DDP ranks
def test_k1_two_processes_equal_one(tmp_path, toy_movie, make_read_config):
    results = {}
    for name, extra in (("one", ()), ("two", ("--trainer.devices=2", "--trainer.strategy=ddp"))):
        result = _subprocess_fit(make_read_config(tmp_path / name, toy_movie, GRPO, max_staleness=1), *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        results[name] = _results(tmp_path / name)
    (s1, w1, _), (s2, w2, _) = results["one"], results["two"]
    for key in w1:
        torch.testing.assert_close(w1[key], w2[key], atol=1e-5, rtol=1e-4, msg=key)
    for key in s1["after"]:
        assert abs(s1["after"][key] - s2["after"][key]) < 1e-5, key


def _audiomap_config(run_dir: Path, world: Path, stages: list[dict], **model) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "enable_model_summary": False,
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(run_dir)}}},
        "model": {
            "run_dir": str(run_dir),
            "env": {"id": "agentcap/ClozeCaption-v0",
                    "kwargs": {"prompt": "compact", "examiner": "rule", "temporal_examiner": "rule",
                               "on_error": "skip"},
                    **{split: {"manifest": str(world / f"{split}.jsonl")} for split in ("train", "val", "test")}},
            "agents": {"policy": {"toy": {"media": "audio", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                                          "intermediate_size": 32},
                                  "build_tokenizer_from": [str(world / "texts.txt")], "max_new_tokens": 8,
                                  "lr": 1e-3}},
            "group_size": 2, "rollout_batch_size": 4, "minibatch_size": 4, "sft_batch_size": 2, "eval_limit": 2,
            "stages": stages, **model,
        },
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.slow  # two fits
def test_audiomap_and_acecap_train_with_k1(tmp_path, toy_soundscapes, make_game_config):
    """AudioMap's reward curriculum, and ACE-Cap's game: the Captioner and the Composer train while the
    frozen roles answer with their own weights, and Instruct replays its harvest."""
    audiomap = [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
        {"name": "r1", "kind": "grpo", "agent": "policy", "steps": 3, "env": {"weights": {"esr": 1.0, "ectr": 0.0}}},
        {"name": "r2", "kind": "grpo", "agent": "policy", "steps": 3},
        {"name": "after", "kind": "evaluate", "split": "test"},
    ]
    _fit(_audiomap_config(tmp_path / "audiomap", toy_soundscapes, audiomap, max_staleness=1))
    game = [
        {"name": "captioner_grpo", "kind": "grpo", "agent": "captioner", "steps": 2, "env": {"mode": "captioner"}},
        {"name": "instruct_grpo", "kind": "grpo", "agent": "instruct", "steps": 3, "env": {"mode": "instruct"},
         "harvest": {"mode": "game"}, "harvest_items": 3},
        {"name": "composer", "kind": "grpo", "agent": "composer", "steps": 3},
        {"name": "after", "kind": "evaluate", "split": "test"},
    ]
    _fit(make_game_config(tmp_path / "acecap", toy_soundscapes, game, max_staleness=1))
    for run, steps in (("audiomap", [3, 3]), ("acecap", [2, 3, 3])):
        _, _, rows = _results(tmp_path / run)
        by_stage: dict[str, list[float]] = {}
        for row in rows:
            by_stage.setdefault(row["stage"], []).append(float(row["async/staleness"]))
        # each stage starts from its own weights (staleness 0), then samples one step behind
        assert list(by_stage.values()) == [[0.0] + [1.0] * (n - 1) for n in steps]
        assert "after" in json.loads((tmp_path / run / "summary.json").read_text())
