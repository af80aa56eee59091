"""Tiny random models of the real architecture classes, with real processors, built offline.

No hub is reachable, so tests and demos cannot download a checkpoint; these builders make the real
HF classes (``Qwen2VLForConditionalGeneration``, ``Qwen2AudioForConditionalGeneration``, …) from
tiny configs (hidden 64, two layers, one-layer towers) and the real processor classes around a
word-level tokenizer that has the model's special tokens, with the token ids written into the
model config. Every code path (chat template, placeholder expansion, M-RoPE, feature extraction,
generate) is therefore the one a pretrained checkpoint takes; only the weights are random.

``build_tiny(kind, …)`` gives the parts (this module knows nothing of agents);
``AgentConfig(tiny={"kind": "qwen2_vl"})`` builds an agent through it (the demo configs), and the
tests wrap the parts in an agent directly (``tests/tiny_agents.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentcap.agents.tokenizer import build_word_tokenizer

#: Words every tiny vocabulary has, so demo prompts and captions are not all ``<unk>``.
BASE_TEXT = (
    "describe the clip . describe the sound . caption : what happens ? a dog barks while rain falls on "
    "a car ; people talk and walk , music plays , an engine starts , a siren wails , birds sing . "
    "the man the woman opens door looks at"
)
#: Qwen3-VL writes frame timestamps ("<1.5 seconds>") into the prompt.
TIMESTAMP_WORDS = ("<", ">", "seconds", *(f"{i / 10:.1f}" for i in range(100)))

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
#: M-RoPE splits head_dim / 2 = 8 rotary frequencies into (time, height, width) sections.
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}
#: Tiny clips: frames are resized to 56 × 56 at least (4 × 4 patches of 14 → 4 tokens a frame pair).
VISION_PIXELS = dict(min_pixels=56 * 56, max_pixels=112 * 112)

QWEN_VL_TOKENS = {
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
}
QWEN_AUDIO_TOKENS = {"audio_bos_token": "<|audio_bos|>", "audio_token": "<|AUDIO|>", "audio_eos_token": "<|audio_eos|>"}
OMNI_TOKENS = {
    **QWEN_AUDIO_TOKENS,
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}


@dataclass
class TinyParts:
    """What an :class:`agentcap.agents.Agent` is made of."""

    model: torch.nn.Module
    tokenizer: Any
    processor: Any
    family: str


def tiny_tokenizer(
    texts: Iterable[str] = (),
    special_tokens: dict[str, str] | None = None,
    tokenizer=None,
    extra_words: Iterable[str] = (),
):
    """A word-level tokenizer (or ``tokenizer``) with the model's named special tokens added.

    The tokens become added special tokens (never split, skipped when decoding) and named
    attributes (``tokenizer.image_token``…), which is how the real processors find them.
    """
    if tokenizer is None:
        tokenizer = build_word_tokenizer([BASE_TEXT, *texts], extra_tokens=extra_words)
    special_tokens = dict(special_tokens or {})
    if special_tokens:
        tokenizer.add_tokens(list(dict.fromkeys(special_tokens.values())), special_tokens=True)
        tokenizer._set_model_specific_special_tokens(special_tokens)
    tokenizer.padding_side = "left"
    return tokenizer


def _ids(tokenizer, **tokens: str) -> dict[str, int]:
    return {name: tokenizer.convert_tokens_to_ids(token) for name, token in tokens.items()}


def _special_ids(tokenizer) -> dict[str, int]:
    return dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )


def _text_config(tokenizer, overrides: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    return {**TEXT, "vocab_size": len(tokenizer), **_special_ids(tokenizer), **fields, **(overrides or {})}


def _seeded(seed: int, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Build under a fixed seed without disturbing the caller's random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make()
    return model.eval()


def _finish(model: torch.nn.Module, tokenizer) -> torch.nn.Module:
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    return model


# --- plain causal LMs ---------------------------------------------------------------------------
CAUSAL_KINDS = ("qwen2", "qwen3", "llama", "gpt2")


def _causal(kind: str, tokenizer, text: dict[str, Any] | None, seed: int) -> TinyParts:
    import transformers

    if kind == "gpt2":
        fields = dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024, vocab_size=len(tokenizer))
        fields.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **_special_ids(tokenizer))  # no dropout, as Qwen
        config = transformers.GPT2Config(**{**fields, **(text or {})})
        cls = transformers.GPT2LMHeadModel
    elif kind in ("qwen2", "qwen3", "llama"):
        extra = {"head_dim": 16} if kind == "qwen3" else {}
        name = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[kind]
        fields = _text_config(tokenizer, text, max_position_embeddings=4096, **extra)
        config = getattr(transformers, f"{name}Config")(**fields)
        cls = getattr(transformers, f"{name}ForCausalLM")
    else:
        raise ValueError(f"unknown causal LM kind {kind!r}; one of {CAUSAL_KINDS}")
    model = _seeded(seed, lambda: cls(config))
    return TinyParts(_finish(model, tokenizer), tokenizer, None, "causal_lm")


# --- vision LMs ---------------------------------------------------------------------------------
def _qwen2_vl(tokenizer, text: dict[str, Any] | None, seed: int) -> TinyParts:
    import transformers

    tokenizer = tiny_tokenizer(special_tokens=QWEN_VL_TOKENS, tokenizer=tokenizer)
    processor = transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**VISION_PIXELS),
        video_processor=transformers.Qwen2VLVideoProcessor(
            size={"shortest_edge": 56 * 56, "longest_edge": 4 * 112 * 112}, cap_pixels_per_frame=False
        ),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    hidden = (text or {}).get("hidden_size", TEXT["hidden_size"])
    config = transformers.Qwen2VLConfig(
        text_config=_text_config(tokenizer, text, rope_parameters=dict(MROPE), max_position_embeddings=4096),
        # the merger projects vision patches straight to the LM's width
        vision_config=dict(depth=1, embed_dim=32, hidden_size=hidden, num_heads=2, mlp_ratio=2),
        **_vl_ids(tokenizer),
    )
    model = _seeded(seed, lambda: transformers.Qwen2VLForConditionalGeneration(config))
    return TinyParts(_finish(model, tokenizer), tokenizer, processor, "vision")


def _vl_ids(tokenizer) -> dict[str, int]:
    """The vision token ids both Qwen-VL configs need, read from the tokenizer."""
    return _ids(
        tokenizer,
        image_token_id=QWEN_VL_TOKENS["image_token"],
        video_token_id=QWEN_VL_TOKENS["video_token"],
        vision_start_token_id=QWEN_VL_TOKENS["vision_start_token"],
        vision_end_token_id=QWEN_VL_TOKENS["vision_end_token"],
    )


def _qwen3_vl(tokenizer, text: dict[str, Any] | None, seed: int) -> TinyParts:
    import transformers

    if tokenizer is None:
        tokenizer = tiny_tokenizer(extra_words=TIMESTAMP_WORDS)
    tokenizer = tiny_tokenizer(special_tokens=QWEN_VL_TOKENS, tokenizer=tokenizer)
    processor = transformers.Qwen3VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(
            patch_size=16, min_pixels=64 * 64, max_pixels=128 * 128, image_mean=[0.5] * 3, image_std=[0.5] * 3
        ),
        video_processor=transformers.Qwen3VLVideoProcessor(
            # Qwen3-VL's bounds are on frames × pixels: 4 frames of ≥ 64 × 64 (2 × 2 tokens each)
            size={"shortest_edge": 4 * 64 * 64, "longest_edge": 8 * 128 * 128},
            cap_pixels_per_frame=False,
        ),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    hidden = (text or {}).get("hidden_size", TEXT["hidden_size"])
    config = transformers.Qwen3VLConfig(
        text_config=_text_config(
            tokenizer,
            text,
            head_dim=16,
            rope_parameters={**MROPE, "mrope_interleaved": True},
            max_position_embeddings=4096,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=16,
            out_hidden_size=hidden,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        **_vl_ids(tokenizer),
    )
    model = _seeded(seed, lambda: transformers.Qwen3VLForConditionalGeneration(config))
    return TinyParts(_finish(model, tokenizer), tokenizer, processor, "vision")


# --- audio LMs ----------------------------------------------------------------------------------
#: 80 mel bins, 10 ms hop; Qwen2-Audio pads every clip to ``chunk_length`` seconds (real: 30).
def _feature_extractor(chunk_length: int):
    import transformers

    return transformers.WhisperFeatureExtractor(
        feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=chunk_length, n_fft=400
    )


AUDIO_TOWER = dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=80)


def _qwen2_audio(tokenizer, text: dict[str, Any] | None, seed: int, chunk_length: int = 4) -> TinyParts:
    import transformers

    tokenizer = tiny_tokenizer(special_tokens=QWEN_AUDIO_TOKENS, tokenizer=tokenizer)
    extractor = _feature_extractor(chunk_length)
    processor = transformers.Qwen2AudioProcessor(
        feature_extractor=extractor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
    )
    config = transformers.Qwen2AudioConfig(
        # the encoder takes exactly chunk_length seconds of mel frames: 2 frames per source position
        audio_config=dict(
            model_type="qwen2_audio_encoder", max_source_positions=extractor.nb_max_frames // 2, **AUDIO_TOWER
        ),
        text_config=_text_config(tokenizer, text, model_type="qwen2", max_position_embeddings=4096),
        audio_token_index=tokenizer.convert_tokens_to_ids(QWEN_AUDIO_TOKENS["audio_token"]),
    )
    model = _seeded(seed, lambda: transformers.Qwen2AudioForConditionalGeneration(config))
    return TinyParts(_finish(model, tokenizer), tokenizer, processor, "audio")


def _qwen25_omni_thinker(tokenizer, text: dict[str, Any] | None, seed: int, chunk_length: int = 4) -> TinyParts:
    import transformers

    tokenizer = tiny_tokenizer(special_tokens=OMNI_TOKENS, tokenizer=tokenizer)
    processor = transformers.Qwen2_5OmniProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**VISION_PIXELS),
        video_processor=transformers.Qwen2VLVideoProcessor(
            size={"shortest_edge": 56 * 56, "longest_edge": 4 * 112 * 112}, cap_pixels_per_frame=False
        ),
        feature_extractor=_feature_extractor(chunk_length),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    hidden = (text or {}).get("hidden_size", TEXT["hidden_size"])
    config = transformers.Qwen2_5OmniThinkerConfig(
        audio_config=dict(max_source_positions=100, n_window=50, output_dim=hidden, **AUDIO_TOWER),
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=hidden,
            fullatt_block_indexes=[0],
        ),
        text_config=_text_config(tokenizer, text, rope_parameters=dict(MROPE), max_position_embeddings=4096),
        **_ids(
            tokenizer,
            audio_token_index=OMNI_TOKENS["audio_token"],
            image_token_index=OMNI_TOKENS["image_token"],
            video_token_index=OMNI_TOKENS["video_token"],
            audio_start_token_id=OMNI_TOKENS["audio_bos_token"],
            audio_end_token_id=OMNI_TOKENS["audio_eos_token"],
            # read by the thinker's get_rope_index though the thinker config does not declare it
            vision_start_token_id=OMNI_TOKENS["vision_bos_token"],
        ),
    )
    model = _seeded(seed, lambda: transformers.Qwen2_5OmniThinkerForConditionalGeneration(config))
    return TinyParts(_finish(model, tokenizer), tokenizer, processor, "audio")


MULTIMODAL_BUILDERS: dict[str, Callable[..., TinyParts]] = {
    "qwen2_vl": _qwen2_vl,
    "qwen3_vl": _qwen3_vl,
    "qwen2_audio": _qwen2_audio,
    "qwen2_5_omni_thinker": _qwen25_omni_thinker,
}
TINY_KINDS = (*CAUSAL_KINDS, *MULTIMODAL_BUILDERS)


def build_tiny(
    kind: str, tokenizer=None, texts: Sequence[str] = (), seed: int = 0, text: dict[str, Any] | None = None
) -> TinyParts:
    """A tiny random model of ``kind`` (see :data:`TINY_KINDS`) with its tokenizer and processor.

    Args:
        kind: architecture; the multimodal kinds get their real processor class.
        tokenizer: a word tokenizer to extend (the special tokens are added to it); by default one
            is built from :data:`BASE_TEXT` plus ``texts``.
        texts: extra texts whose words join the vocabulary.
        seed: weight initialisation seed (the global RNG is left untouched).
        text: overrides of the language model's config fields (``num_hidden_layers``…).
    """
    if tokenizer is None and texts:
        tokenizer = tiny_tokenizer(texts, extra_words=TIMESTAMP_WORDS if kind == "qwen3_vl" else ())
    if kind in CAUSAL_KINDS:
        return _causal(kind, tiny_tokenizer(tokenizer=tokenizer), text, seed)
    if kind not in MULTIMODAL_BUILDERS:
        raise ValueError(f"unknown tiny model kind {kind!r}; one of {TINY_KINDS}")
    return MULTIMODAL_BUILDERS[kind](tokenizer, text, seed)
