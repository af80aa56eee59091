"""A custom task without traps: text-only prompts on the default toy agent, env ids that are checked,
`agentcap envs PATTERN`, and `evaluate --run` on a task without references."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.agents.toy import ToyConfig, ToyMediaLM
from agentcap.commands.envs import envs_command
from agentcap.core.registry import UnknownEnvError, check_env_id

ROOT = Path(__file__).resolve().parents[1]


# --- text-only observations on the default toy agent ------------------------------------------------
def test_default_toy_agent_reads_text_only_rows():
    """``media: features`` is the default; a row without features is laid out as its prompt alone."""
    model = ToyMediaLM(ToyConfig(vocab_size=20, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32))
    ids, mask = torch.tensor([[3, 4, 5], [0, 6, 7]]), torch.tensor([[1, 1, 1], [0, 1, 1]])
    features = {"features": torch.randn(2, model.config.feature_dim)}
    logits = model(ids, mask, [{}, features])  # one text-only row next to one with media
    assert logits.shape == (2, 3, 20)
    alone = model(ids[:1], mask[:1], [{}])
    assert torch.allclose(logits[0], alone[0], atol=1e-5)  # its neighbour's prefix changes nothing
    plain = model.lm(input_ids=ids[:1], attention_mask=mask[:1]).logits  # no prefix at all
    assert torch.allclose(alone, plain, atol=1e-5)
    out = model.generate(ids[:1], mask[:1], [{}], max_new_tokens=2, do_sample=False)
    assert out.shape[0] == 1


# --- env ids --------------------------------------------------------------------------------------
def test_unknown_id_names_the_closest_ids_and_the_module_prefix():
    with pytest.raises(UnknownEnvError) as error:
        check_env_id("agentcap/ClozeCaptoin-v0")
    message = str(error.value)
    assert message.startswith("--model.env.id: unknown environment id 'agentcap/ClozeCaptoin-v0'.")
    assert "Closest registered ids: 'agentcap/ClozeCaption-v0'" in message
    assert "'my_pkg.envs:MyTask-v0'" in message
    with pytest.raises(UnknownEnvError, match=r"Closest registered ids: 'agentcap/TextRewards-v0'"):
        check_env_id("agentcap/textrewards-v1", "--env")  # case and version


def test_module_prefix_that_cannot_be_imported_is_named():
    with pytest.raises(UnknownEnvError, match=r"--model.env.id: 'no_such_pkg.envs:Task-v0': module "
                                              r"'no_such_pkg.envs' cannot be imported"):
        check_env_id("no_such_pkg.envs:Task-v0")
    check_env_id("agentcap_envs:agentcap/TextRewards-v0")  # a module that registers it: fine


def test_a_wrong_id_stops_fit_with_one_line(tmp_path, capsys):
    from agentcap.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"trainer": {"accelerator": "cpu", "logger": False}, "model": {
        "run_dir": str(tmp_path / "run"), "env": {"id": "agentcap/ClozeCaptoin-v0"},
        "agents": {"policy": {"toy": {}}}, "stages": [{"name": "g", "kind": "grpo", "agent": "policy", "steps": 1}]}}))
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(config)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert "unknown environment id 'agentcap/ClozeCaptoin-v0'. Closest registered ids: 'agentcap/ClozeCaption-v0'" in err


# --- agentcap envs ----------------------------------------------------------------------------------
def listed(capsys, *patterns: str) -> list[str]:
    assert envs_command(list(patterns)) == 0
    return [line.split()[0] for line in capsys.readouterr().out.splitlines()]


def test_envs_lists_only_matching_ids_and_imports_nothing_else(capsys, monkeypatch):
    import agentcap.commands.envs as envs

    loaded = []
    real = envs.load_env_creator
    monkeypatch.setattr(envs, "load_env_creator", lambda entry: loaded.append(entry) or real(entry))
    everything = listed(capsys)
    assert {"agentcap/ClozeCaption-v0", "agentcap/TextRewards-v0"} <= set(everything)
    assert "CartPole-v1" not in everything and all("mujoco" not in e for e in loaded)
    loaded.clear()
    assert listed(capsys, "cloze") == ["agentcap/ClozeCaption-v0"]  # substring, case-insensitive
    assert loaded == []  # the docstring line is read from the module's source: no environment is imported
    assert listed(capsys, "agentcap/*Game-v?") == ["agentcap/EvidenceGame-v0"]  # fnmatch
    assert "agentcap/TextRewards-v0" in listed(capsys, "agentcap_envs")  # a package: the ids it implements
    assert envs_command(["no-such-task"]) == 1
    assert "no registered id matches" in capsys.readouterr().err


# --- a custom task end to end -----------------------------------------------------------------------
USER_PACKAGE = '''
from gymnasium.envs.registration import register

register(id="quiz/Echo-v0", entry_point="quiz.echo:EchoEnv")
'''

USER_ENV = '''
"""A custom task that sets no reference_field and whose rows have no caption."""
from agentcap import CaptionEnv, Score


class EchoEnv(CaptionEnv):
    """Repeat the colour."""

    required_fields = {"id": str, "prompt": str}

    def begin(self, episode):
        return self.prompt(episode.item)

    def prompt(self, item):
        return self.observation("policy", [{"role": "user", "content": item["prompt"]}])

    def advance(self, episode, action):
        self.record(episode, "policy", "answer", action)
        return None

    def demonstrations(self, item):
        return [(self.prompt(item), item["answer"])]

    def score(self, episodes):
        rewards = [float(e.actions[-1].text.strip() == e.item["answer"]) for e in episodes]
        return [Score(r, {"said": r}, [r]) for r in rewards]
'''

USER_REWARDS = '''
def exact_answer(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def brevity(prompts, completions, **kwargs):
    return [1.0 / (1 + len(c.split())) for c in completions]
'''


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentcap.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two `agentcap fit` and two `agentcap evaluate` subprocesses
def test_custom_text_task_with_reward_functions_trains_and_evaluates(tmp_path):
    package = tmp_path / "pkg" / "quiz"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(USER_PACKAGE)
    (package / "echo.py").write_text(USER_ENV)
    (package / "rewards.py").write_text(USER_REWARDS)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"say {c}", "answer": c}) + "\n"
                                for i, c in enumerate(["red", "blue", "red", "blue"])))
    texts = tmp_path / "texts.txt"
    texts.write_text("say red blue\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg"), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    common = [
        "--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        f"--model.env.train={{manifest: {manifest}}}", f"--model.env.val={{manifest: {manifest}}}",
        f"--model.env.test={{manifest: {manifest}}}",
        # the default agent: a toy model whose media default to `features`; the prompts are text only
        "--model.agents={policy: {toy: {hidden_size: 16, num_layers: 1, num_heads: 2, intermediate_size: 32}, "
        f"build_tokenizer_from: [{texts}], max_new_tokens: 2, lr: 0.0001}}}}",
        "--model.stages=[{name: sft, kind: sft, agent: policy, steps: 40, lr: 0.01}, {name: before, kind: evaluate, split: val}, "
        "{name: grpo, kind: grpo, agent: policy, "
        "steps: 2}, {name: after, kind: evaluate, split: val}]",
        "--model.group_size=2", "--model.rollout_batch_size=4", "--model.sft_batch_size=4",
    ]
    run = tmp_path / "rewards_run"
    result = cli("fit", *common, f"--model.run_dir={run}", "--model.env.id=agentcap/TextRewards-v0",
                 "--model.env.kwargs={reward_funcs: [quiz.rewards:exact_answer, quiz.rewards:brevity], "
                 "reward_weights: [1.0, 0.1]}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    after = summary["after"]
    assert after["exact_answer"] == 1.0 and after["brevity"] == 0.5  # learnt: one word, the answer
    evaluated = cli("evaluate", "--run", str(run), "--no-meteor", env=env)  # reference_field: answer
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]

    # a custom env that sets no reference_field: evaluate --run says what to set, before captioning
    run = tmp_path / "echo_run"
    result = cli("fit", *common, f"--model.run_dir={run}", "--model.env.id=quiz:quiz/Echo-v0", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = cli("evaluate", "--run", str(run), "--no-meteor", env=env)
    assert evaluated.returncode != 0 and "Traceback" not in evaluated.stderr
    assert f"{manifest}:1: no field 'caption'" in evaluated.stderr
    assert "Set `reference_field` on the environment" in evaluated.stderr
