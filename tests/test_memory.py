"""Memory and precision: micro-batches add up to one step, checkpointing leaves gradients (and
dropout) alone, the per-stage lr schedule resumes, and bf16 parameters on a trained agent are
refused while bf16-mixed autocast reaches rollout and update."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from agentcap.agents.agent import AgentConfig, build_agent, pad_right
from agentcap.training.loading import load_module
from agentcap.training.optim import lr_factor, micro_batches
from agentcap.training.update import policy_step

STAGES = [
    {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
    {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 1},
]


def module_for(tmp_path, toy_movie, make_read_config, stages=STAGES, policy=None, **model):
    config = make_read_config(tmp_path / "run", toy_movie, stages, **model)
    if policy is not None:
        import yaml

        document = yaml.safe_load(config.read_text())
        document["model"]["agents"]["policy"].update(policy)
        config.write_text(yaml.safe_dump(document))
    torch.manual_seed(0)
    module = load_module(str(config), None)
    module.manual_backward = lambda loss: loss.backward()  # no Trainer in these unit tests
    return module


def test_micro_batches_1x8_equal_8x1_in_loss_grads_and_weights(tmp_path, toy_movie, make_read_config):
    module = module_for(tmp_path, toy_movie, make_read_config, beta=0.1)
    grpo = 1
    module._begin_stage(grpo)
    agent = module.agents["policy"]
    torch.manual_seed(0)
    batch = module.splits.driver("train", module.schedule.stages[grpo]).run([0, 1], 4, seed=0, sample_agents={"policy"})
    spans = batch.spans_of("policy")
    assert len(spans) == 8
    for i, span in enumerate(spans):
        span.advantage = float(i % 3) - 1.0
    start = copy.deepcopy(agent.state_dict())
    results = []
    for micro in (None, 1):  # one pass of 8, eight passes of 1
        agent.load_state_dict(start)
        module._begin_stage(grpo)  # a fresh AdamW and KL reference on the same weights
        module.micro_batch_size = micro
        grads = {}
        step = module._optimizer.step

        def record_then_step(*args, **kwargs):
            grads.update({n: p.grad.clone() for n, p in agent.named_parameters() if p.grad is not None})
            return step(*args, **kwargs)

        module._optimizer.step = record_then_step
        stats = policy_step(agent, spans, module.update_settings, module._optimizer, device=module.device,
                            reference=module._reference, backward=module.manual_backward)  # GRPOModule.update's step
        results.append((stats, grads, {k: v.clone() for k, v in agent.state_dict().items()}))
    (stats1, grads1, weights1), (stats8, grads8, weights8) = results
    assert grads1 and set(grads1) == set(grads8)
    for k in ("loss", "pg_loss", "kl", "clipfrac", "entropy", "grad_norm"):
        assert stats1[k] == pytest.approx(stats8[k], rel=1e-4, abs=1e-6), k
    for n in grads1:
        torch.testing.assert_close(grads8[n], grads1[n], rtol=1e-4, atol=1e-6)
    for k in weights1:  # AdamW divides by sqrt(v): float-rounding gaps in tiny gradients reach ~1e-6
        torch.testing.assert_close(weights8[k], weights1[k], rtol=1e-4, atol=2e-6)
    assert any(not torch.equal(weights1[k], start[k]) for k in start)


def test_a_sharded_rank_short_of_passes_runs_stand_ins_at_scale_zero(monkeypatch):
    from agentcap.training import optim

    agent = SimpleNamespace(name="policy", model=None)
    monkeypatch.setattr(optim.distributed, "world", lambda: (1, 2))
    monkeypatch.setattr(optim, "needs_gradient_all_reduce", lambda _: False)  # sharded
    monkeypatch.setattr(optim.distributed, "most", lambda n: 3)  # the other rank has 3 passes
    assert optim.aligned_micro_batches(agent, [1, 2, 3], 2) == [([1, 2], 1.0), ([3], 1.0), ([3], 0.0)]
    assert optim.aligned_micro_batches(agent, [], 2, stand_in=[9]) == [([9], 0.0)] * 3
    with pytest.raises(ValueError, match="agents.policy"):
        optim.aligned_micro_batches(agent, [], 2)
    monkeypatch.setattr(optim, "needs_gradient_all_reduce", lambda _: True)  # DDP: passes are local
    assert optim.aligned_micro_batches(agent, [1, 2, 3], 2) == [([1, 2], 1.0), ([3], 1.0)]


def test_micro_batches_split_and_keep_order():
    assert micro_batches(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert micro_batches(list(range(5)), None) == [list(range(5))]
    assert micro_batches([], 3) == []


def _loss_and_grads(agent):
    obs = [{"agent": "policy", "messages": [{"role": "user", "content": "the cat sat" + " on" * i}]} for i in range(3)]
    gens = agent.generate(obs, greedy=True)
    completion, mask = pad_right([g.completion_ids for g in gens], agent.tokenizer.pad_token_id)
    logprobs = agent.completion_logprobs(agent.encode(obs), completion, mask)
    loss = -(logprobs * torch.linspace(0.5, 1.5, logprobs.shape[1])).sum()
    loss.backward()
    return gens, float(loss.detach()), {n: p.grad.clone() for n, p in agent.model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_recomputes_layers_with_dropout_off_and_equal_grads(monkeypatch):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    # dropout that would act if anything switched to training mode
    tiny = {"kind": "qwen2", "text": {"attention_dropout": 0.5}}
    plain = build_agent("policy", AgentConfig(tiny=tiny, max_new_tokens=6))
    checkpointed = build_agent("policy", AgentConfig(tiny=tiny, max_new_tokens=6, gradient_checkpointing=True))
    calls: list[bool] = []
    forward = Qwen2DecoderLayer.forward

    def counting(self, *args, **kwargs):
        calls.append(torch.is_grad_enabled())
        assert not any(m.training for m in self.modules()), "a layer ran in training mode"
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Qwen2DecoderLayer, "forward", counting)
    for agent in (plain, checkpointed):
        agent.set_trainable(True)
    layers = plain.model.config.num_hidden_layers
    gens_plain, loss_plain, grads_plain = _loss_and_grads(plain)
    assert calls.count(True) == layers
    calls.clear()
    gens_ckpt, loss_ckpt, grads_ckpt = _loss_and_grads(checkpointed)
    # generation (no grad, KV cache) is unchanged; the graded forward is recomputed in the backward
    assert [g.text for g in gens_ckpt] == [g.text for g in gens_plain]
    assert calls.count(True) == 2 * layers
    assert loss_ckpt == pytest.approx(loss_plain, rel=1e-6)
    assert set(grads_ckpt) == set(grads_plain)
    for n in grads_plain:
        torch.testing.assert_close(grads_ckpt[n], grads_plain[n], rtol=1e-5, atol=1e-7)


def test_lr_schedule_warms_up_decays_and_resumes(tmp_path, toy_movie, make_read_config):
    assert [lr_factor(s, 6, 2, "cosine") for s in range(2)] == [0.5, 1.0]
    assert lr_factor(2, 6, 2, "cosine") == pytest.approx(1.0)
    assert lr_factor(4, 6, 2, "cosine") == pytest.approx(0.5)
    assert lr_factor(4, 6, 2, "linear") == pytest.approx(0.5)
    assert lr_factor(5, 6, 2, "constant") == 1.0
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 6, "lr": 0.1, "warmup_steps": 2,
               "lr_schedule": "cosine"}]
    module = module_for(tmp_path, toy_movie, make_read_config, stages)
    module._begin_stage(0)
    assert module._optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    for _ in range(4):
        module._scheduler.step()
    checkpoint: dict = {}
    module.tick = 4
    module.on_save_checkpoint(checkpoint)
    resumed = module_for(tmp_path, toy_movie, make_read_config, stages)
    resumed.on_load_checkpoint(checkpoint)
    resumed._begin_stage(0)
    assert resumed._optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * lr_factor(4, 6, 2, "cosine"))
    with pytest.raises(ValueError, match="warmup_steps"):
        module_for(tmp_path, toy_movie, make_read_config, [{**stages[0], "warmup_steps": 7}])


def test_bf16_parameters_on_a_trained_agent_are_refused(tmp_path, toy_movie, make_read_config):
    with pytest.raises(ValueError, match=r"agents\.policy\.dtype: bfloat16.*bf16-mixed"):
        module_for(tmp_path, toy_movie, make_read_config, policy={"dtype": "bfloat16"})
    # frozen in every stage: bf16 is fine; under a LoRA adapter the base may be bf16, the adapter is fp32
    evaluate_only = [{"name": "eval", "kind": "evaluate", "split": "test"}]
    module_for(tmp_path, toy_movie, make_read_config, evaluate_only, policy={"dtype": "bfloat16"})
    lora = module_for(tmp_path, toy_movie, make_read_config,
                      policy={"dtype": "bfloat16", "peft": {"target_modules": ["q_proj", "v_proj"]}})
    agent = lora.agents["policy"]
    assert {p.dtype for p in agent.adapters.own_parameters()} == {torch.float32}
    assert torch.bfloat16 in {p.dtype for p in agent.adapters.base_parameters()}


@pytest.mark.slow  # a Trainer fit
def test_bf16_mixed_autocasts_rollout_and_update_and_keeps_fp32_weights(tmp_path, toy_movie, make_read_config):
    module = module_for(tmp_path, toy_movie, make_read_config, beta=0.1, micro_batch_size=4)
    del module.manual_backward  # the Trainer's own backward this time
    agent = module.agents["policy"]
    seen: list[tuple[bool, torch.dtype]] = []
    layer = agent.model.lm.model.layers[0].self_attn.q_proj
    layer.register_forward_hook(lambda m, args, out: seen.append((torch.is_grad_enabled(), out.dtype)))
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(module)
    assert module.tick == 3
    sampled = {dtype for grad, dtype in seen if not grad}
    learned = {dtype for grad, dtype in seen if grad}
    assert sampled == {torch.bfloat16} and learned == {torch.bfloat16}, (sampled, learned)
    assert all(p.dtype == torch.float32 for p in agent.parameters())
    assert any(not torch.equal(before[k], v) for k, v in agent.state_dict().items())


# --- bf16-mixed under sharding: FSDP2's mixed-precision policy -----------------------------------
def _mixed_precision_worker(rank: int, port: int, out_dir: str) -> None:
    import json
    import os

    from gloo import process_group
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentcap.parallel.sharding import _shard, mixed_precision

    with process_group(rank, port):
        torch.manual_seed(0)
        config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                             intermediate_size=64, vocab_size=50)
        model = LlamaForCausalLM(config)
        ids = torch.arange(12).view(2, 6) % 50
        reference = copy.deepcopy(model)
        reference(input_ids=ids).logits.float().pow(2).mean().backward()
        _shard(model, init_device_mesh("cpu", (2,)), mixed_precision("bf16-mixed"))
        seen = []
        q_proj = model.model.layers[0].self_attn.q_proj
        q_proj.register_forward_hook(lambda m, args, out: seen.append((str(m.weight.dtype), str(out.dtype))))
        model(input_ids=ids).logits.float().pow(2).mean().backward()
        errors = {}
        for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            full = p.grad.full_tensor()
            errors[name] = [str(p.dtype), str(p.grad.dtype), float((full / 2 - q.grad).norm() / q.grad.norm())]
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
            json.dump({"seen": seen, "errors": errors}, handle)


@pytest.mark.slow  # two gloo processes
def test_bf16_mixed_under_sharding_gathers_in_bf16_and_keeps_fp32_masters(tmp_path):
    """Sharded with ``mixed_precision("bf16-mixed")``: blocks compute with bf16 weights, while the
    sharded parameters and their (summed) gradients stay fp32 and match fp32 gradients to bf16 rounding."""
    import json

    from gloo import run_in_two_processes

    from agentcap.parallel.sharding import mixed_precision

    assert mixed_precision("32-true") is None and mixed_precision("bf16-true") is None
    run_in_two_processes(_mixed_precision_worker, str(tmp_path))
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["seen"] == [["torch.bfloat16", "torch.bfloat16"]]
        for name, (dtype, grad_dtype, error) in result["errors"].items():
            assert dtype == grad_dtype == "torch.float32", name
            assert error < 0.05, (name, error)  # two ranks' sums, each within bf16 rounding of fp32
