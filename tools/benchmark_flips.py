"""Which benchmark questions a recipe's training could move, and which it did: question by question.

A benchmark mean over a few dozen questions moves by one question at a time; whether a recipe *can*
raise it depends on how many questions its captions ever get right. For runs of several seeds this
reads each stage's ``benchmarks/<stage>/benchmark_items.jsonl`` and prints, per category: the
questions no stage of any seed answered (out of reach of these captions), the questions that
flipped right / wrong between two stages (summed over seeds), and how the wrong answers of the
later stage split between the judge choosing no letter (the caption holds no evidence for any
choice) and a wrong letter.

    python tools/benchmark_flips.py runs/real/v5/acecap-demo-s1{2,3,4} --before S1 --after S5
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agentcap.evaluation.items import read_benchmark_rows  # noqa: E402


def benchmark_rows(run: str, stage: str) -> dict[str, dict]:
    """Question id -> the stage's benchmark item row (``correct``, ``letter``, ``category``…)."""
    rows = read_benchmark_rows(run, stage)
    if not rows:
        raise FileNotFoundError(f"{run}/benchmarks/{stage}/benchmark_items.jsonl: stage {stage!r} asked no benchmark")
    return rows


def stages_of(run: str) -> list[str]:
    """The stages that asked the benchmark, in name order."""
    folder = os.path.join(run, "benchmarks")
    return sorted(s for s in os.listdir(folder) if os.path.isfile(os.path.join(folder, s, "benchmark_items.jsonl")))


def report(runs: Sequence[str], before: str, after: str) -> str:
    every = {run: {stage: benchmark_rows(run, stage) for stage in {*stages_of(run), before, after}} for run in runs}
    questions = every[runs[0]][before]
    category = {q: row.get("category") or "-" for q, row in questions.items()}
    ever_right = {q for stages in every.values() for rows in stages.values() for q, r in rows.items() if r["correct"]}
    up, down, no_letter, wrong_letter = Counter(), Counter(), Counter(), Counter()
    for stages in every.values():
        for q in questions:
            b, a = stages[before][q]["correct"], stages[after][q]["correct"]
            up[category[q]] += a and not b
            down[category[q]] += b and not a
            if not a:
                (no_letter if stages[after][q].get("letter") is None else wrong_letter)[category[q]] += 1
    counts = Counter(category.values())

    def cells(keep: set[str]) -> str:  # one row's figures over the categories in keep
        never = sum(1 for q in questions if category[q] in keep and q not in ever_right)
        total = lambda counter: sum(counter[c] for c in keep)  # noqa: E731
        return f"| {total(counts)} | {never} | {total(up)} | {total(down)} | {total(no_letter)} / {total(wrong_letter)} |"

    lines = [f"{len(runs)} runs, stages {', '.join(sorted(every[runs[0]]))}; flips {before} -> {after} summed over runs.",
             "", "| category | questions | never right (any stage, any run) | right after, wrong before "
             f"| wrong after, right before | wrong in {after}: no letter / wrong letter |", "|---|---|---|---|---|---|"]
    lines += [f"| {name} {cells({name})}" for name in sorted(counts)] + [f"| all {cells(set(counts))}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders, each with benchmarks/<stage>/")
    parser.add_argument("--before", default="S1")
    parser.add_argument("--after", default="S5")
    args = parser.parse_args(argv)
    text = report(args.runs, args.before, args.after)
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
