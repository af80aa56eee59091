"""Seconds of `agentcap --help`, `agentcap caption --help` and `agentcap fit --help` (best of N runs),
and the lines each prints: help must answer without importing torch or Lightning. Then Lightning's
own pages, `fit --help=full` and `fit --config configs/demo/audiomap.yaml --print_config`, before
(rendered by Lightning: AGENTCAP_PAGE_CACHE=0) and after (the kept page, agentcap.commands.pages),
the two interleaved run by run so that a machine's load weighs on both alike; wall and CPU seconds
(CPU is what a quiet machine's wall time comes near), and whether both printed the same bytes.

    python tools/bench_help.py [--runs 3]
    python tools/bench_help.py --smoke     # one run of `agentcap --help` (CI)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

AGENTCAP = os.path.join(os.path.dirname(sys.executable), "agentcap")
PAGES = [["fit", "--help=full"], ["fit", "--config", "configs/demo/audiomap.yaml", "--print_config"]]


def timed(command: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run([AGENTCAP, *command], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}).stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one run of `agentcap --help` only")
    args = parser.parse_args()
    commands = [["--help"], ["caption", "--help"], ["fit", "--help"]]
    if args.smoke:
        args.runs, commands = 1, commands[:1]
    for command in commands:
        times, lines = [], 0
        for _ in range(args.runs):
            wall, _, out = timed(command)
            times.append(wall)
            lines = len(out.splitlines())
        print(f"agentcap {' '.join(command):<16} {min(times):6.2f} s (best of {args.runs}), {lines} lines")
    if args.smoke:
        return
    with tempfile.TemporaryDirectory() as cache:
        kept = {"AGENTCAP_CACHE": cache}
        for command in PAGES:
            timed(command, kept)  # the first run renders and keeps the page
            rows = {"before": [], "after": []}
            pages = {}
            for _ in range(args.runs):
                for label, env in (("before", {"AGENTCAP_PAGE_CACHE": "0"}), ("after", kept)):
                    wall, cpu, pages[label] = timed(command, env)
                    rows[label].append((wall, cpu))
            same = "same page" if pages["before"] == pages["after"] else "PAGES DIFFER"
            (wb, cb), (wa, ca) = (min(rows[k]) for k in ("before", "after"))
            print(f"agentcap {' '.join(command)}: before {wb:.2f} s wall / {cb:.2f} s CPU, after {wa:.2f} s wall / "
                  f"{ca:.2f} s CPU (best of {args.runs}; wall {wb / wa:.0f}x, CPU {cb / max(ca, 1e-3):.0f}x), "
                  f"{len(pages['after'].splitlines())} lines, {same}")


if __name__ == "__main__":
    main()
