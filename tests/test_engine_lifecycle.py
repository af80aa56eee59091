"""The order of engine sleep / wake / sync / generate over a schedule, with a recording engine
(tests/fake_vllm.py: no vLLM here). The real CPU-build engine is exercised in tests/vllm_engine.
"""

from __future__ import annotations

from itertools import groupby

import gymnasium as gym
import pytest
import yaml
from fake_vllm import engine_agent, fake_vllm, observation, step  # noqa: F401  (fake_vllm: autouse fixture)

from agentcap.agents.backends.vllm import WeightSyncError
from agentcap.core.schedule import Stage
from agentcap.rollout.splits import EnvConfig
from agentcap.training import engines

pytestmark = pytest.mark.usefixtures("fake_vllm")

# --- a two-role task: both roles act in `pair` mode, the policy alone in `solo` ---------------
class TwoRoles:
    @staticmethod
    def acting_roles(mode: str = "pair", **_):
        return {"pair": {"policy", "helper"}, "solo": {"policy"}}[mode]


gym.register("test/TwoRoles-v0", entry_point=TwoRoles)
ENV = EnvConfig(id="test/TwoRoles-v0")

STAGES = [
    Stage("sft_policy", "sft", "policy"),
    Stage("grpo_pair", "grpo", "policy", steps=2),
    Stage("grpo_solo", "grpo", "policy", env={"mode": "solo"}),
    Stage("sft_helper", "sft", "helper"),
    Stage("eval", "evaluate", split="val"),
]


def run_schedule(agents: dict, stages=STAGES) -> None:
    """What GRPOModule does with the engines: stage start, rollouts, updates."""
    for index, stage in enumerate(stages):
        for agent in agents.values():
            agent.set_trainable(agent.name == stage.agent and stage.kind != "evaluate")
        engines.begin_stage(agents, stages, index, ENV)
        acting = engines.acting_roles(stage, ENV, agents)
        for _ in range(stage.ticks()):
            for name in agents:  # a rollout: every acting role generates
                if name in acting:
                    agents[name].generate([observation(name)], old_logprobs=False)
            if stage.kind != "evaluate":
                step(agents[stage.agent])


def test_stage_roles_and_levels():
    uses = [engines.acting_roles(s, ENV, ["policy", "helper"]) for s in STAGES]
    assert uses == [set(), {"policy", "helper"}, {"policy"}, set(), {"policy", "helper"}]
    levels = [engines.sleep_levels(STAGES, i, uses, ["policy", "helper"]) for i in range(len(STAGES))]
    assert levels == [
        {"policy": 2, "helper": 1},  # trains now: weights stale; used by grpo_pair as they are
        {"policy": 0, "helper": 0},
        {"policy": 0, "helper": 2},  # trained (sft_helper) before its next use
        {"policy": 1, "helper": 2},  # used again by eval, frozen
        {"policy": 0, "helper": 0},
    ]


def test_the_order_of_sleep_wake_sync_and_generate(tmp_path):
    log: list[str] = []
    agents = {name: engine_agent(name, log, tmp_path, seed) for seed, name in enumerate(("policy", "helper"))}
    run_schedule(agents)
    events = [e for e, _ in groupby(log)]  # one "load" per decoder layer: collapsed
    assert events == [
        # sft_policy: nothing generates; the trained policy's engine drops its weights, the helper's keeps them
        "policy.sleep(2)", "helper.sleep(1)",
        # grpo_pair, step 1: the policy's weights first, then the KV cache; the probe checks the sync
        "policy.wake(weights)", "policy.load", "policy.wake(all)", "policy.probe", "policy.generate",
        "helper.wake(all)", "helper.generate",  # level 1: awake with its weights, nothing to sync
        # step 2: the update made the policy stale: synced while awake
        "policy.load", "policy.probe", "policy.generate", "helper.generate",
        # grpo_solo: the helper sleeps (it trains before its next use: level 2)
        "helper.sleep(2)", "policy.load", "policy.probe", "policy.generate",
        # sft_helper: the frozen policy keeps its weights for eval
        "policy.sleep(1)",
        # eval: the policy changed since its last sync (grpo_solo's step), the helper lost its weights
        "policy.wake(weights)", "policy.load", "policy.wake(all)", "policy.probe", "policy.generate",
        "helper.wake(weights)", "helper.load", "helper.wake(all)", "helper.probe", "helper.generate",
    ]
    assert all(agent.backend.gap < 1e-4 for agent in agents.values())


def test_an_engine_never_built_is_not_built_to_sleep(tmp_path):
    agent = engine_agent("policy", [], tmp_path)
    agent.backend._llm = None
    assert agent.backend.sleep(2) == 0 and agent.backend._llm is None


def test_sleep_mode_off_keeps_the_engine_awake(tmp_path):
    log: list[str] = []
    agent = engine_agent("policy", log, tmp_path)
    agent.backend.options.enable_sleep_mode = False
    assert agent.backend.sleep(2) == 0 and log == []


def test_weights_never_go_into_a_sleeping_engine(tmp_path):
    """The guard is live: loading without waking fails, in the backend and in the engine."""
    agent = engine_agent("policy", [], tmp_path)
    backend = agent.backend
    backend.sleep(1)
    from agentcap.agents.backends.weights import layers

    with pytest.raises(AssertionError, match="sleeping"):
        backend._load(layers(agent.model))
    backend._asleep.clear()  # a backend that forgot to wake
    with pytest.raises(AssertionError, match="sleeping engine"):
        backend._load(layers(agent.model))


def test_a_sync_that_sends_nothing_stops_the_run(tmp_path, monkeypatch):
    agent = engine_agent("policy", [], tmp_path)
    agent.set_trainable(True)
    step(agent)
    import agentcap.agents.backends.vllm as vllm_backend

    monkeypatch.setattr(vllm_backend, "layers", lambda model, weights=None: iter([]))
    with pytest.raises(WeightSyncError, match=r"agents\.policy: weight sync 1 did not reach the vLLM engine.*"
                                              r"tolerance 0\.001 \(agents\.policy\.vllm\.sync_tolerance\)"):
        agent.generate([observation("policy")], old_logprobs=False)


def test_the_acecap_recipe_keeps_only_acting_engines_awake():
    """configs/acecap.yaml: which engines each stage keeps awake, and how the others sleep."""
    config = yaml.safe_load(open("configs/acecap.yaml"))["model"]
    stages = [Stage(**s) for s in config["stages"]]
    env = EnvConfig(**config["env"])
    roles = list(config["agents"])
    uses = [engines.acting_roles(s, env, roles) for s in stages]
    levels = {s.name: engines.sleep_levels(stages, i, uses, roles) for i, s in enumerate(stages)}
    # each role trains (SFT) before it next generates: nothing worth keeping
    assert levels["sft_captioner"] == {"captioner": 2, "composer": 2, "instruct": 2}
    assert levels["captioner_grpo"] == {"captioner": 0, "composer": 1, "instruct": 1}  # S2 plays the game
    assert levels["instruct_grpo"] == {"captioner": 1, "composer": 1, "instruct": 0}
    assert levels["cycle1_composer"] == {"captioner": 0, "composer": 0, "instruct": 0}
    assert levels["S5"] == {"captioner": 0, "composer": 0, "instruct": 0}
