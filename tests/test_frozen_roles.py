"""Frozen roles in a GRPO stage: greedy by default, sampling where the stage says ``sample_frozen``.

A Composer that asks one question form hears one answer from a greedy Instruct, so its question
spans have no spread; ``sample_frozen: [instruct]`` lets the frozen Instruct sample at its temperature.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
import yaml

from agentcap.core.settings import ConfigError
from agentcap.training.loading import load_module


def composer_stage(tmp_path, world, make_game_config, **stage):
    """A module whose one stage is the Composer's GRPO; the Composer samples almost greedily
    (temperature 1e-4), so every game of a group asks the same question of the same c0."""
    stages = [{"name": "composer_grpo", "kind": "grpo", "agent": "composer", "steps": 1, **stage}]
    config = make_game_config(tmp_path / "run", world, stages, trainer={"logger": False})
    document = yaml.safe_load(config.read_text())
    document["model"]["agents"]["composer"]["temperature"] = 1e-4
    document["model"]["agents"]["instruct"]["temperature"] = 1.0
    document["model"]["group_size"] = 4
    document["model"]["rollout_batch_size"] = 8
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    torch.manual_seed(0)
    return load_module(str(config), None)


def answers_by_state(module) -> list[set[str]]:
    """The Instruct answers given to each (group, observation) state that a group met more than once."""
    stage = module.schedule.stages[0]
    module._begin_stage(0)
    batch = module._rollout(stage, 0, 0)(None)
    seen: dict[tuple, list[str]] = defaultdict(list)
    for span in (s for s in batch.spans if s.agent == "instruct"):
        seen[(span.group, repr(sorted((k, str(v)) for k, v in span.observation.items() if k != "audio")))].append(span.text)
    repeated = [set(texts) for texts in seen.values() if len(texts) > 1]
    assert repeated, "the near-greedy Composer should ask the same question in several games of a group"
    return repeated


def test_a_frozen_instruct_answers_a_repeated_state_one_way_by_default(tmp_path, toy_soundscapes, make_game_config):
    module = composer_stage(tmp_path, toy_soundscapes, make_game_config)
    assert all(len(texts) == 1 for texts in answers_by_state(module))


def test_sample_frozen_lets_the_instruct_answer_a_repeated_state_differently(tmp_path, toy_soundscapes,
                                                                             make_game_config):
    module = composer_stage(tmp_path, toy_soundscapes, make_game_config, sample_frozen=["instruct"])
    assert any(len(texts) > 1 for texts in answers_by_state(module))


@pytest.mark.parametrize("stage, message", [
    ({"name": "g", "kind": "grpo", "agent": "composer", "sample_frozen": ["instructor"]}, "not configured agents"),
    ({"name": "e", "kind": "evaluate", "sample_frozen": ["instruct"]}, "greedy: false"),
])
def test_sample_frozen_is_refused_for_an_unknown_role_or_a_stage_without_rollouts(tmp_path, toy_soundscapes,
                                                                                   make_game_config, stage, message):
    config = make_game_config(tmp_path / "run", toy_soundscapes, [stage], trainer={"logger": False})
    with pytest.raises(ConfigError, match=message):
        load_module(str(config), None)
