"""Every model family through the one Agent interface, on the real HF classes built tiny.

For each architecture (plain causal LMs, Qwen2-VL, Qwen3-VL, Qwen2-Audio, the Qwen2.5-Omni
thinker) with real media through the real processor: generation returns texts with old log-probs;
one GRPO step moves the trainable agent (LM and media tower) and leaves a frozen one untouched;
and the learner's log-probs agree with generate, with the model's own forward, and between a
left-padded batch and single rows (the position-id / M-RoPE check).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_agents import tiny_agent

from agentcap.agents import AgentConfig, build_agent
from agentcap.agents.agent import pad_right
from agentcap.agents.tiny import TINY_KINDS, build_tiny
from agentcap.algorithms.grpo import clipped_objective

VISION = ("qwen2_vl", "qwen3_vl")
AUDIO = ("qwen2_audio", "qwen2_5_omni_thinker")
CAUSAL = tuple(k for k in TINY_KINDS if k not in VISION + AUDIO)

try:  # the Qwen image / video processors (also inside Qwen2.5-Omni's processor) need torchvision
    import torchvision  # noqa: F401

    HAS_TORCHVISION = True
except ImportError:
    HAS_TORCHVISION = False
NEEDS_TORCHVISION = ("qwen2_vl", "qwen3_vl", "qwen2_5_omni_thinker")


def kinds(*names: str) -> list:
    """Parameters for ``names``; the ones whose processor needs torchvision skip (loudly) without it."""
    skip = pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision (and pillow) not installed")
    return [pytest.param(k, marks=skip) if k in NEEDS_TORCHVISION else k for k in names]
SR = 16000

#: Parameters a GRPO step must move: the LM head and body, and the media path into the LM.
MUST_TRAIN = {
    "qwen2": (r"lm_head", r"embed_tokens", r"layers\.1\.mlp"),
    "qwen3": (r"lm_head", r"embed_tokens", r"layers\.1\.mlp"),
    "llama": (r"lm_head", r"embed_tokens", r"layers\.1\.mlp"),
    "gpt2": (r"wte", r"h\.1\.mlp"),
    "qwen2_vl": (r"lm_head", r"embed_tokens", r"visual\.patch_embed", r"visual\.blocks\.0", r"visual\.merger"),
    "qwen3_vl": (r"lm_head", r"embed_tokens", r"visual\.patch_embed", r"visual\.pos_embed", r"deepstack_merger"),
    "qwen2_audio": (r"lm_head", r"embed_tokens", r"audio_tower\.(conv1|layers\.0)", r"multi_modal_projector"),
    "qwen2_5_omni_thinker": (r"lm_head", r"embed_tokens", r"audio_tower\.(conv1|layers\.0)", r"audio_tower\.proj"),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls: a second OpenMP thread only adds spin-wait (100× slower on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sine(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def observations(kind: str, text_only_row: bool = False) -> list[dict]:
    """Two observations whose prompts differ in length (text and media size), so the batch pads."""
    rng = np.random.default_rng(0)
    prompts = ["describe the clip .", "what happens ? describe the sound of the clip , the man and the woman ."]
    if kind in VISION:
        media = [
            {"frames": rng.integers(0, 256, (4, 40, 48, 3), dtype=np.uint8)},
            {"frames": rng.integers(0, 256, (3, 90, 70, 3), dtype=np.uint8), "fps": 1.0},
        ]
    elif kind in AUDIO:
        media = [{"waveform": sine(1.0, 440.0)}, {"waveform": sine(1.7, 880.0), "sample_rate": SR}]
    else:
        media = [{}, {}]
    chats = [[{"role": "user", "content": p}] for p in prompts]
    obs = [{"agent": "policy", "messages": c, "media": m} for c, m in zip(chats, media)]
    if text_only_row:  # a multimodal family must also take a row without media in the same batch
        obs.append({"agent": "policy", "messages": [{"role": "user", "content": "caption : a dog ."}], "media": {}})
    return obs


@pytest.mark.parametrize("kind", kinds(*TINY_KINDS))
def test_generate_returns_texts_and_old_logprobs(kind):
    agent = tiny_agent(kind, max_new_tokens=6)
    obs = observations(kind)
    inputs = agent.encode(obs)
    if kind in VISION:
        assert inputs["video_grid_thw"].shape[0] == 2 and "pixel_values_videos" in inputs
    if kind in AUDIO:
        assert inputs["input_features"].shape[0] == 2
        # 1 s / 1.7 s: 100 / 170 mel frames, two stride-2 steps
        assert (inputs["input_ids"] == agent.model.config.audio_token_id).sum(1).tolist() == [25, 42]
    assert (inputs["attention_mask"][:, 0] == 0).any(), "prompts should differ in length (left padding)"

    gens = agent.generate(obs)
    assert len(gens) == 2
    for g in gens:
        assert isinstance(g.text, str)
        assert g.completion_ids.ndim == 1 and 1 <= g.completion_ids.numel() <= 6
        assert g.old_logprobs.shape == g.completion_ids.shape
        assert torch.isfinite(g.old_logprobs).all() and (g.old_logprobs <= 0).all()


@pytest.mark.parametrize("kind", kinds(*TINY_KINDS))
def test_one_grpo_step_trains_the_policy_and_not_the_frozen_agent(kind):
    policy, frozen = tiny_agent(kind, max_new_tokens=6), tiny_agent(kind, name="reference", max_new_tokens=6)
    policy.set_trainable(True)
    # both stay in eval mode (dropout off); only the trainable one has gradients
    assert not policy.model.training and not frozen.model.training
    assert any(p.requires_grad for p in policy.parameters())
    assert not any(p.requires_grad for p in frozen.parameters())
    obs = observations(kind)
    torch.manual_seed(0)
    gens = policy.generate(obs)
    completion, mask = pad_right([g.completion_ids for g in gens], policy.tokenizer.pad_token_id)
    old, _ = pad_right([g.old_logprobs for g in gens], 0)

    ref = frozen.completion_logprobs(frozen.encode(obs), completion, mask)
    assert not ref.requires_grad
    logprobs = policy.completion_logprobs(policy.encode(obs), completion, mask)
    assert logprobs.requires_grad
    out = clipped_objective(logprobs, old, torch.tensor([1.0, -1.0]), mask, beta=0.04, ref_logprobs=ref)
    assert abs(float(out["ratio"]) - 1.0) < 1e-4  # sampler and learner see the same policy

    params = dict(policy.model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    frozen_before = {n: p.detach().clone() for n, p in frozen.model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in params.values() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    out["loss"].backward()
    optimizer.step()

    changed = {n for n, p in params.items() if not torch.equal(p.detach(), before[n])}
    got_grad = {n for n, p in params.items() if p.grad is not None and bool(p.grad.abs().sum() > 0)}
    assert got_grad and got_grad <= changed
    for pattern in MUST_TRAIN[kind]:
        assert any(re.search(pattern, n) for n in changed), f"no parameter matching {pattern!r} was updated"
    for n, p in frozen.model.named_parameters():
        assert not p.requires_grad and p.grad is None, n
        assert torch.equal(p.detach(), frozen_before[n]), n


@pytest.mark.parametrize("kind", kinds(*TINY_KINDS))
def test_logprobs_match_generate_own_forward_and_single_rows(kind):
    agent = tiny_agent(kind, max_new_tokens=6)
    obs = observations(kind, text_only_row=kind not in CAUSAL)
    gens = agent.generate(obs, greedy=True)
    inputs = agent.encode(obs)
    completion, mask = pad_right([g.completion_ids for g in gens], agent.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = agent.family.logits(inputs, completion, mask).float()
        batch = agent.completion_logprobs(inputs, completion, mask)

    # generate (KV cache, its own positions) chose each greedy token as the argmax of our logits
    # (media tokens are suppressed while sampling)
    logits[..., getattr(agent.family, "media_token_ids", [])] = float("-inf")
    chosen = logits.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    assert ((logits.max(-1).values - chosen)[mask.bool()] < 1e-4).all()

    for i, (o, g) in enumerate(zip(obs, gens)):
        single_inputs = agent.encode([o])
        ids = g.completion_ids.unsqueeze(0)
        with torch.no_grad():
            single = agent.completion_logprobs(single_inputs, ids, torch.ones_like(ids))[0]
            # the model's own forward on prompt + completion, positions computed by the model itself
            full = dict(single_inputs)
            full["input_ids"] = torch.cat([single_inputs["input_ids"], ids], dim=1)
            full["attention_mask"] = torch.ones_like(full["input_ids"])
            if "mm_token_type_ids" in full:
                full["mm_token_type_ids"] = F.pad(full["mm_token_type_ids"], (0, ids.shape[1]))
            p = single_inputs["input_ids"].shape[1]
            own = agent.model(**full, use_cache=False).logits[0, p - 1 : -1].float() / agent.temperature
        own = F.log_softmax(own, dim=-1).gather(-1, ids[0].unsqueeze(-1)).squeeze(-1)
        n = ids.shape[1]
        torch.testing.assert_close(single, own, atol=1e-4, rtol=0)
        torch.testing.assert_close(batch[i, :n], single, atol=1e-4, rtol=0)
        torch.testing.assert_close(g.old_logprobs, single, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", kinds(*VISION, *AUDIO))
def test_media_reach_the_language_model(kind):
    agent = tiny_agent(kind, max_new_tokens=4)
    obs = observations(kind)[:1]
    media = {"frames": 255 - obs[0]["media"]["frames"]} if kind in VISION else {"waveform": sine(1.0, 3000.0)}
    other = [dict(obs[0], media=media)]
    completion = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        a = agent.completion_logprobs(agent.encode(obs), completion, torch.ones_like(completion))
        b = agent.completion_logprobs(agent.encode(other), completion, torch.ones_like(completion))
    assert not torch.allclose(a, b, atol=1e-6)


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision (and pillow) not installed")
def test_frames_as_images_and_stills():
    """Frames may go in as separate images; a single frame is a valid clip."""
    agent = tiny_agent("qwen2_vl", max_new_tokens=3)
    agent.family.frames_as = "image"
    obs = observations("qwen2_vl")
    obs[1]["media"] = {"frames": obs[1]["media"]["frames"][0]}  # one [H, W, 3] frame
    inputs = agent.encode(obs)
    assert inputs["image_grid_thw"].shape[0] == 4 + 1 and "pixel_values_videos" not in inputs
    gens = agent.generate(obs, greedy=True)
    single = agent.encode(obs[1:])
    ids = gens[1].completion_ids.unsqueeze(0)
    with torch.no_grad():
        lp = agent.completion_logprobs(single, ids, torch.ones_like(ids))[0]
    torch.testing.assert_close(gens[1].old_logprobs, lp, atol=1e-4, rtol=0)

    agent.family.frames_as = "video"
    assert agent.encode(obs[1:])["video_grid_thw"][0, 0].item() == 1  # the still fills one temporal patch


@pytest.mark.parametrize("kind", kinds("qwen2_vl", "qwen2_audio"))
def test_build_agent_from_a_tiny_config(kind):
    agent = build_agent("policy", AgentConfig(tiny={"kind": kind, "text": {"num_hidden_layers": 1}}, max_new_tokens=3))
    assert agent.family.name == ("vision" if kind in VISION else "audio") and agent.processor is not None
    assert agent.model.config.get_text_config().num_hidden_layers == 1
    assert len(agent.generate(observations(kind))) == 2


@pytest.mark.parametrize("kind", kinds("qwen2_audio", "qwen2_5_omni_thinker", "qwen3_vl"))
def test_build_agent_loads_a_saved_checkpoint_with_its_processor(kind, tmp_path):
    """The real-weights path: model folder → model class, AutoProcessor, family."""
    parts = build_tiny(kind)
    parts.model.save_pretrained(tmp_path)
    parts.processor.save_pretrained(tmp_path)
    agent = build_agent("policy", AgentConfig(model=str(tmp_path), max_new_tokens=3))
    assert type(agent.model) is type(parts.model) and agent.family.name == parts.family
    obs = observations(kind)[:1]
    completion = torch.tensor([[5, 6, 7]])
    reference = tiny_agent(kind)
    with torch.no_grad():
        a = agent.completion_logprobs(agent.encode(obs), completion, torch.ones_like(completion))
        b = reference.completion_logprobs(reference.encode(obs), completion, torch.ones_like(completion))
    torch.testing.assert_close(a, b)


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision (and pillow) not installed")
def test_build_agent_loads_the_thinker_of_a_full_qwen25_omni_checkpoint(tmp_path):
    """A Qwen2.5-Omni folder holds thinker + talker + vocoder; the agent is its thinker."""
    import transformers
    from safetensors.torch import save_file

    parts = build_tiny("qwen2_5_omni_thinker")
    transformers.Qwen2_5OmniConfig(thinker_config=parts.model.config.to_dict()).save_pretrained(tmp_path)
    weights = {f"thinker.{k}": v.contiguous() for k, v in parts.model.state_dict().items()}
    weights["talker.codec_head.weight"] = torch.zeros(2, 2)  # not loaded
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    parts.processor.save_pretrained(tmp_path)

    agent = build_agent("policy", AgentConfig(model=str(tmp_path), max_new_tokens=3))
    assert type(agent.model) is type(parts.model) and agent.family.name == "audio"
    for (name, a), b in zip(agent.model.state_dict().items(), parts.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert len(agent.generate(observations("qwen2_5_omni_thinker"))) == 2
