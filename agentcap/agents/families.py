"""Model families: how observations become model inputs, for each kind of model.

An agent's model is one of a few families that differ only in how a chat plus media turns into
tensors. Each family gives ``encode`` (observations → left-padded prompt tensors plus the extra
keyword arguments the model needs), ``generate`` (new tokens only) and ``logits`` (the logits that
predict a given completion after the prompt). Everything else, sampling settings, log-probs,
masks, is shared in :class:`agentcap.agents.Agent`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Observation = dict[str, Any]


class Family:
    """Base: a plain causal LM reading the chat template's text (Qwen2/Qwen3/GPT-2/Llama class)."""

    name = "causal_lm"

    def __init__(self, model, tokenizer, processor=None):
        self.model = model
        self.tokenizer = tokenizer
        self.processor = processor

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_text(self, messages: list[dict[str, str]]) -> str:
        template = getattr(self.tokenizer, "chat_template", None)
        if template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"

    def encode(self, observations: list[Observation]) -> dict[str, Any]:
        texts = [self.prompt_text(o["messages"]) for o in observations]
        self.tokenizer.padding_side = "left"
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return {k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}

    def generate(self, inputs: dict[str, Any], **kwargs) -> torch.Tensor:
        out = self.model.generate(**inputs, **kwargs)
        return out[:, inputs["input_ids"].shape[1] :]

    def logits(self, inputs: dict[str, Any], completion: torch.Tensor, completion_mask: torch.Tensor):
        """Logits predicting each completion token: [N, T, V]."""
        ids = torch.cat([inputs["input_ids"], completion], dim=1)
        mask = torch.cat([inputs["attention_mask"], completion_mask], dim=1)
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        if self.uses_position_ids:
            extra["position_ids"] = (mask.cumsum(dim=1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, **extra).logits
        p, t = inputs["input_ids"].shape[1], completion.shape[1]
        return logits[:, p - 1 : p + t - 1]

    #: Left padding shifts positions unless they are derived from the mask; multimodal rope
    #: models (Qwen2-VL) derive their own.
    uses_position_ids = True


class ToyFamily(Family):
    """The offline demo's :class:`agentcap.agents.toy.ToyMediaLM`: media travel as a list of dicts."""

    name = "toy"

    def encode(self, observations: list[Observation]) -> dict[str, Any]:
        inputs = super().encode(observations)
        inputs["media"] = [o.get("media", {}) for o in observations]
        return inputs

    def generate(self, inputs: dict[str, Any], **kwargs) -> torch.Tensor:
        # generating from inputs_embeds returns only the new tokens
        return self.model.generate(inputs["input_ids"], inputs["attention_mask"], inputs["media"], **kwargs)

    def logits(self, inputs: dict[str, Any], completion: torch.Tensor, completion_mask: torch.Tensor):
        ids = torch.cat([inputs["input_ids"], completion], dim=1)
        mask = torch.cat([inputs["attention_mask"], completion_mask], dim=1)
        logits = self.model(ids, mask, inputs["media"])
        p, t = inputs["input_ids"].shape[1], completion.shape[1]
        return logits[:, p - 1 : p + t - 1]


class ProcessorFamily(Family):
    """HF multimodal models whose processor expands media placeholders in the prompt text.

    Subclasses name the placeholder text, the processor keyword and how to pull the media out of an
    observation; the processor builds ``input_ids`` with the right number of media tokens plus the
    media tensors (``pixel_values``, ``input_features``…), all passed straight to the model.
    """

    placeholder = ""
    processor_key = ""
    uses_position_ids = False

    def media_of(self, observation: Observation):
        raise NotImplementedError

    def prompt_text(self, messages: list[dict[str, str]]) -> str:
        messages = [dict(m) for m in messages]
        for m in messages:
            if m["role"] == "user":
                m["content"] = self.placeholder + m["content"]
                break
        template = getattr(self.processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        if template:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, chat_template=template
            )
        return super().prompt_text(messages)

    def encode(self, observations: list[Observation]) -> dict[str, Any]:
        texts = [self.prompt_text(o["messages"]) for o in observations]
        media = [self.media_of(o) for o in observations]
        self.tokenizer.padding_side = "left"
        kwargs = {self.processor_key: media} if any(m is not None for m in media) else {}
        batch = self.processor(text=texts, return_tensors="pt", padding=True, **kwargs)
        device = self.device
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


class VisionFamily(ProcessorFamily):
    """Qwen2-VL / Qwen3-VL class: frames in ``media["frames"]`` ([n, H, W, 3] uint8) as images."""

    name = "vision"
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    processor_key = "images"

    def media_of(self, observation: Observation):
        frames = observation.get("media", {}).get("frames")
        if frames is None:
            return None
        # the frames of one clip are tiled side by side into one image: one placeholder per prompt
        return np.concatenate(list(np.asarray(frames, dtype=np.uint8)), axis=1)

    def generate(self, inputs: dict[str, Any], **kwargs) -> torch.Tensor:
        return super().generate(inputs, **kwargs)


class AudioFamily(ProcessorFamily):
    """Qwen2-Audio / Qwen2.5-Omni thinker class: ``media["waveform"]`` through the feature extractor."""

    name = "audio"
    placeholder = "<|audio_bos|><|AUDIO|><|audio_eos|>"
    processor_key = "audio"

    def media_of(self, observation: Observation):
        wave = observation.get("media", {}).get("waveform")
        return None if wave is None else np.asarray(wave, dtype=np.float32)


FAMILIES: dict[str, type[Family]] = {
    f.name: f for f in (Family, ToyFamily, VisionFamily, AudioFamily)
}
