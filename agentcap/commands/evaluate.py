"""``agentcap evaluate``: the papers' metrics for a trained run, or for a file of predictions.

    agentcap evaluate --run runs/read-demo
        captions the run's test split with its last checkpoint (the task's own inference: READ
        feeds back its own ADs), scores every metric, adds the ``evaluate`` entry to the run's
        ``summary.json`` and prints the table of every evaluated stage.
    agentcap evaluate --predictions captions.jsonl --config configs/demo/read.yaml [--manifest M]
    agentcap evaluate --predictions captions.jsonl --env agentcap/ADClip-v0 --manifest M [--env-kwargs JSON]
        scores a JSONL of ``{"id", "caption"}`` rows (``agentcap caption`` / ``predict`` write them)
        against the manifest's references.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import gymnasium as gym
import torch

from agentcap.core.registry import load_env_plugins
from agentcap.evaluation.captioning import CaptionMetrics, warn
from agentcap.evaluation.rollouts import write_summary
from agentcap.evaluation.table import results_table
from agentcap.evaluation.tasks import task_metrics
from agentcap.resume.loading import env_config_of, trained_module
from agentcap.rollout.driver import RolloutDriver

SPLITS = ("test", "val", "train")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentcap evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="a run directory (holds config.yaml and checkpoints/last.ckpt)")
    source.add_argument("--config", help="a training config (agents + environment)")
    source.add_argument("--env", help="a registered environment id, with --manifest and --predictions")
    p.add_argument("--predictions", help="JSONL of {id, caption[, context]} rows to score instead of captioning")
    p.add_argument("--manifest", help="the items to score against (default: the config's split)")
    p.add_argument("--split", choices=SPLITS, default="test", help="the config's split (default: test)")
    p.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments of --env (e.g. a scorer folder)")
    p.add_argument("--checkpoint", help="weights (default: <run_dir>/checkpoints/last.ckpt)")
    p.add_argument("--limit", type=int, default=None, help="evaluate at most this many items")
    p.add_argument("--stage", default="evaluate", help="the summary.json entry to write (default: evaluate)")
    p.add_argument("--no-meteor", action="store_true", help="skip METEOR (saves its ~12 s JVM start)")
    p.add_argument("--out", help="also write the captions with their references here (JSONL)")
    return p


def read_predictions(path: str) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        raise SystemExit(f"agentcap evaluate: --predictions {path!r} not found")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SystemExit(f"agentcap evaluate: {path}:{number}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("caption"), str):
                raise SystemExit(f"agentcap evaluate: {path}:{number}: expected an object with 'id' and a "
                                 f"string 'caption', got {line.strip()[:120]!r}")
            rows.append(row)
    return rows


def match(items: list[dict[str, Any]], rows: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The items the rows caption, in row order; an id the manifest lacks is an error."""
    by_id = {str(item["id"]): item for item in items}
    unknown = [str(r["id"]) for r in rows if str(r["id"]) not in by_id]
    if unknown:
        raise SystemExit(f"agentcap evaluate: {where}: {len(unknown)} ids are not in the manifest, "
                         f"e.g. {unknown[:3]}")
    return [by_id[str(r["id"])] for r in rows]


def evaluate_command(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.env and not (args.manifest and args.predictions):
        raise SystemExit("agentcap evaluate: --env needs --manifest and --predictions")
    config = os.path.join(args.run, "config.yaml") if args.run else args.config
    if args.run and not os.path.isfile(config):
        raise SystemExit(f"agentcap evaluate: --run {args.run!r}: no config.yaml there (is it a run directory?)")
    overrides = {"manifest": args.manifest} if args.manifest else None
    module = None
    if args.env:
        load_env_plugins()
        env = gym.make(args.env, manifest=args.manifest, **json.loads(args.env_kwargs)).unwrapped
        order: list[str] = []
    else:
        spec, stages = env_config_of(config)
        split = args.split if getattr(spec, args.split) or overrides else "val"
        env = spec.make(split, overrides).unwrapped
        order = stages
    if args.predictions:
        rows = read_predictions(args.predictions)[: args.limit]
        where = args.predictions
    else:
        module = trained_module(config, args.checkpoint)
        items = env.items[: args.limit] if args.limit else env.items
        driver = RolloutDriver(lambda: module.env_config.make(split, overrides, defer_scoring=True), module.agents)
        with torch.no_grad():
            rows = env.caption(driver, items)
        where = config
    items = match(env.items, rows, where)
    with CaptionMetrics(meteor=False if args.no_meteor else None) as captioning:
        warn(captioning.notes)
        result = task_metrics(env, items, rows, captioning)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            for row, item in zip(rows, items):
                handle.write(json.dumps({**row, "reference": item.get(getattr(env, "reference_field", "caption"))}) + "\n")
    summary = {args.stage: result}
    run_dir = args.run or (module.run_dir if module is not None else None)
    if run_dir:
        path = write_summary(run_dir, summary, merge=True)
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)  # every evaluated stage of the run, for the table
        print(os.path.abspath(path), file=sys.stderr)
    print(results_table(summary, title=f"agentcap evaluate: {len(rows)} items", order=[*order, args.stage]))
    return 0
