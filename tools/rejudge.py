"""Re-judge the captions runs already wrote, with another benchmark judge, and tabulate over seeds.

A run's greedy evaluations keep their captions (``RUN/eval/STAGE.jsonl``); answering the benchmark
again from them needs no model, so a judge fixed after the runs (the rule judge's v2) scores every
stage of every run alike. Each (run, stage) goes through ``agentcap.evaluation.benchmark`` as
``agentcap evaluate --benchmark --predictions`` would (cached under ``RUN/benchmarks/STAGE.JUDGE``);
the table gives each stage's mean over runs with a 95 % t interval, and the paired differences.

    python tools/rejudge.py --benchmark data/real_speech/benchmark.jsonl --limit 100 \\
        --stages before_grpo,after_grpo runs/real/audiomap-demo-s4 runs/real/audiomap-demo-s5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agentcap.commands.evaluate import predictions_captioner  # noqa: E402
from agentcap.evaluation.benchmark import (  # noqa: E402
    build_benchmark_judge,
    evaluate_benchmark,
    parse_judge_spec,
    read_benchmark,
    stage_metrics,
)
from agentcap.evaluation.seeds import mean_interval, paired_cell  # noqa: E402


def rejudge(run: str, stage: str, rows: list, judge) -> dict[str, float]:
    """The benchmark figures of one run's stage, answered from that stage's captions."""
    captions = os.path.join(run, "eval", f"{stage}.jsonl")
    if not os.path.isfile(captions):
        raise SystemExit(f"rejudge: {captions} not found (no greedy evaluation named {stage!r} in {run})")
    with open(captions, encoding="utf-8") as handle, tempfile.NamedTemporaryFile(
            "w", suffix=".jsonl", delete=False, encoding="utf-8") as out:
        for line in handle:
            row = json.loads(line)
            out.write(json.dumps({"id": row["id"], "caption": row["caption"]}) + "\n")
    try:
        captioner, identity = predictions_captioner(out.name, rows)
        summary = evaluate_benchmark(rows, captioner, identity, judge,
                                     os.path.join(run, "benchmarks", f"{stage}.{judge.identity}"))
    finally:
        os.unlink(out.name)
    return stage_metrics(summary)


def main(argv: Sequence[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (one per seed)")
    p.add_argument("--benchmark", required=True, help="the benchmark manifest the runs were evaluated on")
    p.add_argument("--limit", type=int, default=None, help="its first N questions (the runs' benchmark.limit)")
    p.add_argument("--stages", default="before_grpo,after_grpo", help="comma-separated; pairs are consecutive")
    p.add_argument("--judge", default="rule")
    args = p.parse_args(argv)
    stages = args.stages.split(",")
    rows = read_benchmark(args.benchmark, args.limit)
    judge = build_benchmark_judge(parse_judge_spec(args.judge))
    # --limit must cover only clips the evaluations captioned (their first eval_limit test clips)
    figures = {stage: [rejudge(run, stage, rows, judge) for run in args.runs] for stage in stages}
    keys = sorted({k for runs in figures.values() for f in runs for k in f})
    lines = [f"## {judge.identity} judge: {', '.join(args.runs)}", "",
             "| stage | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for stage in stages:
        lines.append(f"| {stage} | " + " | ".join(str(mean_interval([f[k] for f in figures[stage]])) for k in keys)
                     + " |")
    lines += ["", "| paired | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for before, after in zip(stages, stages[1:]):
        cells = [paired_cell(figures[after], figures[before], k) for k in keys]
        lines.append(f"| {after} − {before} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
