"""Generate the toy soundscape world for AudioMap and ACE-Cap, offline and deterministic.

The generator is :mod:`agentcap_envs.toy.soundscapes`; this script is its command line.

    python tools/make_toy_soundscapes.py --out data/toy_soundscapes --seed 0
"""

from __future__ import annotations

import sys

from agentcap_envs.toy.soundscapes import main

if __name__ == "__main__":
    main(sys.argv[1:])
