"""SFT stages on the environment's demonstrations: a step whose items demonstrate no turn of the role
(ACE-Cap's ``demo_questions`` may draw no question for any item) makes no update and says so."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import yaml

from agentcap.training.loading import load_module


@pytest.mark.slow  # a Trainer fit
def test_a_step_without_demonstrations_for_the_role_warns_and_makes_no_update(tmp_path, toy_soundscapes, make_game_config):
    config = make_game_config(tmp_path / "run", toy_soundscapes,
                              [{"name": "sft_instruct", "kind": "sft", "agent": "instruct", "steps": 2},
                               {"name": "sft_captioner", "kind": "sft", "agent": "captioner", "steps": 1}],
                              trainer={"logger": False})
    spec = yaml.safe_load(config.read_text())
    spec["model"]["env"]["kwargs"]["demo_questions"] = 0  # the games ask nothing: Instruct never answers
    config.write_text(yaml.safe_dump(spec))
    torch.manual_seed(0)
    module = load_module(str(config), None)
    instruct = {k: v.detach().clone() for k, v in module.agents["instruct"].model.named_parameters()}
    captioner = {k: v.detach().clone() for k, v in module.agents["captioner"].model.named_parameters()}
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    with pytest.warns(UserWarning, match=r"SFT stage 'sft_instruct' step [01]: its items demonstrate no 'instruct' turn"):
        trainer.fit(module)
    assert module.tick == 3  # the fit went on to the next stage
    assert all(torch.equal(v, instruct[k]) for k, v in module.agents["instruct"].model.named_parameters())
    assert any(not torch.equal(v, captioner[k]) for k, v in module.agents["captioner"].model.named_parameters())
