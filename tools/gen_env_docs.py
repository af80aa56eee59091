"""Write docs/envs/<Name>.md from each registered agentcap environment's docstring.

The docstring is the single source (Description, Action, Observation, Rewards, Episode end,
Arguments, Version history), so the page can never drift from the code.
    python tools/gen_env_docs.py [--out docs/envs]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.commands.envs import env_page as page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/envs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for env_id in sorted(i for i in gym.registry if i.startswith("agentcap/")):
        path = out / (env_id.split("/")[1] + ".md")
        path.write_text(page(env_id))
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
