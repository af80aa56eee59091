"""`agentcap plan` with served engines (``backend: served``): placed on the rollout GPUs, never on the
trainer GPUs; refused without rollout GPUs, or too few."""

from __future__ import annotations

import copy

import pytest
import yaml

from test_plan import recipe, refused

from agentcap.commands.plan import model_size, plan, plan_command
from agentcap.commands.plan_served import as_served, gpu_ranges
from agentcap.core.settings import ConfigError

URLS = ["http://rollouts:8000/v1", "http://rollouts:8001/v1"]


def served_recipe(tmp_path, **served):
    config = recipe(tmp_path, devices=2, peft={"r": 8})
    config["model"]["stages"] = [{"name": "grpo", "kind": "grpo", "agent": "policy"}]
    config["model"]["max_staleness"] = 1
    agents = config["model"]["agents"]
    agents["policy"].update(backend="served", vllm={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9,
                                                    "dtype": "bfloat16", "served": served or {"urls": URLS}})
    # a second role on the same base and servers: an adapter of its own, no servers of its own
    agents["critic"] = {"model": agents["policy"]["model"], "share_base_with": "policy", "peft": {"r": 8},
                        "backend": "served", "vllm": agents["policy"]["vllm"]}
    return config


def test_served_engines_go_to_the_rollout_gpus(tmp_path, capsys):
    config = served_recipe(tmp_path)
    hf = recipe(tmp_path, devices=2, peft={"r": 8})
    hf["model"]["stages"] = config["model"]["stages"]
    row = plan(config, str(tmp_path), prompt_tokens=32, rollout_gpus=8)[0]
    # `other` (hf) still generates on the trainer GPUs: its KV cache counts (4 rows of 32 + 64 tokens,
    # fp32); without it nothing is sampled there
    other = model_size(str(tmp_path / "other"), "o")
    assert row["engines"] == 0 and row["kv cache"] == 2 * other.layers * other.kv_width * 4 * (32 + 64) * 4
    del config["model"]["agents"]["other"], hf["model"]["agents"]["other"]
    alone = plan(config, str(tmp_path), prompt_tokens=32, rollout_gpus=8)[0]
    on_trainers = plan(hf, str(tmp_path), prompt_tokens=32)[0]
    assert alone["kv cache"] == 0 < on_trainers["kv cache"], "nothing served is sampled on a trainer GPU"
    assert row["rollouts ahead"] == 0  # an adapter's snapshots wait on the host
    (engine,) = row["served"]
    assert engine.roles == ("policy", "critic") and engine.servers == 2 and engine.gpus == (0, 1, 2, 3)
    assert gpu_ranges(engine) == "0–1, 2–3"
    assert engine.weights == model_size(str(tmp_path / "policy"), "p").params * 2 / 2  # bf16, split over 2 GPUs
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert plan_command(["--config", str(path), "--root", str(tmp_path), "--prompt-tokens", "32", "--rollout-gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "Served engines on the rollout GPUs (4 of 8 used, 141 GiB each; nothing of theirs on the trainer GPUs)" in out
    assert "| policy + critic | 2 | 2 | 0–1, 2–3 | bfloat16 |" in out


def test_started_servers_count_per_rank(tmp_path):
    config = served_recipe(tmp_path, start=1)
    (engine,) = plan(config, str(tmp_path), prompt_tokens=32, rollout_gpus=4)[0]["served"]
    assert engine.servers == 2 and gpu_ranges(engine) == "0–1, 2–3"  # one server per rank, 2 ranks


def test_no_or_too_few_rollout_gpus_are_refused(tmp_path, capsys):
    config = served_recipe(tmp_path)
    with pytest.raises(ConfigError, match=r"need rollout GPUs of their own \(agents.policy: 2 server\(s\) × 2 GPU"):
        plan(config, str(tmp_path), prompt_tokens=32)
    with pytest.raises(ConfigError, match="need 4 rollout GPUs .*--rollout-gpus gives 3"):
        plan(config, str(tmp_path), prompt_tokens=32, rollout_gpus=3)
    assert "none are given: --rollout-gpus 4" in refused(tmp_path, capsys, config)
    config["model"]["agents"]["policy"]["vllm"]["gpu_memory_utilization"] = 1e-6
    assert "no room for a KV cache" in refused(tmp_path, capsys, config, "--rollout-gpus", "8")


def test_serve_rollouts_moves_in_process_engines_to_the_rollout_gpus(tmp_path, capsys):
    """--serve-rollouts: a recipe written for backend: vllm, planned with its engines as servers of their
    own, one per trainer rank; the trainer GPUs lose the engines."""
    config = recipe(tmp_path, devices=2, peft={"r": 8})
    config["model"]["stages"] = [{"name": "grpo", "kind": "grpo", "agent": "policy"}]
    config["model"]["agents"]["policy"].update(backend="vllm", vllm={"dtype": "bfloat16"})
    in_process = plan(config, str(tmp_path), prompt_tokens=32)[0]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["--config", str(path), "--root", str(tmp_path), "--prompt-tokens", "32", "--serve-rollouts"]
    assert plan_command(argv) == 2
    assert "none are given: --rollout-gpus 2" in capsys.readouterr().err
    assert plan_command([*argv, "--rollout-gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "| policy | 2 | 1 | 0, 1 | bfloat16 |" in out  # one server per rank
    served = copy.deepcopy(config)
    assert as_served(served) == ["policy"] and served["model"]["agents"]["policy"]["vllm"]["served"] == {"start": 1}
    assert plan(served, str(tmp_path), prompt_tokens=32, rollout_gpus=2)[0]["engines"] == 0 < in_process["engines"]
    del config["model"]["agents"]["policy"]["backend"]
    path.write_text(yaml.safe_dump(config))
    assert plan_command(argv) == 2
    assert "--serve-rollouts: no agent has backend: vllm" in capsys.readouterr().err
