"""Rollouts ahead of the update (``max_staleness`` ≥ 1) through served engines, against the fake vLLM
server of tests/test_served_backend.py: every batch is sampled by the adapter (or weight) version of the
step it was queued with, recorded on each generation and checked when the batch is taken; a version
stays loaded until its batches are done; a server restarted mid-run is named before anything trains."""

from __future__ import annotations

import threading

import pytest

from test_served_backend import LORA, OBS, FakeVLLM, fake_for, fakes, full_agent, lora_agent, serve, train  # noqa: F401 (fakes: a fixture)

from agentcap.agents.agent import AgentConfig, build_agents
from agentcap.agents.backends import served as served_module
from agentcap.agents.backends.served import ServedEngineError
from agentcap.core.settings import ConfigError
from agentcap.rollout.driver import RolloutBatch, Span
from agentcap.rollout.pipeline import RolloutPipeline, StaleRolloutError


class Recording(FakeVLLM):
    """The fake server, logging loads, unloads, rollouts and restarts in order; a rollout whose seed is
    in ``hold`` waits for ``gate`` (after setting ``waiting``). As with a real `vllm serve`, no request
    straddles a restart: each completion (answer and log entry) runs wholly before or after it, so a
    rollout logged after the restart was answered by the restarted server."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, str]] = []
        self.loaded_sums: dict[str, float] = {}
        self.hold: set[int] = set()
        self.gate, self.waiting = threading.Event(), threading.Event()
        self.order = threading.Lock()  # a completion, or a restart, at a time

    def restart(self):
        with self.order:
            super().restart()
            self.events.append(("restart", ""))

    def load_lora(self, body):
        status, reply = super().load_lora(body)
        if status == 200:
            name = body["lora_name"]
            self.events.append(("load", name))
            self.loaded_sums[name] = float(sum(t.double().sum() for t in self.adapters[name].values()))
        return status, reply

    def unload_lora(self, body):
        self.events.append(("unload", body["lora_name"]))
        return super().unload_lora(body)

    def completions(self, body):
        rollout = body.get("prompt_logprobs") is None
        if rollout and body.get("seed") in self.hold:
            self.waiting.set()
            self.gate.wait(30)
        with self.order:
            status, reply = super().completions(body)
            if rollout and status == 200:
                self.events.append(("rollout", body["model"]))
        return status, reply


def started(tmp_path, fakes, k: int, agent=None):
    """A trainable agent (default: LoRA) on a recording fake server, and a pipeline of K = ``k`` in its
    GRPO stage."""
    if agent is None:
        agent = lora_agent()
        agent.set_trainable(True)
    fake = fake_for(agent, fakes, Recording)
    serve(agent, fake, tmp_path)
    pipeline = RolloutPipeline(k)
    pipeline.begin(0, agent)
    return agent, fake, pipeline


def adapter_sum(agent) -> float:
    return float(sum(t.double().sum() for t in agent.backend.adapter.tensors().values()))


def most_held(events) -> int:
    """The most versions a server held at once; asserts that every rollout asked for a version between
    its load and its unload."""
    held: set[str] = set()
    most = 0
    for event, name in events:
        if event == "load":
            held.add(name)
            most = max(most, len(held))
        elif event == "unload":
            held.discard(name)
        elif event == "rollout":
            assert name in held, f"a rollout asked for {name} outside its load … unload"
    return most


def request_for(agent, seeds_of=lambda step: [10 * step + 1, 10 * step + 2]):
    """A 'rollout' of step s: two generations of the stand-in, as a RolloutBatch of spans (so the
    pipeline checks their versions)."""
    def request(step):
        def run(stand_ins):
            generations = stand_ins[agent.name].generate([OBS, OBS], seeds=seeds_of(step), old_logprobs=False)
            spans = [Span(**vars(g), agent=agent.name, kind="caption", trajectory=i, group=0, action_index=0,
                          observation=OBS) for i, g in enumerate(generations)]
            return RolloutBatch([], [], spans)
        return run
    return request


@pytest.mark.parametrize("k", [1, 2])
def test_each_batch_samples_with_the_adapter_of_its_step_and_old_ones_unload_after_their_rollouts(k, tmp_path, fakes):
    agent, fake, pipeline = started(tmp_path, fakes, k)
    stand_in = pipeline._sampler.backend
    request, steps, before = request_for(agent), 6, []
    for s in range(steps):
        before.append(adapter_sum(agent))
        batch, staleness = pipeline.take(s, steps - 1, agent, request)
        assert staleness == s - max(0, s - k) <= k
        name = stand_in.expected(max(0, s - k))
        assert name == f"{served_module.TRAINER}.policy.v{max(0, s - k) + 1}"  # steps 0…K share v1
        assert {span.sampler_version for span in batch.spans} == {name}, "every rollout records its version"
        assert fake.loaded_sums[name] == pytest.approx(before[max(0, s - k)], abs=1e-9), "θ_{s−K}'s adapter"
        train(agent)  # the update, in place, while later batches may be sampling
    pipeline.close()
    loads = [n for e, n in fake.events if e == "load"]
    assert len(loads) == steps - k, "one version per learner step, installed once"
    assert fake.adapters == {}, "every version unloaded once its batches were done"
    assert most_held(fake.events) <= k + 1
    for name in loads:
        last_rollout = max(i for i, (e, n) in enumerate(fake.events) if e == "rollout" and n == name)
        assert fake.events.index(("unload", name)) > last_rollout


def test_a_version_stays_loaded_when_its_first_batch_ends_before_the_next_is_queued(tmp_path, fakes):
    """K = 1 at a stage's start queues R_0 and R_1 with θ_0: R_1's request (main thread: items, seeds,
    collectives under FSDP) may still be running when R_0's rollouts are done. θ_0's adapter must stay
    for R_1, not be unloaded and installed again under a new name (seen under grpo_fsdp)."""
    import time

    agent, fake, pipeline = started(tmp_path, fakes, 1)
    inner = request_for(agent)

    def request(step):
        if step == 1:  # R_0 (two rollouts) finishes while this request is prepared
            deadline = time.monotonic() + 30
            while sum(e == "rollout" for e, _ in fake.events) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        return inner(step)

    names = []
    for s in range(3):
        batch, _ = pipeline.take(s, 2, agent, request)
        names.append({span.sampler_version for span in batch.spans})
        train(agent)
    pipeline.close()
    v1, v2 = (f"{served_module.TRAINER}.policy.v{n}" for n in (1, 2))
    assert names == [{v1}, {v1}, {v2}]
    assert [n for e, n in fake.events if e == "load"] == [v1, v2]


def test_a_batch_from_another_version_or_too_old_is_refused(tmp_path, fakes):
    agent, fake, pipeline = started(tmp_path, fakes, 1)
    good = request_for(agent)

    def wrong(step):
        run = good(step)

        def relabelled(stand_ins):
            batch = run(stand_ins)
            batch.spans[1].sampler_version = "agentcap-x.policy.v9"
            return batch
        return relabelled

    with pytest.raises(StaleRolloutError, match=r"step 0's rollouts were queued with .*v1.* came from \['agentcap-x"):
        pipeline.take(0, 3, agent, wrong)
    pipeline.close()
    # a batch (from a checkpoint) queued with weights more than K steps old
    pipeline = RolloutPipeline(1)
    pipeline.begin(0, agent)
    pipeline._saved = {3: (pipeline._sampler.backend.snapshot(agent), 0)}
    with pytest.raises(StaleRolloutError, match=r"step 3: its rollouts were queued with the weights of step 0, 3 steps old"):
        pipeline.take(3, 5, agent, good)
    pipeline.close()


def test_a_server_restarted_mid_run_is_named_before_the_update(tmp_path, fakes, monkeypatch):
    agent, fake, pipeline = started(tmp_path, fakes, 1)
    request = request_for(agent)
    fake.hold = {11}  # step 1's first rollout waits (sampled ahead, with step 0's adapter) …
    pipeline.take(0, 3, agent, request)
    assert fake.waiting.wait(30)
    fake.restart()  # … while the server restarts: the adapter it asks for is gone
    fake.gate.set()
    train(agent)
    with pytest.raises(ServedEngineError, match=r"restarted since sync \d+: its adapter '.*policy\.v1' is gone"):
        pipeline.take(1, 3, agent, request)  # raised before step 1 is updated on anything
    pipeline.close()
    lost = f"{served_module.TRAINER}.policy.v1"
    restarted = fake.events.index(("restart", ""))
    assert ("rollout", lost) not in fake.events[restarted:], "no rollout of the lost version answered after the restart"
    # resuming (another trainer process) on the restarted server installs its versions again
    monkeypatch.setattr(served_module, "TRAINER", "agentcap-resumed")
    resumed = lora_agent()
    resumed.set_trainable(True)
    serve(resumed, fake, tmp_path / "resumed")
    pipeline = RolloutPipeline(1)
    pipeline.begin(0, resumed)
    batch, staleness = pipeline.take(0, 1, resumed, request_for(resumed))
    assert {s.sampler_version for s in batch.spans} == {"agentcap-resumed.policy.v1"} and staleness == 0
    pipeline.close()


def test_a_restart_between_batches_of_one_version_is_named(tmp_path, fakes):
    """K = 2: steps 0, 1 and 2 share step 0's adapter; the server loses it after step 1's batch, before
    step 2's starts."""
    agent, fake, pipeline = started(tmp_path, fakes, 2)
    request = request_for(agent)
    stand_in, loads = pipeline._sampler.backend, []
    original = stand_in.load

    def load(snapshot, version):  # step 2's batch waits before it starts
        loads.append(version)
        if len(loads) == 3:
            fake.waiting.set()
            fake.gate.wait(30)
        original(snapshot, version)

    stand_in.load = load
    pipeline.take(0, 4, agent, request)
    pipeline.take(1, 4, agent, request)
    assert fake.waiting.wait(30)
    fake.restart()
    fake.gate.set()
    with pytest.raises(ServedEngineError, match="restarted since sync"):
        pipeline.take(2, 4, agent, request)
    pipeline.close()


def test_full_weights_ahead_record_the_weight_version(tmp_path, fakes):
    agent, fake, pipeline = started(tmp_path, fakes, 1, full_agent())
    request = request_for(agent)
    for s in range(4):
        batch, staleness = pipeline.take(s, 3, agent, request)
        want = f"{served_module.TRAINER}.policy.v{max(0, s - 1) + 1}"
        assert staleness == min(s, 1) and {span.sampler_version for span in batch.spans} == {want}
        train(agent, 0.05)
    pipeline.close()
    assert fake.weight_version == f"{served_module.TRAINER}.policy.v3" and agent.backend.gap < 1e-4
    assert agent.backend.stale, "the servers hold older weights than the learner: the next plain use syncs"
    agent.backend.sync()
    assert fake.weight_version == f"{served_module.TRAINER}.policy.v4"


def test_served_roles_may_sample_ahead(tmp_path):
    served = {"urls": ["http://127.0.0.1:9/v1"], "model": "base", "folder": str(tmp_path)}
    lora = LORA  # a LoraSpec, as jsonargparse builds it from the YAML
    configs = {
        "captioner": AgentConfig(tiny={"kind": "qwen2"}, peft=lora, backend="served", vllm={"served": served}),
        "instruct": AgentConfig(share_base_with="captioner", peft=lora, backend="served", vllm={"served": served}),
    }
    RolloutPipeline.check(1, configs)
    mixed = {**configs, "instruct": AgentConfig(share_base_with="captioner", peft=lora)}
    with pytest.raises(ConfigError, match="agents.instruct.backend is 'hf'"):
        RolloutPipeline.check(1, mixed)
    RolloutPipeline.check_sharded(1, build_agents(configs))  # under grpo_fsdp too: the servers hold the weights
