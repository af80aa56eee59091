"""Held-out figures of a demo over seeds, with 95 % confidence intervals.

The statistics are :mod:`agentcap.evaluation.seeds`; this script is its command line (``tools/seeds.sh``).

    python tools/seed_stats.py read 5 6 7 --pairs before_grpo:after_grpo
"""

from __future__ import annotations

import sys

from agentcap.evaluation.seeds import main

if __name__ == "__main__":
    main(sys.argv[1:])
