"""tools/weight_drift.py: how far a run's adapter and fully trained modules moved the warm start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import weight_drift  # noqa: E402

LM = "model.language_model.layers.0.self_attn.q_proj"


def make_run(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    base = {"language_model.model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4),
            "multi_modal_projector.linear.weight": torch.randn(4, 3)}
    (tmp_path / "warm").mkdir()
    save_file(base, str(tmp_path / "warm" / "model.safetensors"))
    state = {f"agents.policy.model.{LM}.lora_A.policy.weight": torch.randn(2, 4),
             f"agents.policy.model.{LM}.lora_B.policy.weight": torch.randn(4, 2),
             "agents.policy.model.model.multi_modal_projector.modules_to_save.policy.linear.weight":
                 base["multi_modal_projector.linear.weight"] + 0.1,
             # another role's adapter on the same base is not this role's drift
             f"agents.policy.model.{LM}.lora_A.other.weight": torch.randn(2, 4),
             "agents.policy.adapter_base_fingerprint": torch.tensor(7)}
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": state}, run / "checkpoints" / "last.ckpt")
    config = {"model": {"agents": {"policy": {"model": str(tmp_path / "warm"), "peft": {"r": 2, "alpha": 4}}}}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run, {**base, **state}


def test_lora_and_full_copies_are_measured_against_the_warm_start(tmp_path):
    run, t = make_run(tmp_path)
    out = weight_drift.drift(str(run))
    w0 = t["language_model.model.layers.0.self_attn.q_proj.weight"]
    lora = 2.0 * t[f"agents.policy.model.{LM}.lora_B.policy.weight"] @ t[f"agents.policy.model.{LM}.lora_A.policy.weight"]
    assert out[("language_model", "lora")] == (pytest.approx(float(lora.norm() / w0.norm()), rel=1e-5), 1)
    p0 = t["multi_modal_projector.linear.weight"]
    assert out[("multi_modal_projector", "full")] == (pytest.approx(float(0.1 * 12 ** 0.5 / p0.norm()), rel=1e-5), 1)
    assert set(out) == {("language_model", "lora"), ("multi_modal_projector", "full")}
    assert "| run | multi_modal_projector | full | 1 |" in weight_drift.main([str(run)])


def test_a_tensor_the_warm_start_lacks_is_named(tmp_path):
    run, _ = make_run(tmp_path)
    (tmp_path / "warm" / "model.safetensors").unlink()
    save_file({"multi_modal_projector.linear.weight": torch.zeros(4, 3)}, str(tmp_path / "warm" / "model.safetensors"))
    with pytest.raises(KeyError, match="language_model.layers.0.self_attn.q_proj.weight"):
        weight_drift.drift(str(run))


def test_a_shape_that_does_not_fit_is_named(tmp_path):
    run, _ = make_run(tmp_path)
    (tmp_path / "warm" / "model.safetensors").unlink()
    save_file({"language_model.model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4),
               "multi_modal_projector.linear.weight": torch.zeros(3, 4)}, str(tmp_path / "warm" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"multi_modal_projector.linear.weight has shape \(4, 3\)"):
        weight_drift.drift(str(run))
