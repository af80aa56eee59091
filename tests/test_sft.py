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
    with pytest.warns(UserWarning, match=r"SFT stage 'sft_instruct' step [01]: its items demonstrate no 'instruct' turn") as seen:
        trainer.fit(module)
    # the stage's first step made no update; its lr schedule still steps once per stage step, without torch's complaint
    assert not [w for w in seen if "lr_scheduler.step()" in str(w.message)]
    assert module.tick == 3  # the fit went on to the next stage
    assert all(torch.equal(v, instruct[k]) for k, v in module.agents["instruct"].model.named_parameters())
    assert any(not torch.equal(v, captioner[k]) for k, v in module.agents["captioner"].model.named_parameters())


@pytest.mark.slow  # a Trainer fit
def test_an_sft_stage_demonstrates_on_captions_the_captioner_wrote(tmp_path, toy_soundscapes, make_game_config):
    """ACE-Cap's Composer warm-up on the Captioner's own c0 (``demo_c0: own``): the stage's harvest
    rolls the Captioner out on training items; the demonstrations read those captions."""
    stage = {"name": "sft_composer", "kind": "sft", "agent": "composer", "steps": 2, "harvest": {"mode": "captioner"},
             "harvest_items": 3, "env": {"demo_c0": "own", "demo_questions": "needed"}}
    config = make_game_config(tmp_path / "run", toy_soundscapes, [stage], trainer={"logger": False})
    torch.manual_seed(0)
    module = load_module(str(config), None)
    composer = {k: v.detach().clone() for k, v in module.agents["composer"].model.named_parameters()}
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module)
    items = module.replay.items["sft_composer"]
    assert len(items) == 3 and all(isinstance(item["c0"], str) for item in items)
    env = module.splits.driver("train", module.schedule.stages[0]).scorer.unwrapped
    composer_turn = next(o for o, _ in env.demonstrations(env.items[0]) if o["agent"] == "composer")
    assert items[0]["c0"] in composer_turn["messages"][0]["content"]
    assert any(not torch.equal(v, composer[k]) for k, v in module.agents["composer"].model.named_parameters())
