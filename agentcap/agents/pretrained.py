"""Loading a pretrained causal LM from a local folder or a GGUF file: for agents, judges and tools.

No hub download is ever attempted: the folder must exist. A GGUF file is de-quantised at every
load and transformers refuses to save it, so a dense copy can be cached once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch


def load_causal_lm(
    path: str | os.PathLike,
    gguf_file: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    cache_dir: str | os.PathLike | None = None,
):
    """(model, tokenizer) from a local folder, optionally from a GGUF file inside it.

    A GGUF checkpoint is de-quantised at every load (tens of seconds on a CPU), and transformers
    refuses to ``save_pretrained`` a model loaded through its GGUF quantizer even when every weight
    is already dense. With ``cache_dir``, the dense model is saved there once (written to a
    temporary folder, then renamed, so concurrent first loads do not collide) and later loads read
    that copy in well under a second; a ``cache_dir`` belongs to one GGUF file (it is not checked
    against the source). Without ``gguf_file`` the folder is read as is. ``trust_remote_code``
    stays off.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(dtype, str) and dtype != "auto":  # "auto": the checkpoint's own dtype
        dtype = getattr(torch, dtype)
    dtype = dtype or torch.float32
    source = Path(path)
    if gguf_file is not None and cache_dir is not None and (Path(cache_dir) / "config.json").is_file():
        source, gguf_file = Path(cache_dir), None
    if not source.exists():
        raise FileNotFoundError(f"model folder {str(source)!r} not found (no hub download is attempted)")
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    if gguf_file and cache_dir is not None:
        _save_dense_copy(model, tokenizer, Path(cache_dir))
    return model.to(device).eval(), tokenizer


def _save_dense_copy(model, tokenizer, target: Path) -> None:
    packed = [type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()]
    if packed:  # weights still in GGUF blocks: there is no dense copy to write
        return
    # The weights are plain tensors; only the loader's bookkeeping marks the model as quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    except OSError:  # another process renamed its copy first; theirs is as good as ours
        shutil.rmtree(staging, ignore_errors=True)


def untied_copy(folder: str | Path, out: str | Path) -> Path:
    """``folder``'s model with its output head as a weight of its own (``tie_word_embeddings: false``,
    ``lm_head.weight`` a copy of the input embedding): the same function, and a model whose full
    weights a ``vllm serve`` can reload in place (its reload leaves a tied head behind). Returns ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    _save_dense_copy(model, AutoTokenizer.from_pretrained(folder), out)
    return out
