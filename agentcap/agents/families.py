"""Model families: how observations become model inputs, for each kind of model.

An agent's model is one of a few families that differ only in how a chat plus media turns into
tensors. Each family gives ``encode`` (observations → left-padded prompt tensors plus the extra
keyword arguments the model needs), ``generate`` (new tokens only) and ``logits`` (the logits that
predict a given completion after the prompt). Everything else, sampling settings, log-probs,
masks, is shared in :class:`agentcap.agents.Agent`.

The one invariant every family keeps: ``logits`` sees exactly the positions ``generate`` saw. HF
``generate`` derives positions from the attention mask (left padding aware), and the M-RoPE models
(Qwen2-VL, Qwen3-VL, Qwen2.5-Omni) from their ``get_rope_index``; ``logits`` therefore always passes
explicit position ids computed the same way for prompt + completion, so a batch's log-probs equal
those of each row run alone, and the old log-probs equal what the update recomputes.
"""

from __future__ import annotations

import inspect
from functools import cached_property
from typing import Any

import numpy as np
import torch

from agentcap.agents.checkpointing import is_checkpointed
from agentcap.agents.literal import literal_messages
from agentcap.agents.prefix import shared_prompt_cache
from agentcap.parallel.sharding import is_sharded

Observation = dict[str, Any]

#: Per-token model inputs that grow with the sequence: completion tokens are text (type 0).
PER_TOKEN_KEYS = ("mm_token_type_ids", "token_type_ids")
#: Processor outputs that are bookkeeping, not model inputs.
NON_MODEL_KEYS = ("num_audio_tokens", "video_metadata")
#: Processor / tokenizer attributes that name media tokens (Qwen2-VL, Qwen3-VL, Qwen2-Audio, Omni).
MEDIA_TOKEN_ATTRS = (
    "image_token",
    "video_token",
    "audio_token",
    "vision_start_token",
    "vision_end_token",
    "vision_bos_token",
    "vision_eos_token",
    "audio_bos_token",
    "audio_eos_token",
)


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

    @cached_property
    def _forward_params(self) -> set[str]:
        return set(inspect.signature(self.model.forward).parameters)

    def prompt_text(self, messages: list[dict[str, str]]) -> str:
        """The prompt; the messages' texts are data, their special-token strings kept literal
        (``agentcap.agents.literal``)."""
        return self._render(literal_messages(messages, self.tokenizer))

    def _render(self, messages: list[dict[str, str]]) -> str:
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

    def prompt_cache(self, inputs: dict[str, Any]):
        """The KV cache of the batch's prompts (all but the last token), each distinct prompt
        computed once, for ``generate(past_key_values=…)``; None when no prompt repeats or the
        model's cache cannot be shared (``agents.prefix``)."""
        return shared_prompt_cache(self.model, inputs["attention_mask"], input_ids=inputs["input_ids"])

    # --- scoring ------------------------------------------------------------------------------
    def sequence_inputs(
        self, inputs: dict[str, Any], completion: torch.Tensor, completion_mask: torch.Tensor
    ) -> dict[str, Any]:
        """Model kwargs for prompt + completion in one forward, with explicit position ids."""
        ids = torch.cat([inputs["input_ids"], completion.to(inputs["input_ids"].device)], dim=1)
        mask = torch.cat([inputs["attention_mask"], completion_mask.to(inputs["attention_mask"])], dim=1)
        full = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        for key in PER_TOKEN_KEYS:
            if key in full:
                full[key] = torch.cat([full[key], full[key].new_zeros(completion.shape)], dim=1)
        full.update(input_ids=ids, attention_mask=mask)
        if "position_ids" in self._forward_params:
            full["position_ids"] = self.position_ids(full)
        return full

    def position_ids(self, full: dict[str, Any]) -> torch.Tensor:
        """Positions as ``generate`` assigns them: count only attended tokens (left padding)."""
        mask = full["attention_mask"]
        return (mask.long().cumsum(dim=1) - 1).clamp(min=0)

    def logits(
        self, inputs: dict[str, Any], completion: torch.Tensor, completion_mask: torch.Tensor, share_prompts: bool = False
    ):
        """Logits predicting each completion token: [N, T, V]. With ``share_prompts`` a prompt that
        repeats over rows is encoded once, with gradients, and its rows continue from its cache."""
        full = self.sequence_inputs(inputs, completion, completion_mask)
        t = completion.shape[1]
        if "logits_to_keep" in self._forward_params:
            full["logits_to_keep"] = t + 1  # the prompt's logits are never needed: saves [N, P, V]
        # a checkpointed layer's recompute would append to the cache a second time; a sharded (FSDP2)
        # block would run two forwards before one backward, which frees its gathered weights too early
        shared = share_prompts and not is_checkpointed(self.model) and not is_sharded(self.model)
        cache = self.prompt_cache(inputs) if shared else None
        if cache is not None:
            p = inputs["input_ids"].shape[1]
            rest = {k: v[:, p - 1 :] for k, v in full.items() if k in ("input_ids", "position_ids", *PER_TOKEN_KEYS)}
            full.update(rest, past_key_values=cache, use_cache=True)
        elif "use_cache" in self._forward_params:
            full["use_cache"] = False
        logits = self.model(**full).logits
        return logits[:, -(t + 1) : -1]


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

    def prompt_cache(self, inputs: dict[str, Any]):
        return self.model.prompt_cache(inputs["input_ids"], inputs["attention_mask"], inputs["media"])

    def logits(self, inputs: dict[str, Any], completion: torch.Tensor, completion_mask: torch.Tensor, share_prompts=False):
        ids = torch.cat([inputs["input_ids"], completion], dim=1)
        mask = torch.cat([inputs["attention_mask"], completion_mask], dim=1)
        logits = self.model(ids, mask, inputs["media"])
        p, t = inputs["input_ids"].shape[1], completion.shape[1]
        return logits[:, p - 1 : p + t - 1]


class ProcessorFamily(Family):
    """HF multimodal models whose processor expands media placeholders in the prompt text.

    Subclasses say, per observation, which placeholder text goes in front of the first user turn
    and which media go to the processor; the processor expands each placeholder to the right number
    of media tokens and returns the media tensors (``pixel_values_videos``, ``input_features``…),
    all passed straight to the model. Observations without media get no placeholder, so a batch
    may mix text-only and media observations.
    """

    #: Media placeholder and boundary token strings (set by each family from its processor).
    media_tokens: tuple[str, ...] = ()
    #: Config fields naming media placeholder and boundary tokens.
    MEDIA_TOKEN_FIELDS = (
        "image_token_id",
        "video_token_id",
        "audio_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "audio_start_token_id",
        "audio_end_token_id",
    )

    @cached_property
    def media_token_ids(self) -> list[int]:
        """Tokens the policy must never write: a sampled media placeholder has no features behind
        it, so the next forward over prompt + completion would fail (or misplace M-RoPE spans)."""
        config = self.model.config
        vocab = self.model.get_input_embeddings().num_embeddings
        ids = {getattr(config, field, None) for field in self.MEDIA_TOKEN_FIELDS}
        named = [getattr(o, a, None) for o in (self.processor, self.tokenizer) for a in MEDIA_TOKEN_ATTRS]
        tokens = {t for t in (*self.media_tokens, *named) if isinstance(t, str) and t}
        ids.update(self.tokenizer.convert_tokens_to_ids(sorted(tokens)))
        ids.discard(self.tokenizer.unk_token_id)
        return sorted(i for i in ids if isinstance(i, int) and 0 <= i < vocab)

    def generate(self, inputs: dict[str, Any], **kwargs) -> torch.Tensor:
        # Suppressed tokens get -inf only while sampling; the learner's log-probs are recomputed
        # from the full softmax, like every old log-prob, so sampler and learner still agree.
        if self.media_token_ids:
            kwargs.setdefault("suppress_tokens", self.media_token_ids)
        return super().generate(inputs, **kwargs)

    def prompt_cache(self, inputs: dict[str, Any]):
        """Not shared: the media features (``pixel_values_videos``, ``input_features``…) enter the
        embeddings inside the model's prefill, and the M-RoPE models keep the rope offsets that
        prefill computes; a cache made outside ``generate`` would leave its first step to merge
        the media into the last prompt token alone."""
        return None

    def placeholder(self, observation: Observation) -> str:
        raise NotImplementedError

    def processor_media(self, observations: list[Observation]) -> dict[str, Any]:
        """Keyword arguments for the processor call (media lists and their settings)."""
        raise NotImplementedError

    def prompt_text(self, messages: list[dict[str, str]], placeholder: str = "") -> str:
        messages = literal_messages(messages, self.tokenizer)  # data; the media placeholder stays special
        if placeholder:
            users = [m for m in messages if m["role"] == "user"]
            if not users:
                raise ValueError(f"{self.name} family: media need a user message to attach to")
            users[0]["content"] = placeholder + users[0]["content"]
        template = getattr(self.processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        if template:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, chat_template=template
            )
        return self._render(messages)

    def encode(self, observations: list[Observation]) -> dict[str, Any]:
        if self.processor is None:
            raise ValueError(f"the {self.name} family needs a processor (AutoProcessor of the model folder)")
        texts = [self.prompt_text(o["messages"], self.placeholder(o)) for o in observations]
        self.tokenizer.padding_side = "left"
        batch = self.processor(text=texts, return_tensors="pt", padding=True, **self.processor_media(observations))
        device = self.device
        return {
            k: v.to(device)
            for k, v in batch.items()
            if isinstance(v, torch.Tensor) and k not in NON_MODEL_KEYS
        }


def _token(processor, tokenizer, attr: str, default: str) -> str:
    """A media token as the model's own processor / tokenizer spells it."""
    for owner in (processor, tokenizer):
        value = getattr(owner, attr, None) if owner is not None else None
        if isinstance(value, str) and value:
            return value
    return default


class VisionFamily(ProcessorFamily):
    """Qwen2-VL / Qwen3-VL class: ``media["frames"]`` ([n, H, W, 3] uint8, a clip) as one video.

    ``frames_as="image"`` sends every frame as its own image instead (one placeholder each), for
    checkpoints tuned on images only. ``media["fps"]`` (default 2, Qwen's sampling rate) dates
    the frames; Qwen3-VL writes the timestamps into the prompt. Positions are M-RoPE (3 × [N, L]).
    """

    name = "vision"
    default_fps = 2.0

    def __init__(self, model, tokenizer, processor=None, frames_as: str = "video"):
        super().__init__(model, tokenizer, processor)
        if frames_as not in ("video", "image"):
            raise ValueError(f"frames_as must be 'video' or 'image', not {frames_as!r}")
        self.frames_as = frames_as
        start = _token(processor, tokenizer, "vision_start_token", "<|vision_start|>")
        end = _token(processor, tokenizer, "vision_end_token", "<|vision_end|>")
        image = _token(processor, tokenizer, "image_token", "<|image_pad|>")
        video = _token(processor, tokenizer, "video_token", "<|video_pad|>")
        self.media_tokens = (start, end, image, video)
        self.image_placeholder = start + image + end
        # Qwen3-VL's processor expands the video token to "<t seconds><|vision_start|>…<|vision_end|>"
        # per frame itself; wrapping it again would nest the vision markers.
        timestamped = hasattr(processor, "_calculate_timestamps")
        self.video_placeholder = video if timestamped else start + video + end

    @staticmethod
    def frames_of(observation: Observation) -> np.ndarray | None:
        frames = observation.get("media", {}).get("frames")
        if frames is None:
            return None
        frames = np.asarray(frames, dtype=np.uint8)
        if frames.ndim == 3:  # a single frame
            frames = frames[None]
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"media['frames'] must be uint8 [n, H, W, 3], got shape {frames.shape}")
        return frames

    def placeholder(self, observation: Observation) -> str:
        frames = self.frames_of(observation)
        if frames is None:
            return ""
        if self.frames_as == "image":
            return self.image_placeholder * len(frames)
        return self.video_placeholder

    def processor_media(self, observations: list[Observation]) -> dict[str, Any]:
        clips = [(self.frames_of(o), o.get("media", {})) for o in observations]
        clips = [(f, m) for f, m in clips if f is not None]
        if not clips:
            return {}
        if self.frames_as == "image":
            return {"images": [frame for frames, _ in clips for frame in frames]}
        temporal = int(getattr(getattr(self.processor, "video_processor", None), "temporal_patch_size", 2) or 1)
        videos, metadata = [], []
        for frames, media in clips:
            if len(frames) < temporal:  # a still: repeat it to fill one temporal patch
                frames = np.concatenate([frames] * temporal)[:temporal]
            fps = float(media.get("fps", self.default_fps))
            videos.append(frames)
            metadata.append(
                {
                    "total_num_frames": len(frames),
                    "fps": fps,
                    "frames_indices": list(range(len(frames))),
                    "duration": len(frames) / fps,
                    "height": int(frames.shape[1]),
                    "width": int(frames.shape[2]),
                }
            )
        # the clip's frames are already sampled: the processor must not resample them
        return {"videos": videos, "video_metadata": metadata, "do_sample_frames": False}

    def position_ids(self, full: dict[str, Any]) -> torch.Tensor:
        """M-RoPE positions from the model's own ``get_rope_index``, as ``generate`` builds them."""
        has_media = full.get("image_grid_thw") is not None or full.get("video_grid_thw") is not None
        if not has_media:  # text only: the three sections share the 1-D positions
            return super().position_ids(full).unsqueeze(0).expand(3, -1, -1)
        owner = self.model if hasattr(self.model, "get_rope_index") else self.model.model
        rope_index = owner.get_rope_index
        # every input the model's rope index reads (mm_token_type_ids, grids, Qwen2.5-VL's
        # second_per_grid_ts…), exactly as generate passes them
        wanted = set(inspect.signature(rope_index).parameters) - {"input_ids", "kwargs"}
        positions, _ = rope_index(full["input_ids"], **{k: v for k, v in full.items() if k in wanted})
        return positions


class AudioFamily(ProcessorFamily):
    """Qwen2-Audio / Qwen2.5-Omni thinker class: ``media["waveform"]`` through the feature extractor.

    The waveform is mono float32 at the feature extractor's rate (16 kHz); ``media["sample_rate"]``,
    when given, must match. Qwen2-Audio uses 1-D positions; the Omni thinker's M-RoPE positions
    come from its ``get_rope_index``.
    """

    name = "audio"

    def __init__(self, model, tokenizer, processor=None):
        super().__init__(model, tokenizer, processor)
        self.media_tokens = (
            _token(processor, tokenizer, "audio_bos_token", "<|audio_bos|>"),
            _token(processor, tokenizer, "audio_token", "<|AUDIO|>"),
            _token(processor, tokenizer, "audio_eos_token", "<|audio_eos|>"),
        )
        self.audio_placeholder = "".join(self.media_tokens)
        extractor = getattr(processor, "feature_extractor", None)
        self.sampling_rate = int(getattr(extractor, "sampling_rate", 16000))

    def waveform_of(self, observation: Observation) -> np.ndarray | None:
        media = observation.get("media", {})
        wave = media.get("waveform")
        if wave is None:
            return None
        rate = int(media.get("sample_rate", self.sampling_rate))
        if rate != self.sampling_rate:
            raise ValueError(f"waveform at {rate} Hz; this model's feature extractor expects {self.sampling_rate} Hz")
        wave = np.asarray(wave, dtype=np.float32)
        if wave.ndim != 1:
            raise ValueError(f"media['waveform'] must be mono [samples], got shape {wave.shape}")
        return wave

    def placeholder(self, observation: Observation) -> str:
        return self.audio_placeholder if self.waveform_of(observation) is not None else ""

    def processor_media(self, observations: list[Observation]) -> dict[str, Any]:
        waves = [w for w in (self.waveform_of(o) for o in observations) if w is not None]
        return {"audio": waves, "sampling_rate": self.sampling_rate} if waves else {}

    @property
    def uses_mrope(self) -> bool:
        return hasattr(self.model, "get_rope_index")

    def position_ids(self, full: dict[str, Any]) -> torch.Tensor:
        if not self.uses_mrope:
            return super().position_ids(full)
        mask = full["attention_mask"]
        feature_mask = full.get("feature_attention_mask")
        positions, _ = self.model.get_rope_index(
            full["input_ids"],
            image_grid_thw=full.get("image_grid_thw"),
            video_grid_thw=full.get("video_grid_thw"),
            attention_mask=mask,
            use_audio_in_video=False,
            audio_seqlens=feature_mask.sum(-1) if feature_mask is not None else None,
            second_per_grids=full.get("video_second_per_grid"),
        )
        # get_rope_index fills padding with 1; generate fills it with 0. Pads are masked, but keep
        # the two identical anyway.
        return positions.masked_fill(mask.unsqueeze(0) == 0, 0)


FAMILIES: dict[str, type[Family]] = {
    f.name: f for f in (Family, ToyFamily, VisionFamily, AudioFamily)
}
