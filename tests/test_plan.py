"""`agentcap plan`: memory per rank and stage from config.json files only (tiny stand-ins here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import yaml

from agentcap.commands.plan import GIB, lora_params, model_size, plan, plan_command

ROOT = Path(__file__).resolve().parents[1]
QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}
QWEN3 = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 500,
         "tie_word_embeddings": True}
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 300, "n_positions": 64}


def folder(root: Path, name: str, config: dict) -> str:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.json").write_text(json.dumps(config))
    return name


@pytest.mark.parametrize("config", [QWEN2, QWEN3, GPT2], ids=["qwen2", "qwen3", "gpt2"])
def test_parameter_counts_equal_the_real_architectures(tmp_path, config):
    spec = dict(config)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(spec.pop("model_type"), **spec))
    real = sum(p.numel() for p in model.parameters())  # tied embeddings are counted once
    assert model_size(str(tmp_path / folder(tmp_path, "m", config)), "m").params == real


def recipe(tmp_path: Path, strategy: str = "ddp", devices: int = 4, dtype: str = "float32", peft=None,
           precision: str = "32") -> dict:
    policy = {"model": folder(tmp_path, "policy", QWEN2), "dtype": dtype, "max_new_tokens": 16}
    if peft:
        policy["peft"] = peft
    return {
        "trainer": {"devices": devices, "strategy": strategy, "precision": precision},
        "model": {
            "env": {"id": "x", "kwargs": {"examiner": folder(tmp_path, "judge", QWEN3), "scorer": "rule"}},
            "agents": {"policy": policy, "other": {"model": folder(tmp_path, "other", GPT2), "dtype": dtype}},
            "minibatch_size": 8, "generation_batch_size": 4,
            "stages": [{"name": "sft", "kind": "sft", "agent": "policy"}, {"name": "eval", "kind": "evaluate"}],
        },
    }


def test_terms_of_a_training_stage(tmp_path):
    rows = plan(recipe(tmp_path), str(tmp_path), prompt_tokens=32)
    n = model_size(str(tmp_path / "policy"), "p").params
    other = model_size(str(tmp_path / "other"), "o").params
    judge = model_size(str(tmp_path / "judge"), "j").params
    sft, evaluate = rows
    assert sft["parameters"] == 4 * n and sft["gradients"] == 4 * n and sft["optimiser"] == 8 * n
    assert sft["frozen agents"] == 4 * other and sft["judge"] == 2 * judge and sft["kv cache"] == 0
    assert sft["activations"] > 0 and sft["ranks"] == 4
    assert evaluate["parameters"] == 0 and evaluate["frozen agents"] == 4 * (n + other) and evaluate["kv cache"] > 0
    assert sft["total"] == pytest.approx(sum(sft[k] for k in ("parameters", "gradients", "optimiser", "frozen agents",
                                                              "judge", "gathered blocks", "activations")))


def test_sharding_divides_by_the_world_and_bf16_halves(tmp_path):
    full = plan(recipe(tmp_path), str(tmp_path))[0]
    sharded = plan(recipe(tmp_path, strategy="grpo_fsdp"), str(tmp_path))[0]
    for key in ("parameters", "gradients", "optimiser", "frozen agents"):
        assert sharded[key] == pytest.approx(full[key] / 4)
    assert sharded["judge"] == pytest.approx(full["judge"] / 4)  # a local judge is sharded too
    assert sharded["gathered blocks"] > 0 == full["gathered blocks"]
    half = plan(recipe(tmp_path, dtype="bfloat16", precision="bf16-mixed"), str(tmp_path))[0]
    assert half["parameters"] == full["parameters"] / 2 and half["frozen agents"] == full["frozen agents"] / 2
    assert half["activations"] < full["activations"]
    # fp32 masters under bf16-mixed: FSDP2 gathers the blocks in bf16, half of fp32's
    mixed = plan(recipe(tmp_path, strategy="grpo_fsdp", precision="bf16-mixed"), str(tmp_path))[0]
    assert mixed["parameters"] == sharded["parameters"]
    blocks = [model_size(str(tmp_path / name), name).block for name in ("policy", "other", "judge")]
    assert sharded["gathered blocks"] == 2 * max(4 * blocks[0], 4 * blocks[1], 2 * blocks[2])  # judge: bf16
    assert mixed["gathered blocks"] == 2 * 2 * max(blocks)


def test_lora_trains_only_adapters(tmp_path):
    peft = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    row = plan(recipe(tmp_path, peft=peft), str(tmp_path))[0]
    size = model_size(str(tmp_path / "policy"), "p")
    adapters = 3 * (4 * (64 + 64) + 4 * (64 + 32))  # layers × r × (in + out) for q_proj and v_proj
    assert lora_params(size, peft) == adapters
    assert row["gradients"] == 4 * adapters and row["optimiser"] == 8 * adapters
    assert row["parameters"] == 4 * size.params + 4 * adapters


@pytest.mark.slow  # `agentcap plan` in subprocesses
def test_the_command_names_the_largest_term_when_it_does_not_fit(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(recipe(tmp_path)))
    args = ["--config", str(config), "--root", str(tmp_path)]
    fits = subprocess.run([sys.executable, "-m", "agentcap.cli", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # registered as a subcommand
    assert fits.returncode == 0, fits.stderr
    assert "| sft | policy | 0–3 |" in fits.stdout and "| eval | - | 0–3 |" in fits.stdout
    assert plan_command([*args, "--device-memory", "1e-4"]) == 1
    assert "NO: largest term" in capsys.readouterr().out
    assert plan_command([*args, "--root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert ".model: " in err and "config.json not found" in err


def test_a_served_judge_holds_nothing_in_the_ranks(tmp_path):
    config = recipe(tmp_path)
    kwargs = config["model"]["env"]["kwargs"]
    loaded = plan(config, str(tmp_path))[0]["judge"]
    kwargs["temporal_examiner"] = {"url": "http://127.0.0.1:8000/v1", "model": "examiner"}
    assert plan(config, str(tmp_path))[0]["judge"] == loaded > 0  # only the loaded examiner counts
    kwargs["examiner"] = {"url": "http://127.0.0.1:8000/v1", "model": "examiner"}
    assert plan(config, str(tmp_path))[0]["judge"] == 0


def test_every_paper_recipe_plans_from_the_shipped_stand_ins():
    for name in ("read", "audiomap", "acecap"):
        config = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
        rows = plan(config, str(ROOT / "tools" / "plan_models"))
        assert rows and all(r["ranks"] == 8 and r["sharded"] for r in rows), name
        assert all(0 < r["total"] < 1000 * GIB for r in rows)
        if name != "read":  # READ's GPT-2 coherence scorer is loaded; the 27B judges are served
            assert all(r["judge"] == 0 for r in rows), name
