"""Build a validated cloze bank (AudioMap ESR, ACE-Cap G2P) from (audio, gold caption) pairs.

The writers and the validation are :mod:`agentcap.data.question_bank`; this script is its command line.

    python tools/build_cloze_bank.py --input train.jsonl --out bank.jsonl --rejected rejected.jsonl --rule
"""

from __future__ import annotations

from agentcap.data.question_bank import main

if __name__ == "__main__":
    main()
