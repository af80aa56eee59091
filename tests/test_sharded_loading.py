"""Sharded agents and judges load shard by shard (agentcap.parallel.loading): built on the meta
device, sharded, then each process reads only its own rows from the folder's safetensors files, or
takes its shards of rank 0's init. Two gloo processes; every shard must equal the corresponding
rows of a full load, buffers (rotary ``inv_freq``) and tied embeddings included."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import torch
import torch.distributed as dist
from gloo import process_group, run_in_two_processes
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agentcap.agents.agent import AgentConfig, build_agent, build_agents
from agentcap.agents.adapters import LoraSpec
from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.judges import pool
from agentcap.parallel import loading
from agentcap.parallel.sharding import is_sharded, shard_agents

WORDS = ["a", "loud", "beep", "soft", "hiss", "sounds", "once", "twice"]


def save_folder(folder: Path, kind: str, **extra) -> None:
    """A tiny model of a real class saved as safetensors (with its tokenizer), from a fixed seed.
    Odd sizes (vocab 13 + specials, 3 heads of 6) leave rank 1 with fewer rows than rank 0."""
    tokenizer = build_word_tokenizer(WORDS)
    torch.manual_seed(3)
    common = dict(hidden_size=18, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                  intermediate_size=22, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **extra)
    model = LlamaForCausalLM(LlamaConfig(**common)) if kind == "llama" else Qwen2ForCausalLM(Qwen2Config(**common))
    model.save_pretrained(folder)  # safetensors
    tokenizer.save_pretrained(folder)


def check_shards(model: torch.nn.Module, full: torch.nn.Module) -> None:
    """Every local shard equals the same rows of ``full``; buffers equal; forwards agree."""
    from torch.distributed.tensor import DTensor

    reference = dict(full.named_parameters())
    for name, param in model.named_parameters():
        assert isinstance(param, DTensor) and not param.is_meta, name
        local, want = param.to_local(), reference[name].detach()
        per = -(-want.shape[0] // 2)
        rows = want[dist.get_rank() * per:(dist.get_rank() + 1) * per]
        assert local.dtype == want.dtype and torch.equal(local, rows), name
    buffers = dict(full.named_buffers())
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
    ids = torch.tensor([[1, 4, 5, 6, 2]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, full(ids).logits)


def todays_model(config: AgentConfig) -> torch.nn.Module:
    """The model ``build_agent`` gives without loading by shard: the full load of today's path."""
    loading.load_by_shard(False)
    try:
        return build_agent("policy", config).model
    finally:
        loading.load_by_shard(True)


def _folder_agents(rank: int, port: int, root: str) -> None:
    with process_group(rank, port):
        loading.load_by_shard()
        try:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (2,))
            for kind in ("llama", "qwen2"):
                folder = str(Path(root) / kind)
                agent = build_agent("policy", AgentConfig(model=folder))
                assert all(p.is_meta for p in agent.model.parameters())  # nothing read yet
                assert not any(b.is_meta for b in agent.model.buffers())  # inv_freq computed at build
                mirrors = shard_agents({"policy": agent}, mesh, mirrored=["policy"])
                full = todays_model(AgentConfig(model=folder))
                check_shards(agent.model, full)
                check_shards(mirrors["policy"], full)  # the KL reference's copy, filled alike
                if kind == "llama":  # tied: one parameter for the embedding and the head, still
                    assert agent.model.lm_head.weight is agent.model.model.embed_tokens.weight
            # a LoRA adapter attached on meta keeps its init: the shards equal today's path, same seed
            lora = AgentConfig(model=str(Path(root) / "qwen2"), peft=LoraSpec(r=2))
            torch.manual_seed(5)
            adapted = build_agent("policy", lora)
            shard_agents({"policy": adapted}, mesh)
            torch.manual_seed(5)
            check_shards(adapted.model, todays_model(lora))
            assert any("lora_A" in name for name, _ in adapted.model.named_parameters())
            # a folder the shard reader cannot read (no safetensors): today's load, sliced; in bf16
            bf16 = build_agent("policy", AgentConfig(model=str(Path(root) / "bin"), dtype="bfloat16"))
            shard_agents({"policy": bf16}, mesh)
            full = todays_model(AgentConfig(model=str(Path(root) / "bin"), dtype="bfloat16"))
            check_shards(bf16.model, full)
            # an update step: the same loss and gradient shards as today's path (full load, broadcast)
            old = todays_model(AgentConfig(model=str(Path(root) / "llama")))
            shard_agents({"policy": SimpleNamespace(model=old)}, mesh)
            new = build_agent("policy", AgentConfig(model=str(Path(root) / "llama")))
            shard_agents({"policy": new}, mesh)
            new.set_trainable(True)
            old.requires_grad_(True)
            ids = torch.tensor([[1, 4, 5, 6, 2], [3, 7, 8, 9, 2]])
            losses = [torch.log_softmax(m(ids).logits, -1).gather(-1, ids[:, 1:, None]).mean() for m in (old, new.model)]
            assert torch.equal(losses[0], losses[1])
            for loss in losses:
                loss.backward()
            for (name, a), b in zip(old.named_parameters(), new.model.parameters(), strict=True):
                assert torch.equal(a.grad.to_local(), b.grad.to_local()), name
            # a judge loading after sharding began: on meta, then by shard, in the checkpoint's dtype
            pool.shard_judges(mesh)
            judge, tokenizer = pool.causal_lm(str(Path(root) / "judge"), "cpu")
            assert is_sharded(judge) and tokenizer.pad_token_id is not None
            check_shards(judge, AutoModelForCausalLM.from_pretrained(str(Path(root) / "judge"), dtype="auto").eval())
            assert next(judge.parameters()).dtype == torch.bfloat16
        finally:
            loading.load_by_shard(False)
            pool.clear()


@pytest.mark.slow  # two processes: ~40 s on a busy 2-core machine
def test_sharded_agents_and_judges_read_only_their_rows_of_the_folder(tmp_path):
    save_folder(tmp_path / "llama", "llama", tie_word_embeddings=True)
    save_folder(tmp_path / "qwen2", "qwen2")
    save_folder(tmp_path / "judge", "llama")
    AutoModelForCausalLM.from_pretrained(tmp_path / "judge", dtype=torch.bfloat16).save_pretrained(tmp_path / "judge")
    assert json.loads((tmp_path / "judge" / "config.json").read_text())["dtype"] == "bfloat16"
    save_folder(tmp_path / "bin", "llama", tie_word_embeddings=False)
    from safetensors.torch import load_file

    weights = tmp_path / "bin" / "model.safetensors"
    torch.save(load_file(weights), tmp_path / "bin" / "pytorch_model.bin")
    weights.unlink()
    run_in_two_processes(_folder_agents, str(tmp_path))


def _scattered(rank: int, port: int, root: str) -> None:
    with process_group(rank, port):
        loading.load_by_shard()
        try:
            from torch.distributed.device_mesh import init_device_mesh

            torch.manual_seed(0)
            configs = {"captioner": AgentConfig(tiny={"kind": "qwen2"}, peft=LoraSpec(r=2)),
                       "composer": AgentConfig(share_base_with="captioner", peft=LoraSpec(r=2))}
            agents = build_agents(configs)
            meta = any(p.is_meta for p in agents["captioner"].model.parameters())
            assert meta == (rank == 1)  # rank 0 builds the init every process takes its shards of
            state = {k: v.clone() for k, v in agents["captioner"].model.state_dict().items()}
            if rank == 0:
                torch.save((state, agents["composer"].adapters.base_fingerprint), Path(root) / "rank0.pt")
            shard_agents(agents, init_device_mesh("cpu", (2,)))
            assert is_sharded(agents["composer"].model) and agents["composer"].model is agents["captioner"].model
            dist.barrier()
            want, base = torch.load(Path(root) / "rank0.pt")
            for role in agents:  # the adapters' base fingerprint, taken from the shards once they are in
                torch.testing.assert_close(agents[role].adapters.base_fingerprint, base, rtol=1e-12, atol=0)
            got = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in agents["captioner"].model.state_dict().items()}
            assert got.keys() == want.keys()
            for key in want:
                assert torch.equal(got[key], want[key]), key
            assert any("lora_A" in key for key in want) and any("composer" in key for key in want)
        finally:
            loading.load_by_shard(False)


@pytest.mark.slow  # two processes
def test_a_model_with_no_folder_takes_its_shards_of_rank_zeros_init(tmp_path):
    run_in_two_processes(_scattered, str(tmp_path))


def test_only_parameters_go_to_meta():
    with loading.parameters_on_meta():
        model = LlamaForCausalLM(LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=16, vocab_size=10))
    assert all(p.is_meta for p in model.parameters())
    assert not model.model.rotary_emb.inv_freq.is_meta and model.model.rotary_emb.inv_freq.abs().sum() > 0
    assert not torch.nn.Linear(2, 2).weight.is_meta  # the patch ends with the context


def test_rank_zero_is_known_before_the_process_group(monkeypatch):
    for key in ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert loading.launch_rank() == 0  # the launching process
    monkeypatch.setenv("LOCAL_RANK", "1")  # a child Lightning started
    assert loading.launch_rank() == 1
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "1")  # first process of the second node
    assert loading.launch_rank() == 1
    loading.load_by_shard()
    try:
        assert loading.builds_on_meta("folder") and loading.builds_on_meta(None)
    finally:
        loading.load_by_shard(False)
    assert not loading.builds_on_meta("folder")
