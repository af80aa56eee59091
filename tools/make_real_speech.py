"""Build the real-speech world (Asterisk voice prompts + freedesktop sound effects) for AudioMap and
ACE-Cap, offline and deterministic.

The generator is :mod:`agentcap_envs.real.speech`; this script is its command line. The recordings
come from Debian packages that ``tools/setup.sh`` unpacks into ``.assets/``.

    python tools/make_real_speech.py --out data/real_speech --seed 0
    python tools/make_real_speech.py --out /tmp/real_small --max-clips 20     # a few seconds
"""

from __future__ import annotations

import sys

from agentcap_envs.real.speech import main

if __name__ == "__main__":
    main(sys.argv[1:])
