"""The tiny media language model of the offline demos.

A real HF causal LM (Llama class, tiny config) reads a prefix of media embeddings followed by the
chat prompt. The media encoder is either a projector over precomputed clip features (toy movie,
READ) or a torchaudio mel front end with a small strided convolution encoder (toy soundscapes).
Audio is encoded at a fixed frame rate, so a prefix position is a point in time and a caption's
timestamps are learnable. Every row of a batch is laid out ``[pad…][media][prompt][completion]`` so
position ids are the same under generation and under the training forward pass.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Literal

import torch
import torch.nn as nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutput

from agentcap.agents.prefix import shared_prompt_cache

LOG_MEL_SHIFT, LOG_MEL_SCALE = 5.5, 2.0
#: The observation media field each encoder reads; a row without it is text only.
MEDIA_KEYS = {"features": "features", "audio": "waveform"}


@dataclass
class ToyConfig:
    vocab_size: int
    media: Literal["features", "audio", "none"] = "features"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    feature_dim: int = 32
    sample_rate: int = 16000
    n_mels: int = 32
    tokens_per_second: float = 4.0
    max_positions: int = 1024
    pad_token_id: int = 0
    eos_token_id: int = 1
    bos_token_id: int = 2


class ToyMediaLM(nn.Module):
    """Media encoder → prefix embeddings → tiny Llama (see module docstring)."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.lm = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=config.vocab_size,
                hidden_size=h,
                intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_layers,
                num_attention_heads=config.num_heads,
                num_key_value_heads=config.num_heads,
                max_position_embeddings=config.max_positions,
                pad_token_id=config.pad_token_id,
                eos_token_id=config.eos_token_id,
                bos_token_id=config.bos_token_id,
                tie_word_embeddings=True,
            )
        )
        if config.media == "features":
            self.encoder = nn.Sequential(nn.Linear(config.feature_dim, h), nn.GELU(), nn.Linear(h, h))
        elif config.media == "audio":
            import torchaudio

            hop = 160  # 10 ms frames at 16 kHz
            self.mel = torchaudio.transforms.MelSpectrogram(
                sample_rate=config.sample_rate, n_fft=400, hop_length=hop, n_mels=config.n_mels
            )
            self.stride = max(1, round(config.sample_rate / hop / config.tokens_per_second))
            self.encoder = nn.Sequential(
                nn.Conv1d(config.n_mels, h, kernel_size=3, padding=1),
                nn.GELU(),
                nn.Conv1d(h, h, kernel_size=self.stride, stride=self.stride),
                nn.GELU(),
            )
            self.frame_norm = nn.LayerNorm(h)
            # small, like the LM's own embeddings: an N(0, 1) table would drown the audio features
            self.frame_position = nn.Embedding(256, h)
            nn.init.normal_(self.frame_position.weight, std=0.02)
        self.generation_config = self.lm.generation_config

    # --- media ----------------------------------------------------------------------------------
    def encode_media(self, media: list[dict]) -> list[torch.Tensor]:
        """One [P_i, H] prefix per row, encoded in one batch.

        A row whose media lack this model's input (a text-only task: ``media == {}``) gets P_i = 0,
        so the default toy agent (``media: features``) trains on prompt text alone.
        """
        device = self.lm.get_input_embeddings().weight.device
        prefixes = [torch.zeros(0, self.config.hidden_size, device=device) for _ in media]
        key = MEDIA_KEYS.get(self.config.media)
        rows = [i for i, m in enumerate(media) if key is not None and key in m]
        if rows:
            encode = self._encode_features if self.config.media == "features" else self._encode_audio
            for i, prefix in zip(rows, encode([media[i] for i in rows])):
                prefixes[i] = prefix
        return prefixes

    def _encode_features(self, media: list[dict]) -> list[torch.Tensor]:
        device = self.lm.get_input_embeddings().weight.device
        feats = [torch.as_tensor(m["features"], dtype=torch.float32) for m in media]  # [frames_i, D]
        lengths = [f.shape[0] for f in feats]
        z = self.encoder(nn.utils.rnn.pad_sequence(feats, batch_first=True).to(device))  # [B, F, H]
        return [z[i, :n] for i, n in enumerate(lengths)]

    def _encode_audio(self, media: list[dict]) -> list[torch.Tensor]:
        device = self.lm.get_input_embeddings().weight.device
        # the mel front end runs per clip (its edge padding must not see a neighbour's zeros); the
        # encoder runs on the zero-padded batch, which equals per-clip zero padding of its convolutions
        mels = [self.log_mel(torch.as_tensor(m["waveform"], dtype=torch.float32, device=device)) for m in media]
        batch = nn.utils.rnn.pad_sequence(mels, batch_first=True).transpose(1, 2)  # [B, n_mels, frames]
        z = self.encoder(batch).transpose(1, 2)[:, : self.frame_position.num_embeddings]  # [B, P, H]
        z = self.frame_norm(z) + self.frame_position(torch.arange(z.shape[1], device=device))
        return [z[i, : max(1, min(z.shape[1], m.shape[0] // self.stride))] for i, m in enumerate(mels)]

    def log_mel(self, waveform: torch.Tensor) -> torch.Tensor:
        """[frames, n_mels] log-mel, shifted and scaled to about zero mean and unit spread.

        Raw log power of 16-bit-level audio sits near -5.5 ± 2 (measured on the toy soundscapes);
        fed as is, the first convolution starts saturated and the LM learns to ignore the prefix.
        A fixed affine map (not a per-clip norm) keeps loudness, which captions must report.
        """
        return ((torch.log(self.mel(waveform) + 1e-5) + LOG_MEL_SHIFT) / LOG_MEL_SCALE).T

    def _layout(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: list[dict]):
        """``[pad][media][tokens]`` embeddings, mask and position ids.

        Only the *leading* padding of a row (the left-padded prompt) moves in front of the media;
        trailing padding (a right-padded completion) stays where it is, masked.
        """
        embed = self.lm.get_input_embeddings()
        tokens = embed(input_ids)  # [B, L, H]
        prefixes = self.encode_media(media)
        length = input_ids.shape[1]
        leading = [int(attention_mask[i].argmax()) if attention_mask[i].any() else length for i in range(len(prefixes))]
        total = max(max(p.shape[0] + length - l for p, l in zip(prefixes, leading)), length)
        h = tokens.shape[-1]
        rows, masks = [], []
        for i, (prefix, lead) in enumerate(zip(prefixes, leading)):
            pad = total - prefix.shape[0] - (length - lead)
            rows.append(torch.cat([tokens.new_zeros(pad, h), prefix.to(tokens.dtype), tokens[i, lead:]]))
            masks.append(
                torch.cat(
                    [
                        attention_mask.new_zeros(pad),
                        attention_mask.new_ones(prefix.shape[0]),
                        attention_mask[i, lead:],
                    ]
                )
            )
        inputs_embeds, mask = torch.stack(rows), torch.stack(masks)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        return inputs_embeds, mask, positions

    # --- the two calls the Agent makes ----------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: list[dict]) -> torch.Tensor:
        """Logits over the token part of the sequence, aligned with ``input_ids``: [B, L, V]."""
        embeds, mask, positions = self._layout(input_ids, attention_mask, media)
        logits = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).logits
        # tokens sit right-aligned in every row, so the last L positions are the token positions
        return logits[:, -input_ids.shape[1] :]

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: list[dict], **kwargs):
        embeds, mask, _ = self._layout(input_ids, attention_mask, media)
        return self.lm.generate(inputs_embeds=embeds, attention_mask=mask, **kwargs)

    @torch.no_grad()
    def prompt_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: list[dict]):
        """The LM's KV cache of each distinct laid-out prompt (same media, same tokens), computed once,
        for ``generate(..., past_key_values=…)`` (``agentcap.agents.prefix``)."""
        embeds, mask, _ = self._layout(input_ids, attention_mask, media)
        return shared_prompt_cache(self.lm, mask, inputs_embeds=embeds)

    # --- persistence ----------------------------------------------------------------------------
    def save_pretrained(self, path: str, **kwargs) -> None:
        """A Hugging Face model folder (``config.json`` of model type ``agentcap_toy_media``,
        ``model.safetensors``) that ``AutoModelForCausalLM`` loads once this module is imported
        (it registers :class:`ToyMediaForCausalLM`), or with ``trust_remote_code=True`` through the
        folder's ``modeling_agentcap_toy.py``; plus ``toy_config.json``, by which agentcap's own
        loader knows the folder."""
        os.makedirs(path, exist_ok=True)
        ToyMediaForCausalLM(ToyMediaConfig.from_toy(self.config), toy=self).save_pretrained(path, **kwargs)
        with open(os.path.join(path, REMOTE_CODE + ".py"), "w") as handle:
            handle.write(f'"""agentcap\'s toy media LM for `trust_remote_code=True` (needs agentcap importable)."""\n'
                         "from agentcap.agents.toy import ToyMediaConfig, ToyMediaForCausalLM  # noqa: F401\n")
        with open(os.path.join(path, "toy_config.json"), "w") as handle:
            json.dump(asdict(self.config), handle, indent=1)

    @classmethod
    def from_pretrained(cls, path: str) -> "ToyMediaLM":
        if not os.path.isfile(os.path.join(path, "config.json")):  # the earlier format: toy_model.pt
            with open(os.path.join(path, "toy_config.json")) as handle:
                model = cls(ToyConfig(**json.load(handle)))
            state = torch.load(os.path.join(path, "toy_model.pt"), weights_only=True, map_location="cpu")
            model.load_state_dict(state)
            return model
        return ToyMediaForCausalLM.from_pretrained(path).toy


# --- the Hugging Face face of the toy model ----------------------------------------------------------
#: The module an exported folder carries for ``trust_remote_code=True`` (``auto_map``).
REMOTE_CODE = "modeling_agentcap_toy"


class ToyMediaConfig(PretrainedConfig):
    """:class:`ToyConfig` as a ``PretrainedConfig`` (model type ``agentcap_toy_media``)."""

    model_type = "agentcap_toy_media"

    def __init__(self, vocab_size: int = 32, **kwargs):
        toy = {f.name: kwargs.pop(f.name, f.default) for f in fields(ToyConfig) if f.name != "vocab_size"}
        self.vocab_size = vocab_size
        for key, value in toy.items():
            setattr(self, key, value)
        kwargs.setdefault("tie_word_embeddings", True)
        kwargs.setdefault("auto_map", {"AutoConfig": f"{REMOTE_CODE}.ToyMediaConfig",
                                       "AutoModelForCausalLM": f"{REMOTE_CODE}.ToyMediaForCausalLM"})
        super().__init__(**{k: toy[k] for k in ("pad_token_id", "eos_token_id", "bos_token_id")}, **kwargs)

    @classmethod
    def from_toy(cls, config: ToyConfig) -> "ToyMediaConfig":
        return cls(**asdict(config))

    def toy_config(self) -> ToyConfig:
        return ToyConfig(**{f.name: getattr(self, f.name) for f in fields(ToyConfig)})


class ToyMediaForCausalLM(PreTrainedModel):
    """A :class:`ToyMediaLM` (``self.toy``) as a ``PreTrainedModel``: ``save_pretrained`` /
    ``from_pretrained``, ``forward(input_ids, attention_mask, media=None)`` → logits and
    ``generate(input_ids, attention_mask=None, media=None, **generate_kwargs)`` → the new tokens;
    ``media`` is one dict per row (``{"features": [F, D]}`` or ``{"waveform": [T]}``), none: text only.
    Wrapping leaves the toy's weights as they are (no re-initialisation)."""

    config_class = ToyMediaConfig
    base_model_prefix = "toy"
    main_input_name = "input_ids"

    def __init__(self, config: ToyMediaConfig, toy: ToyMediaLM | None = None):
        super().__init__(config)
        if toy is None:
            with torch.device("cpu"):  # torchaudio's mel filterbank cannot be built on the meta device
                toy = ToyMediaLM(config.toy_config())
        self.toy = toy
        self.post_init()
        self.all_tied_weights_keys.update(
            {f"toy.lm.{k}": f"toy.lm.{v}" for k, v in getattr(self.toy.lm, "all_tied_weights_keys", {}).items()})

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: the toy's own initialisation stays, so wrapping a model never changes it (a
        loaded folder's rotary tables are rebuilt by :meth:`from_pretrained`)."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> "ToyMediaForCausalLM":
        model = super().from_pretrained(*args, **kwargs)
        with torch.no_grad():  # non-persistent buffers are in no file: computed as the toy's __init__ does
            for module in model.modules():
                if hasattr(module, "original_inv_freq") and hasattr(module, "compute_default_rope_parameters"):
                    inv_freq, _ = module.compute_default_rope_parameters(module.config)
                    module.inv_freq.copy_(inv_freq)
                    module.original_inv_freq.copy_(inv_freq)
        return model

    def _media(self, input_ids: torch.Tensor, media: list[dict] | None) -> list[dict]:
        return list(media) if media is not None else [{} for _ in range(input_ids.shape[0])]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                media: list[dict] | None = None, **kwargs) -> CausalLMOutput:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return CausalLMOutput(logits=self.toy(input_ids, mask, self._media(input_ids, media)))

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 media: list[dict] | None = None, **kwargs) -> torch.Tensor:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return self.toy.generate(input_ids, mask, self._media(input_ids, media), **kwargs)


AutoConfig.register(ToyMediaConfig.model_type, ToyMediaConfig, exist_ok=True)
AutoModelForCausalLM.register(ToyMediaConfig, ToyMediaForCausalLM, exist_ok=True)


