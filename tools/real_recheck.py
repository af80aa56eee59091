"""Re-measure finished real-speech ACE-Cap runs on more held-out clips than their schedule evaluated.

A recipe's in-run evaluations use few clips (``eval_limit``: the CPU budget of a 3-role game), so a
stage's change is a few questions either way. This re-measures the two ends of each run on a larger
held-out set without re-running GRPO:

- the *start*: the recipe's schedule up to its first evaluation (the warm-ups, seeded as the run
  was, so the same weights), that evaluation on ``--clips`` clips;
- the *end*: ``agentcap test`` of the run's last checkpoint on the same clips.

Both land in ``<out>/<name>-demo-s<seed>`` as the first and last evaluation's stage names (summary,
per-item and per-question files), so ``tools/seed_stats.py --root <out>`` pairs them. Whether the
re-run warm-ups reproduced the run's weights is checked, not assumed: the start's captions of the
clips the run itself evaluated must equal the run's own (run it with the runs' OMP_NUM_THREADS).

    OMP_NUM_THREADS=1 python tools/real_recheck.py --runs runs/real/v8 --out runs/real/v8-16 \\
        --config configs/real/acecap-supported.yaml --clips 16 --questions 100 21 22
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agentcap.evaluation.items import eval_items_path, read_eval_items  # noqa: E402
from agentcap.evaluation.rollouts import write_summary  # noqa: E402
from agentcap.evaluation.seeds import read_summary  # noqa: E402

AGENTCAP = os.path.join(os.path.dirname(sys.executable), "agentcap")
# the kernels tools/real_seeds.sh pins, so the re-run warm-ups give the run's weights
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def evaluations(config: dict) -> list[str]:
    return [s["name"] for s in config["model"]["stages"] if s.get("kind") == "evaluate"]


def start_config(config: dict, clips: int, questions: int) -> dict:
    """The schedule up to and with its first evaluation, on ``clips`` held-out clips."""
    stages = config["model"]["stages"]
    first = next(i for i, s in enumerate(stages) if s.get("kind") == "evaluate")
    model = {**config["model"], "stages": stages[: first + 1], "eval_limit": clips,
             "benchmark": {**config["model"]["benchmark"], "limit": questions}}
    return {**config, "model": model}


def run(cmd: Sequence[str], log: str) -> None:
    with open(log, "a") as out:
        subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=out, stderr=subprocess.STDOUT, check=True,
                       env={**PINNED, **os.environ})


def recheck(seed: str, args: argparse.Namespace, config: dict) -> str:
    source = os.path.join(args.runs, f"{args.name}-demo-s{seed}")
    ckpt = os.path.join(source, "checkpoints", "last.ckpt")
    if not os.path.isfile(ckpt):
        raise FileNotFoundError(f"{ckpt}: no finished run for seed {seed}")
    names = evaluations(config)
    first, last = names[0], names[-1]
    dest = os.path.join(args.out, f"{args.name}-demo-s{seed}")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    log = dest + ".log"
    open(log, "w").close()
    start = dest + ".start.yaml"
    with open(start, "w") as f:
        yaml.safe_dump(start_config(config, args.clips, args.questions), f, sort_keys=False)
    run([AGENTCAP, "fit", "--config", start, "--seed_everything", seed, "--model.seed", seed,
         "--model.run_dir", dest, "--trainer.logger.init_args.save_dir", dest], log)
    end = os.path.join(dest, "end")
    run([AGENTCAP, "test", "--config", os.path.join(source, "config.yaml"), "--model.eval_limit", str(args.clips),
         "--model.benchmark.limit", str(args.questions), "--model.run_dir", end,
         "--trainer.logger.init_args.save_dir", end, "--ckpt_path", ckpt], log)
    # the end's "test" evaluation becomes this folder's last stage, beside the re-run start
    shutil.copy(eval_items_path(end, "test"), eval_items_path(dest, last))
    shutil.copytree(os.path.join(end, "benchmarks", "test"), os.path.join(dest, "benchmarks", last))
    write_summary(dest, {last: read_summary(end)["test"]}, merge=True)
    ran, again = read_eval_items(source, first), read_eval_items(dest, first)
    same = sum(row["caption"] == again.get(i, {}).get("caption") for i, row in ran.items())
    return f"seed {seed}: {first} re-run gives the run's own captions on {same} of its {len(ran)} clips"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("seeds", nargs="+")
    p.add_argument("--runs", required=True, help="folder of the finished runs (<name>-demo-s<seed>)")
    p.add_argument("--out", required=True)
    p.add_argument("--config", required=True, help="the recipe the runs were trained with")
    p.add_argument("--name", default="acecap")
    p.add_argument("--clips", type=int, default=16)
    p.add_argument("--questions", type=int, default=100, help="benchmark questions: those of the first --clips test clips")
    args = p.parse_args(argv)
    with open(args.config) as f:
        config = yaml.safe_load(f)
    if len(evaluations(config)) < 2:
        raise ValueError(f"{args.config}: model.stages has {len(evaluations(config))} evaluate stage(s); "
                         "a start and an end need two")
    os.makedirs(args.out, exist_ok=True)
    for seed in args.seeds:
        print(recheck(seed, args, config), flush=True)


if __name__ == "__main__":
    main()
