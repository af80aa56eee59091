"""Re-save a GGUF checkpoint as a plain Hugging Face folder (safetensors + tokenizer).

The conversion is :mod:`agentcap.agents.gguf`; this script is its command line.

    python tools/resave_gguf.py --out runs/models/smollm2-135m-instruct
"""

from __future__ import annotations

from agentcap.agents.gguf import main

if __name__ == "__main__":
    main()
