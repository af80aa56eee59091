"""Rewrite the recipe sections of docs/memory-plan.md with what `agentcap plan` prints for each.

The command is the single source: each `## configs/<recipe>.yaml` section is its output verbatim
(tests/test_plan.py checks it); the prose above the first section is kept as written.
    python tools/gen_memory_plan.py
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from agentcap.commands.plan import plan_command

ROOT = Path(__file__).resolve().parents[1]
#: (recipe, extra arguments, what the heading adds): the paper recipes as written, then ACE-Cap with its
#: engines as `vllm serve` processes on GPUs of their own (one per trainer rank and role)
RECIPES = (("read", (), ""), ("audiomap", (), ""), ("acecap", (), ""),
           ("acecap", ("--serve-rollouts", "--rollout-gpus", "24"), ", rollouts on their own GPUs"))
MARK = "\n## configs/"


def section(name: str, extra: tuple[str, ...] = (), title: str = "") -> str:
    args = ["--config", f"configs/{name}.yaml", "--root", "tools/plan_models", *extra]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = plan_command(args)
    if code != 0:
        raise SystemExit(f"agentcap plan {' '.join(args)} exited {code}")
    return f"## configs/{name}.yaml{title}\n\n```\n$ agentcap plan {' '.join(args)}\n```\n\n{out.getvalue()}"


def main() -> int:
    os.chdir(ROOT)  # the command's output names the config as given: configs/<recipe>.yaml
    path = ROOT / "docs" / "memory-plan.md"
    prose = path.read_text().split(MARK)[0].rstrip("\n")
    path.write_text(prose + "\n\n" + "\n".join(section(*recipe) for recipe in RECIPES))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
