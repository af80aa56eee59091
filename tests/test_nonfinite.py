"""A NaN or Inf loss, gradient or weight stops the run with an error naming the stage, the tick and the
tensor, before the tick's checkpoint is written: the newest checkpoint on disk stays finite."""

from __future__ import annotations

import math

import pytest
import torch

from agentcap.agents import AgentConfig, build_agent
from agentcap.cli import main
from agentcap.training import update as update_py
from agentcap.training.finite import NonFiniteError
from agentcap.training.optim import build_optimizer, optimizer_step


@pytest.fixture
def agent():
    agent = build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, max_new_tokens=4))
    agent.set_trainable(True)
    return agent


def named(agent, index: int = 3) -> tuple[str, torch.nn.Parameter]:
    return list(agent.model.named_parameters())[index]


def fill_gradients(agent, value: float = 1e-3) -> None:
    for p in agent.trainable_parameters():
        p.grad = torch.full_like(p, value)


def snapshot(agent) -> list[torch.Tensor]:
    return [p.detach().clone() for p in agent.trainable_parameters()]


def test_a_nan_gradient_stops_before_the_step_naming_the_parameter(agent):
    optimizer = build_optimizer(agent, lr=1e-2)
    fill_gradients(agent)
    name, param = named(agent)
    param.grad[0] = math.nan
    before = snapshot(agent)
    with pytest.raises(NonFiniteError, match=rf"stage 'x', tick 7: the gradient of model\.{name} is not finite") as err:
        optimizer_step(agent, optimizer, 1.0, "stage 'x', tick 7", loss=0.5)
    assert "the loss was finite" in str(err.value)
    assert all(torch.equal(a, p) for a, p in zip(before, agent.trainable_parameters()))  # no step taken


def test_a_nan_loss_is_named_as_the_cause(agent):
    optimizer = build_optimizer(agent, lr=1e-2)
    fill_gradients(agent, math.nan)
    with pytest.raises(NonFiniteError, match=r"tick 2: the loss is nan"):
        optimizer_step(agent, optimizer, 1.0, "stage 'grpo', tick 2", loss=math.nan)


def test_an_overflowing_step_is_named_by_weight(agent):
    """Finite gradients, an update too large for float32: the weight check after the step."""
    optimizer = torch.optim.SGD(agent.trainable_parameters(), lr=1e38)
    fill_gradients(agent, 100.0)
    with pytest.raises(NonFiniteError, match=r"tick 0: the weight model\.\S+ is not finite after the optimiser step"):
        optimizer_step(agent, optimizer, 1e30, "stage 's', tick 0")


def test_finite_steps_pass_and_return_the_norm(agent):
    optimizer = build_optimizer(agent, lr=1e-3)
    fill_gradients(agent)
    n = sum(p.numel() for p in agent.trainable_parameters())
    assert optimizer_step(agent, optimizer, 1.0) == pytest.approx(1e-3 * math.sqrt(n), rel=1e-4)


# --- through `agentcap fit` -------------------------------------------------------------------
def checkpoint_tensors(path) -> list[torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return [v for v in state.values() if torch.is_tensor(v) and v.is_floating_point()]


def fit_until_it_stops(tmp_path, toy_movie, make_read_config, capsys, stages) -> str:
    config = make_read_config(tmp_path / "run", toy_movie, stages)  # checkpoint_every: 2
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    folder = tmp_path / "run" / "checkpoints"
    # ticks 0, 1 ran (checkpoint at tick 2, checkpoint_every 2), then tick 2 or 3 failed: nothing newer on disk
    assert sorted(p.name for p in folder.glob("tick-*.ckpt")) == ["tick-000002.ckpt"]
    assert (folder / "last.ckpt").samefile(folder / "tick-000002.ckpt")
    assert all(bool(torch.isfinite(t).all()) for t in checkpoint_tensors(folder / "last.ckpt"))
    return err.strip().splitlines()[-1]


@pytest.mark.slow  # a tiny fit (~15 s CPU)
def test_an_exploding_lr_stops_the_fit_before_the_checkpoint(tmp_path, toy_movie, make_read_config, capsys):
    """lr 1e30: the first step of `hot` makes the weights ~1e30 (finite, but their norm overflows;
    without the check the next step's loss is NaN and NaN weights are saved at tick 4)."""
    stages = [{"name": "warm", "kind": "sft", "agent": "policy", "steps": 2},
              {"name": "hot", "kind": "sft", "agent": "policy", "steps": 3, "lr": 1e30}]
    line = fit_until_it_stops(tmp_path, toy_movie, make_read_config, capsys, stages)
    assert line.startswith("agentcap: stage 'hot' (sft of 'policy'), tick 2: the weights' norm is inf"), line


@pytest.mark.slow  # a tiny fit (~15 s CPU)
def test_a_nan_grpo_loss_stops_the_fit_before_the_checkpoint(tmp_path, toy_movie, make_read_config, capsys,
                                                              monkeypatch):
    """The clipped objective turns NaN from the second GRPO step on (as a NaN reward would make it)."""
    real, calls = update_py.clipped_objective, []

    def second_step_nan(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        return {**out, "loss": out["loss"] * math.nan} if len(calls) > 1 else out

    monkeypatch.setattr(update_py, "clipped_objective", second_step_nan)
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
              {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 3}]
    line = fit_until_it_stops(tmp_path, toy_movie, make_read_config, capsys, stages)
    assert line.startswith("agentcap: stage 'grpo' (grpo of 'policy'), tick 3: the loss is nan"), line
