"""Numeric settings are checked when the config is built, before any weights load: each names its key,
its allowed range and the value; `agentcap fit` prints the refusal as one line and exits 2."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path

import pytest
import yaml

from agentcap.agents.adapters import LoraSpec
from agentcap.agents.agent import AgentConfig, build_agent
from agentcap.agents.backends.base import VLLMOptions
from agentcap.agents.sampling import RowSampler
from agentcap.cli import main
from agentcap.core.schedule import Schedule, Stage
from agentcap.core.settings import ConfigError, check
from agentcap.training import module as module_py
from agentcap.training.module import SETTINGS, GRPOModule

ROOT = Path(__file__).resolve().parents[1]
TOY = {"toy": {"media": "features", "hidden_size": 8, "num_layers": 1, "num_heads": 1, "intermediate_size": 8}}
STAGES = [Stage(name="sft", kind="sft", agent="policy", steps=2), Stage(name="grpo", kind="grpo", agent="policy")]


def numeric_fields(annotations: dict[str, object]) -> list[str]:
    """Names whose annotation mentions int or float (bool fields and strings are not numbers)."""
    return [name for name, kind in annotations.items() if {"int", "float"} & set(str(kind).replace("|", " ").split())]


@pytest.fixture
def no_building(monkeypatch):
    """Building an agent (loading weights) fails the test: the checks must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("agents were built before the settings were checked")

    monkeypatch.setattr(module_py, "build_agents", refuse)


def module(**settings):
    """A GRPOModule with these settings; env=None: a check that comes too late fails on it."""
    return GRPOModule(env=None, agents={"policy": AgentConfig(**TOY)}, stages=STAGES, **settings)


# --- GRPOModule -------------------------------------------------------------------------------
def test_every_numeric_module_argument_has_a_rule():
    arguments = {n: p.annotation for n, p in inspect.signature(GRPOModule.__init__).parameters.items()}
    assert set(numeric_fields(arguments)) == set(SETTINGS)


BAD = {"≥ 1": 0, "≥ 0": -1, "> 0": 0, "in (0, 1)": 1.0, "in (0, 1]": 1.5}


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_module_settings_are_refused_before_anything_is_built(key, no_building):
    rule = SETTINGS[key]
    with pytest.raises(ConfigError) as error:
        module(**{key: BAD[rule]})
    assert str(error.value) == f"--model.{key} must be {rule}, got {BAD[rule]}"


@pytest.mark.parametrize("key", ["beta", "clip_eps", "eps_norm", "max_grad_norm", "weight_decay", "tis_cap"])
def test_nan_and_inf_are_refused(key, no_building):
    for value in (math.nan, math.inf):
        with pytest.raises(ConfigError, match=rf"--model\.{key} must be .*, got {value}"):
            module(**{key: value})


def test_the_issue_values(no_building):
    for key, value, message in [
        ("beta", -0.1, "--model.beta must be ≥ 0, got -0.1"),
        ("clip_eps", -0.2, "--model.clip_eps must be in (0, 1), got -0.2"),
        ("ppo_epochs", 0, "--model.ppo_epochs must be ≥ 1, got 0"),
        ("group_size", -2, "--model.group_size must be ≥ 1, got -2"),  # not "must divide"
        ("group_size", 3, "--model.group_size (3) must divide --model.rollout_batch_size (16)"),
    ]:
        with pytest.raises(ConfigError) as error:
            module(**{key: value})
        assert str(error.value) == message


# --- stages -----------------------------------------------------------------------------------
@pytest.mark.parametrize("field", numeric_fields({f.name: f.type for f in dataclasses.fields(Stage)}))
@pytest.mark.parametrize("kind", ["sft", "evaluate"])
def test_every_numeric_stage_field_is_checked(field, kind):
    """-1 breaks every rule; steps and warmup_steps mean nothing to an evaluate stage (one tick)."""
    stage = Stage(name="s", kind=kind, agent="policy" if kind == "sft" else None, **{field: -1})
    if kind == "evaluate" and field in ("steps", "warmup_steps"):
        Schedule([stage], ["policy"])
        return
    with pytest.raises(ConfigError, match=rf"^--model\.stages\[0\]\.{field} must be .*, got -1 \(stage 's'\)"):
        Schedule([stage], ["policy"])


def test_stage_rules_read_as_written():
    with pytest.raises(ConfigError, match=r"--model\.stages\[1\]\.lr must be > 0, got 0\.0 \(stage 'b'\)"):
        Schedule([Stage(name="a", kind="evaluate"), Stage(name="b", kind="sft", agent="p", lr=0.0)], ["p"])
    with pytest.raises(ConfigError, match=r"warmup_steps must be ≤ steps \(2\), got 3"):
        Schedule([Stage(name="a", kind="sft", agent="p", steps=2, warmup_steps=3)], ["p"])
    with pytest.raises(ConfigError, match=r"lr must be > 0, got nan"):
        Schedule([Stage(name="a", kind="sft", agent="p", lr=math.nan)], ["p"])


# --- agents -----------------------------------------------------------------------------------
def spec_fields(cls) -> list[str]:
    return numeric_fields({f.name: f.type for f in dataclasses.fields(cls)})


@pytest.mark.parametrize(
    "where, field",
    [("", f) for f in spec_fields(AgentConfig)]
    + [("vllm.", f) for f in spec_fields(VLLMOptions)]
    + [("peft.", f) for f in spec_fields(LoraSpec)],
)
def test_every_numeric_agent_field_is_checked(where, field):
    if where == "vllm.":
        config = AgentConfig(**TOY, vllm=VLLMOptions(**{field: -1}))
    elif where == "peft.":
        config = AgentConfig(**TOY, peft=LoraSpec(**{field: -1}))
    else:
        config = AgentConfig(**TOY, **{field: -1})
    with pytest.raises(ConfigError, match=rf"^--model\.agents\.policy\.{where}{field} must be .*, got -1"):
        config.check("policy")


def test_temperature_zero_is_refused_saying_how_to_decode_greedily(no_building):
    with pytest.raises(ConfigError, match=r"temperature must be > 0, got 0.*greedy: true") as error:
        GRPOModule(env=None, agents={"policy": AgentConfig(**TOY, temperature=0)}, stages=STAGES)
    assert "--model.agents.policy.temperature" in str(error.value)
    with pytest.raises(ConfigError, match="temperature must be > 0"):  # also when built without the module
        build_agent("policy", AgentConfig(**TOY, temperature=0.0))
    for temperature, top_p in ((0.0, 1.0), (math.nan, 1.0), (1.0, 0.0)):
        with pytest.raises(ValueError, match="RowSampler"):
            RowSampler([0], temperature=temperature, top_p=top_p)


def test_top_p_one_and_small_temperatures_are_allowed():
    AgentConfig(**TOY, temperature=1e-3, top_p=1.0).check("policy")
    RowSampler([0], temperature=1e-3, top_p=1.0)


# --- shipped configs and the command line ------------------------------------------------------
@pytest.mark.parametrize("config", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")))
def test_shipped_configs_pass_the_rules(config):
    model = yaml.safe_load((ROOT / config).read_text())["model"]
    for key in SETTINGS.keys() & model.keys():
        check(f"--model.{key}", model[key], SETTINGS[key])
    Schedule([Stage(**s) for s in model["stages"]], list(model["agents"]))
    for role, spec in model["agents"].items():
        spec = {**spec, "peft": LoraSpec(**spec["peft"]) if spec.get("peft") else None}
        AgentConfig(**spec).check(role)


def test_fit_prints_a_one_line_refusal_before_building(tmp_path, toy_movie, make_read_config, capsys, no_building):
    config = make_read_config(tmp_path / "run", toy_movie, [{"name": "e", "kind": "evaluate", "split": "val"}])
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--model.beta", "-0.1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "agentcap: --model.beta must be ≥ 0, got -0.1"
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "tokenizers").exists()  # no agent was built


# --- sizes against the host memory (agentcap.core.bounds) ------------------------------------------
@pytest.mark.parametrize("key", ["rollout_batch_size", "sft_batch_size"])
def test_a_batch_that_cannot_fit_the_host_is_refused_before_anything_is_built(key, no_building):
    settings = {key: 1_000_000_000, **({"group_size": 1_000_000_000} if key == "rollout_batch_size" else {})}
    with pytest.raises(ConfigError, match=rf"^--model\.{key} 1000000000: 1000000000 \w+ per step need at least "
                                          r"[\d.]+ GiB of host memory .* more than the [\d.]+ GiB here; lower them$"):
        module(**settings)


def test_the_batch_floor_is_a_lower_bound_and_the_shipped_sizes_pass():
    from agentcap.core.bounds import batch_floor, check_batch, host_memory_bytes

    assert batch_floor(64, 24) == 64 * (4096 + 24 * 32)
    assert 0 < host_memory_bytes()
    check_batch({"--model.rollout_batch_size": 64}, 64, 24, limit=2 * 1024**3)  # the READ demo's batch
    with pytest.raises(ConfigError, match="lower them"):
        check_batch({"--model.rollout_batch_size": 1024}, 1024, 64, limit=1024**2)
