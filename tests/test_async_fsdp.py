"""Rollouts ahead of the update under ``grpo_fsdp`` (issue 33): every agent samples through a vLLM
engine of its own (tests/fake_vllm.py), the main thread gathers each snapshot and takes every
collective, the rollout thread only drives the engine.

Two gloo processes: step s samples with exactly the gathered θ_{max(0, s−K)}, each install is
verified, no collective (a sharded forward, a DTensor gather, a lock-step all-reduce) ever runs in
the rollout thread, and both ranks' weights equal one process's."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from fake_vllm import fake_vllm  # noqa: F401  (a fixture)
from gloo import process_group, run_in_two_processes

from agentcap.core.settings import ConfigError
from agentcap.rollout.pipeline import RolloutPipeline

STEPS = 4


def _install_fake_vllm() -> None:
    """The ``fake_vllm`` fixture's modules, for a spawned rank (no pytest fixture there)."""
    import sys
    import types

    import fake_vllm as fake

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = fake.SamplingParams
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = fake.LoRARequest
    sys.modules.update({"vllm": vllm, "vllm.lora": types.ModuleType("vllm.lora"), "vllm.lora.request": request})


def _record_collectives(model: torch.nn.Module, threads: list[str]) -> None:
    """Note the thread of every forward of the (sharded) learner, every DTensor gather and every
    all-reduce / all-gather of objects: each is a collective."""
    from torch.distributed.tensor import DTensor

    model.register_forward_pre_hook(lambda *_: threads.append(threading.current_thread().name))
    full_tensor = DTensor.full_tensor

    def gather(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return full_tensor(self, *args, **kwargs)

    DTensor.full_tensor = gather
    for name in ("all_reduce", "all_gather_object", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor"):
        real = getattr(dist, name)

        def wrapped(*args, _real=real, **kwargs):
            threads.append(threading.current_thread().name)
            return _real(*args, **kwargs)

        setattr(dist, name, wrapped)


def _observations() -> list[dict]:
    return [{"agent": "policy", "messages": [{"role": "user", "content": text}], "media": {}}
            for text in ("describe the clip .", "what happens ?")]


def _fingerprint(weights) -> float:
    return float(sum(t.detach().double().sum() for t in weights))


def _steps(agent, k: int, sharded: bool, collectives: list[str] | None = None) -> dict:
    """K-stale GRPO-like steps: take R_s (sampled by the rollout thread through the engine), then an
    update of the NLL of its samples; returns what each batch was sampled with."""
    from agentcap.agents.backends.weights import gathered_weights
    from agentcap.agents.tokens import pad_right
    from agentcap.training.old_policy import fill_old_logprobs_together

    engine = agent.backend._llm
    optimizer = torch.optim.SGD(agent.trainable_parameters(), lr=0.5)
    pipeline = RolloutPipeline(k)
    pipeline.begin(0, agent)

    def request(step):
        def run(stand_ins):
            sampled = stand_ins["policy"].generate(_observations(), seeds=[7 * step, 7 * step + 1], old_logprobs=False)
            return _fingerprint(engine.model.parameters()), sampled
        return run

    thetas, held, tokens = [], [], []
    for step in range(STEPS):
        whole = gathered_weights(agent.model) if sharded else {n: p for n, p in agent.model.named_parameters()}
        thetas.append(_fingerprint(whole.values()))
        (weights, batch), staleness = pipeline.take(step, STEPS - 1, agent, request)
        assert staleness == step - max(0, step - k)
        held.append(weights)
        tokens.append([g.completion_ids.tolist() for g in batch])
        # the learner's log-probs, in this thread; rank 1 has one row fewer: it runs a stand-in pass
        rows = [SimpleNamespace(observation=o, completion_ids=g.completion_ids, old_logprobs=None)
                for o, g in zip(_observations(), batch)]
        fill_old_logprobs_together(agent, rows[: 1 if sharded and dist.get_rank() == 1 else 2], 1)
        assert all(r.old_logprobs is not None for r in rows[:1])
        completion, mask = pad_right([g.completion_ids for g in batch], agent.tokenizer.pad_token_id)
        # each rank's share of the global loss (agentcap sums the ranks' gradients)
        share = dist.get_world_size() if sharded else 1
        loss = -(agent.completion_logprobs(agent.encode(_observations()), completion, mask) * mask).sum() / share
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        agent.sync_weights()
    pipeline.close()
    return {"thetas": thetas, "held": held, "tokens": tokens, "syncs": agent.backend.syncs,
            "gap": agent.backend.gap, "engine_threads": sorted(set(engine.threads)),
            "collective_threads": sorted(set(collectives or []))}


def _rank(rank: int, port: int, out: str, k: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    _install_fake_vllm()
    from fake_vllm import engine_agent

    from agentcap.parallel.sharding import shard_agents

    with process_group(rank, port):
        agent = engine_agent("policy", [], Path(out) / f"rank{rank}")  # the engine copies the weights now
        agent.backend.options.enable_sleep_mode = False
        agent.max_new_tokens = 3
        agent.backend._llm.sample = True
        shard_agents({"policy": agent}, init_device_mesh("cpu", (2,)))
        agent.set_trainable(True)
        threads: list[str] = []
        _record_collectives(agent.model, threads)
        result = _steps(agent, k, sharded=True, collectives=threads)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow  # 2 gloo processes
@pytest.mark.usefixtures("fake_vllm")
def test_k1_under_fsdp_samples_with_the_gathered_weights_and_no_collective_runs_in_the_worker(tmp_path):
    from fake_vllm import engine_agent

    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
    run_in_two_processes(_rank, str(tmp_path), 1)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for result in ranks:
        # exactly θ_max(0, s−1), gathered whole in the main thread, in the engine when R_s was sampled
        assert result["held"] == pytest.approx([result["thetas"][max(0, s - 1)] for s in range(STEPS)], rel=1e-6)
        assert result["held"][2] != pytest.approx(result["thetas"][2], rel=1e-6)  # not the newer weights
        assert result["syncs"] == STEPS and result["gap"] < 1e-4  # one verified install per batch
        assert result["engine_threads"] == ["agentcap-rollout_0"]  # the worker drives the engine
        assert result["collective_threads"] == ["MainThread"]  # ... and runs no collective
    assert ranks[0]["thetas"] == pytest.approx(ranks[1]["thetas"], rel=1e-6)
    assert ranks[0]["tokens"] == ranks[1]["tokens"]
    # one process, unsharded: the same samples and the same weights (N processes = 1)
    (tmp_path / "one").mkdir()
    agent = engine_agent("policy", [], tmp_path / "one")
    agent.backend.options.enable_sleep_mode = False
    agent.max_new_tokens = 3
    agent.backend._llm.sample = True
    agent.set_trainable(True)
    one = _steps(agent, 1, sharded=False)
    assert one["tokens"] == ranks[0]["tokens"]
    assert one["thetas"] == pytest.approx(ranks[0]["thetas"], rel=1e-5)


def test_hf_sampling_under_fsdp_is_refused_naming_the_backend_that_works(tmp_path, fake_vllm):
    from fake_vllm import engine_agent
    from tiny_agents import tiny_agent

    agents = {"policy": engine_agent("policy", [], tmp_path), "judge": tiny_agent("qwen2", name="judge")}
    with pytest.raises(ConfigError) as refused:
        RolloutPipeline.check_sharded(1, agents)
    message = str(refused.value)
    assert "agents.judge.backend is hf" in message and "backend: vllm" in message and "policy" not in message
    RolloutPipeline.check_sharded(1, {"policy": agents["policy"]})  # every agent on an engine: allowed
    RolloutPipeline.check_sharded(0, agents)
