"""`agentcap export`: a LoRA run's agents as folders plain transformers loads and generates with,
merged or with the adapter kept separate; the checkpoint holds adapters only and resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from agentcap.commands.export import export_agent

ROOT = Path(__file__).resolve().parents[1]
STAGES = [
    {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
    {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 1},
]


def agentcap(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, "-m", "agentcap.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def agent_logits(agent, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), agent.active():
        return agent.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, toy_movie):
    from conftest import read_config

    run_dir = tmp_path_factory.mktemp("lora_run")
    config = read_config(run_dir, toy_movie, STAGES, beta=0.1, micro_batch_size=4)
    document = yaml.safe_load(config.read_text())
    document["model"]["agents"]["policy"] = {
        "tiny": {"kind": "qwen2"}, "build_tokenizer_from": [str(toy_movie / "texts.txt")], "max_new_tokens": 8,
        "lr": 1e-2, "peft": {"r": 4, "alpha": 8}, "gradient_checkpointing": True,
    }
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    result = agentcap("fit", "--config", str(config))
    assert result.returncode == 0, result.stderr[-4000:]
    return config, run_dir


@pytest.mark.slow  # `agentcap fit` in a subprocess (lora_run)
def test_lora_checkpoint_holds_adapters_only_and_resumes(lora_run):
    from agentcap.training.loading import load_module

    config, run_dir = lora_run
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    keys = list(checkpoint["state_dict"])
    assert keys and all(".lora_" in k or k.endswith("adapter_base_fingerprint") for k in keys), keys[:5]
    module = load_module(str(config), str(run_dir / "checkpoints" / "last.ckpt"))
    module.on_load_checkpoint(checkpoint)
    module._begin_stage(checkpoint["agentcap"]["stage_index"])  # the GRPO stage: AdamW state of the adapter
    state = module._optimizer.state
    own = module.agents["policy"].adapters.own_parameters()
    assert len(state) == len(own) and all(state[p]["exp_avg"].shape == p.shape for p in own)


@pytest.mark.slow  # `agentcap fit` in a subprocess (lora_run)
@pytest.mark.parametrize("merge", [True, False])
def test_export_loads_and_generates_with_plain_transformers(lora_run, tmp_path, merge):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from agentcap.training.loading import load_module

    config, run_dir = lora_run
    out = tmp_path / "export"
    result = agentcap("export", "--config", str(config), "--out", str(out), "--merge" if merge else "--no-merge")
    assert result.returncode == 0, result.stderr[-4000:]
    folder = out / "policy"
    assert result.stdout.strip().splitlines() == [str(folder.resolve())]
    assert (folder / "adapter_config.json").is_file() != merge
    model = AutoModelForCausalLM.from_pretrained(folder)
    # the toy world's word-level tokenizer: AutoTokenizer would pick Qwen2's BPE class from config.json
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    ids = tokenizer("the man opens the door", return_tensors="pt", add_special_tokens=False)["input_ids"]
    new = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    assert new.shape[1] > ids.shape[1]
    trained = load_module(str(config), str(run_dir / "checkpoints" / "last.ckpt")).agents["policy"]
    torch.testing.assert_close(hf_logits(model, ids), agent_logits(trained, ids), rtol=1e-4, atol=1e-5)


def test_shared_base_exports_each_role_with_its_own_adapter(tmp_path):
    from test_adapters import shared_pair, train
    from transformers import AutoModelForCausalLM

    agents = shared_pair()
    agents["captioner"].set_trainable(True)
    train(agents["captioner"])
    ids = torch.tensor([[3, 5, 7, 9]])
    for merge in (True, False):
        bases: dict[int, str] = {}
        for role, agent in agents.items():
            folder = export_agent(agent, str(tmp_path / str(merge)), merge=merge, bases=bases)
            model = AutoModelForCausalLM.from_pretrained(folder)
            torch.testing.assert_close(hf_logits(model, ids), agent_logits(agent, ids), rtol=1e-4, atol=1e-5)
        assert len(bases) == (0 if merge else 1)  # unmerged: one base folder for both roles
    assert not torch.allclose(agent_logits(agents["captioner"], ids), agent_logits(agents["instruct"], ids))
