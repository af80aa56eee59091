"""Build a validated cloze bank (AudioMap ESR, ACE-Cap G2P) from (audio, gold caption) pairs.

The same as ``agentcap data bank`` (:mod:`agentcap.commands.bank`; writers and validation in
:mod:`agentcap.data.question_bank`), for a checkout without the ``agentcap`` command installed.

    python tools/build_cloze_bank.py --manifest train.jsonl --out bank.jsonl --writer rule
"""

from __future__ import annotations

import sys

from agentcap.commands.bank import bank_command

if __name__ == "__main__":
    raise SystemExit(bank_command(sys.argv[1:]))
