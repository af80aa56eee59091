"""Write docs/envs/<Name>.md from each registered agentcap environment's docstring.

The docstring is the single source (Description, Action, Observation, Rewards, Episode end,
Arguments, Version history), so the page can never drift from the code.
    python tools/gen_env_docs.py [--out docs/envs]
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

import agentcap_envs  # noqa: F401  (registers the built-in environments)


def page(env_id: str) -> str:
    spec = gym.registry[env_id]
    cls = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    doc = inspect.cleandoc(cls.__doc__ or "")
    title, _, body = doc.partition("\n")
    return f"# {env_id}\n\n*{title.strip()}* — `{spec.entry_point}`\n\n```python\nenv = gymnasium.make(\"{env_id}\", ...)\n```\n{body}\n"


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
