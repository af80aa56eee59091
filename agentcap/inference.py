"""``agentcap caption``: run trained, frozen agents on new clips or audio files.

The agents and environment come from the same config that trained them, the weights from a
checkpoint. The environment decides how inference runs (READ feeds its own previous ADs back as
context; ACE-Cap plays the Composer–Instruct game until READY or the budget), and every result is
written as one JSON line and printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch


def write_predictions(run_dir: str, rows: list[dict[str, Any]]) -> str:
    """``<run_dir>/predictions.jsonl`` (``predictions.rank<R>.jsonl`` per process under data parallel)."""
    from agentcap.distributed import world

    rank, size = world()
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "predictions.jsonl" if size == 1 else f"predictions.rank{rank}.jsonl")
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return path


def load_module(config: str, checkpoint: str | None):
    """Build the GRPOModule a training config describes and load a checkpoint's weights into it."""
    import yaml
    from jsonargparse import ArgumentParser

    from agentcap.module import GRPOModule

    with open(config, encoding="utf-8") as handle:
        document = yaml.safe_load(handle) or {}
    if "model" not in document:
        raise ValueError(f"{config}: no 'model' section (give the config `agentcap fit` ran with)")
    # only the model section matters here; a run's saved config.yaml (all of LightningCLI's keys) works too
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(GRPOModule, "model")
    seed = document.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):  # random-init bases (toy, tiny) as in training
        from lightning import seed_everything

        seed_everything(seed, verbose=False)
    init = parser.instantiate_classes(parser.parse_object({"model": document["model"]}))
    module: GRPOModule = init.model
    if checkpoint is not None:
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"--checkpoint {checkpoint!r} not found (train first: agentcap fit --config {config})")
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        module.load_state_dict(state["state_dict"])
    module.eval()
    return module


def caption_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentcap caption", description=__doc__)
    parser.add_argument("--config", required=True, help="the training config (agents + environment)")
    parser.add_argument("--checkpoint", help="weights; default <run_dir>/checkpoints/last.ckpt when present")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--manifest", help="a manifest of the environment's format (default: the test split)")
    source.add_argument("--audio", nargs="+", help="audio files (environments that take raw audio)")
    parser.add_argument("--out", default="captions.jsonl", help="JSONL output")
    parser.add_argument("--limit", type=int, default=None, help="caption at most this many items")
    args = parser.parse_args(argv)

    from agentcap.callbacks import TickCheckpoint
    from agentcap.rollout import RolloutDriver

    module = load_module(args.config, None)
    checkpoint = args.checkpoint or TickCheckpoint.path(module.run_dir)
    if args.checkpoint or os.path.isfile(checkpoint):
        module = load_module(args.config, checkpoint)
    else:
        print(f"agentcap caption: no checkpoint at {checkpoint}; using untrained weights", file=sys.stderr)
    split = "test" if module.env_spec.test else "val"
    overrides = {"manifest": args.manifest} if args.manifest else None
    env = module.env_spec.make(split, overrides).unwrapped
    if args.audio:
        if not hasattr(env, "item_from_audio"):
            raise SystemExit(f"{module.env_spec.id} does not take raw audio files; use --manifest")
        items: list[dict[str, Any]] = [env.item_from_audio(path) for path in args.audio]
    else:
        items = list(env.items)
    items = items[: args.limit] if args.limit else items
    driver = RolloutDriver(lambda: module.env_spec.make(split, overrides, defer_scoring=True), module.agents)
    with torch.no_grad():
        results = env.caption(driver, items)
    with open(args.out, "w", encoding="utf-8") as handle:
        for row in results:
            handle.write(json.dumps(row) + "\n")
    for row in results:
        print(f"[{row.get('id')}] {row['caption']}")
        for step in row.get("trace", [])[:-1]:
            print(f"    {step['agent']}/{step['kind']}: {step['text']}")
    print(os.path.abspath(args.out))
    return 0
