"""Generate the toy movie world for READ audio description (AD), offline and deterministic.

The generator is :mod:`agentcap_envs.toy.movie`; this script is its command line.

    python tools/make_toy_movie.py --out data/toy_movie --seed 0
"""

from __future__ import annotations

import sys

from agentcap_envs.toy.movie import main

if __name__ == "__main__":
    main(sys.argv[1:])
