"""Seconds of `agentcap --help`, `agentcap caption --help` and `agentcap fit --help` (best of N runs),
and the lines each prints: help must answer without importing torch or Lightning.

    python tools/bench_help.py [--runs 3]
    python tools/bench_help.py --smoke     # one run of `agentcap --help` (CI)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

AGENTCAP = os.path.join(os.path.dirname(sys.executable), "agentcap")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one run of `agentcap --help` only")
    args = parser.parse_args()
    commands = [["--help"], ["caption", "--help"], ["fit", "--help"], ["fit", "--help=full"]]
    if args.smoke:
        args.runs, commands = 1, commands[:1]
    for command in commands:
        times, lines = [], 0
        for _ in range(args.runs):
            start = time.perf_counter()
            out = subprocess.run([AGENTCAP, *command], capture_output=True, text=True, check=True).stdout
            times.append(time.perf_counter() - start)
            lines = len(out.splitlines())
        print(f"agentcap {' '.join(command):<16} {min(times):6.2f} s (best of {args.runs}), {lines} lines")


if __name__ == "__main__":
    main()
