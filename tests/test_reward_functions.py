"""Plain reward functions (``agentcap/TextRewards-v0``): called TRL-style, weighted, logged per function,
and a bad import string refused by name before anything trains."""

from __future__ import annotations

import csv
import json
import math
import re

import gymnasium as gym
import pytest
import yaml

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.core.settings import ConfigError

ITEMS = [{"id": "q0", "prompt": "two plus two ?", "answer": "four", "level": 1},
         {"id": "q1", "prompt": "the sky is ?", "answer": "blue", "level": 2},
         {"id": "q2", "prompt": "say hello", "level": 3}]

USER_REWARDS = '''
def exact_answer(prompts, completions, answer, **kwargs):
    """1 for the answer; None where the row has none."""
    return [None if a is None else float(c.strip() == a) for c, a in zip(completions, answer)]


def short(prompts, completions, level):
    """Only the columns it names are passed."""
    return [1.0 / (1 + len(c.split())) + 0 * lv for c, lv in zip(completions, level)]


def brevity(prompts, completions, **kwargs):
    return [1.0 / (1 + len(c.split())) for c in completions]


def seen(prompts, completions, **columns):
    return [float(len(columns)) for _ in completions]


def wrong_length(prompts, completions, **kwargs):
    return [1.0]


def not_finite(prompts, completions, **kwargs):
    return [math.nan for _ in completions]
'''


@pytest.fixture
def rewards_module(tmp_path, monkeypatch, request):
    """A user module of reward functions, importable under a name unique to the test."""
    name = "user_rewards_" + re.sub(r"\W", "_", request.node.name)
    (tmp_path / f"{name}.py").write_text("import math\n" + USER_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def play(env, answers: list[str]):
    """One finished episode per item, answered with ``answers``, scored as a batch."""
    env = env.unwrapped
    episodes = []
    for index, answer in enumerate(answers):
        env.reset(options={"index": index})
        env.step(answer)
        episodes.append(env.episode)
    return env.score(episodes)


def test_functions_are_weighted_and_each_is_a_component(rewards_module):
    env = gym.make("agentcap/TextRewards-v0", items=ITEMS, defer_scoring=True,
                   reward_funcs=[f"{rewards_module}:exact_answer", f"{rewards_module}:short", f"{rewards_module}:seen"],
                   reward_weights=[1.0, 0.5, 0.0])
    obs, _ = env.reset(options={"index": 0})
    assert obs["media"] == {} and obs["messages"] == [{"role": "user", "content": "two plus two ?"}]
    scores = play(env, ["four", "red sky", "hello"])
    assert scores[0].components == {"exact_answer": 1.0, "short": 0.5, "seen": 3.0}  # id, answer, level
    assert scores[0].reward == pytest.approx(1.0 + 0.25) and scores[0].utilities == [scores[0].reward]
    assert scores[1].components["exact_answer"] == 0.0 and scores[1].reward == pytest.approx(0.5 / 3)
    assert "exact_answer" not in scores[2].components  # None: does not apply, adds nothing
    assert scores[2].reward == pytest.approx(0.25)
    assert env.unwrapped.score([]) == []


def test_plain_gymnasium_step_returns_the_reward(rewards_module):
    env = gym.make("agentcap/TextRewards-v0", items=ITEMS, reward_funcs=[f"{rewards_module}:exact_answer"])
    env.reset(options={"index": 1})
    _, reward, terminated, _, info = env.step("blue")
    assert terminated and reward == 1.0 and info["rewards"] == {"exact_answer": 1.0}


@pytest.mark.parametrize("spec, message", [
    ("{m}:exact_answr", r"reward_funcs\[1\] \('{m}:exact_answr'\): '{m}' has no attribute 'exact_answr'; "
                        r"did you mean 'exact_answer'"),
    ("no_such_pkg.rewards:exact", r"reward_funcs\[1\] \('no_such_pkg.rewards:exact'\): no module 'no_such_pkg.rewards'"),
    ("{m}.exact_answer", r"reward_funcs\[1\] .*: not an import string 'module:function'"),
    ("{m}:math", r"reward_funcs\[1\] .*: not callable"),
])
def test_a_bad_import_string_is_refused_by_name(rewards_module, spec, message):
    spec, message = spec.format(m=rewards_module), message.format(m=rewards_module)
    with pytest.raises(ConfigError, match=message):
        gym.make("agentcap/TextRewards-v0", items=ITEMS, reward_funcs=[f"{rewards_module}:short", spec])


def test_weights_and_names_are_checked(rewards_module):
    funcs = [f"{rewards_module}:short", f"{rewards_module}:seen"]
    with pytest.raises(ConfigError, match="2 weights for 1 reward_funcs"):
        gym.make("agentcap/TextRewards-v0", items=ITEMS, reward_funcs=funcs[:1], reward_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match=r"reward_weights\[1\] must be a finite number"):
        gym.make("agentcap/TextRewards-v0", items=ITEMS, reward_funcs=funcs, reward_weights=[1.0, math.inf])
    with pytest.raises(ConfigError, match=r"two functions are named \['short'\]"):
        gym.make("agentcap/TextRewards-v0", items=ITEMS, reward_funcs=[funcs[0], funcs[0]])


@pytest.mark.parametrize("name, message", [
    ("short", r"short'\): takes the column\(s\) \['level'\], which no row of the batch has"),
    ("wrong_length", r"wrong_length'\): returned 1 values for 3 completions"),
    ("not_finite", r"not_finite'\): returned nan for the row at q0; expected a finite number or None"),
])
def test_a_bad_return_value_names_the_function(rewards_module, name, message):
    items = [{k: v for k, v in item.items() if k != "level"} for item in ITEMS]
    env = gym.make("agentcap/TextRewards-v0", items=items, defer_scoring=True, reward_funcs=[f"{rewards_module}:{name}"])
    with pytest.raises(ValueError, match=message):
        play(env, ["a", "b", "c"])


# --- a tiny fit -----------------------------------------------------------------------------------
def text_task_config(tmp_path, rewards: list[str], weights: list[float], stages: list[dict]):
    """A run of the default (toy, ``media: features``) agent on a text-only task scored by ``rewards``."""
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"colour of thing {i} ?",
                                            "answer": ["red", "blue"][i % 2]}) + "\n" for i in range(4)))
    texts = tmp_path / "texts.txt"
    texts.write_text("red blue green colour of thing\n")
    run_dir = tmp_path / "run"
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "enable_model_summary": False,
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(run_dir)}}},
        "model": {
            "run_dir": str(run_dir),
            "env": {"id": "agentcap/TextRewards-v0", "kwargs": {"reward_funcs": rewards, "reward_weights": weights},
                    "train": {"manifest": str(manifest)}, "val": {"manifest": str(manifest)}},
            "agents": {"policy": {"toy": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
                                  "build_tokenizer_from": [str(texts)], "max_new_tokens": 3, "lr": 3e-3}},
            "group_size": 2, "rollout_batch_size": 4, "minibatch_size": 4, "sft_batch_size": 4,
            "stages": stages,
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, run_dir


@pytest.mark.slow  # a Trainer fit (~9 s on 2 cores)
def test_reward_function_means_are_logged_as_components(tmp_path, rewards_module):
    from agentcap.cli import AgentcapCLI
    from agentcap.training.module import GRPOModule

    config, run_dir = text_task_config(
        tmp_path, [f"{rewards_module}:exact_answer", f"{rewards_module}:brevity"], [1.0, 0.5],
        [{"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2}])
    AgentcapCLI(GRPOModule, datamodule_class=None, save_config_kwargs={"overwrite": True},
                args=["fit", "--config", str(config)])
    rows = list(csv.DictReader(next(run_dir.rglob("metrics.csv")).open()))
    steps = [r for r in rows if r.get("reward/policy/total")]
    assert len(steps) == 2
    for row in steps:
        exact, short, total = (float(row[f"reward/policy/{k}"]) for k in ("exact_answer", "brevity", "total"))
        assert 0.0 <= exact <= 1.0 and 0.0 < short <= 1.0
        assert total == pytest.approx(exact + 0.5 * short)  # every function applies to every row


def test_a_bad_import_string_stops_fit_before_training(tmp_path, rewards_module, capsys):
    from agentcap.cli import main

    config, run_dir = text_task_config(tmp_path, [f"{rewards_module}:exact_answr"], [1.0],
                                       [{"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2}])
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(config)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"'{rewards_module}' has no attribute 'exact_answr'; did you mean 'exact_answer'?" in err
    assert "Traceback" not in err and not list(run_dir.rglob("metrics.csv"))
