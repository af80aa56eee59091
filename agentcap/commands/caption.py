"""``agentcap caption``: run trained, frozen agents on new clips or audio files.

The agents and environment come from the same config that trained them, the weights from a
checkpoint. The environment decides how inference runs (READ feeds its own previous ADs back as
context; ACE-Cap plays the Composer–Instruct game until READY or the budget). Every result is
written as one JSON line as soon as it is produced; an item that cannot be used gets a row with its
error instead, the exit status is 1 when any failed, and a last line counts captioned, failed and
skipped items.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

from agentcap.core.manifests import ManifestError
from agentcap.resume.checkpoints import latest_checkpoint
from agentcap.resume.loading import load_module
from agentcap.rollout.driver import RolloutDriver


def caption_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentcap caption", description=__doc__)
    parser.add_argument("--config", required=True, help="the training config (agents + environment)")
    parser.add_argument("--checkpoint", help="weights; default the run's newest readable checkpoint")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--manifest", help="a manifest of the environment's format (default: the test split)")
    source.add_argument("--audio", nargs="+", help="audio files (environments that take raw audio)")
    parser.add_argument("--out", default="captions.jsonl", help="JSONL output")
    parser.add_argument("--limit", type=int, default=None, help="caption at most this many items")
    args = parser.parse_args(argv)

    module = load_module(args.config, None)
    checkpoint = args.checkpoint or latest_checkpoint(module.run_dir)
    if checkpoint is not None:
        module = load_module(args.config, checkpoint)
    else:
        print(f"agentcap caption: no checkpoint in {module.run_dir}; using untrained weights", file=sys.stderr)
    split = "test" if module.env_config.test else "val"
    spec_kwargs = {**module.env_config.kwargs, **getattr(module.env_config, split)}
    on_error = spec_kwargs.get("on_error", "raise")
    # every row is read; an unusable one becomes an error row instead of stopping the whole run
    overrides: dict[str, Any] = {"on_error": "skip", "max_skip_fraction": 1.0}
    if args.manifest:
        overrides["manifest"] = args.manifest
    out = Outcome(args.out, skipping=on_error == "skip")
    try:
        env = module.env_config.make(split, overrides).unwrapped
    except ValueError as err:  # every row refused: still one error row, and a failed exit
        out.close()
        print(f"agentcap caption: {err}", file=sys.stderr)
        return 1
    for message in env.skipped.skipped:
        out.refused(message)
    if args.audio:
        if not hasattr(env, "item_from_audio"):
            raise SystemExit(f"{module.env_config.id} does not take raw audio files; use --manifest")
        items: list[dict[str, Any]] = []
        for path in args.audio:
            try:
                items.append(env.item_from_audio(path))  # decodes and checks the file, as a manifest row
            except ManifestError as err:
                out.failed({"id": os.path.basename(path), "audio": path}, err)
    else:
        items = list(env.items)
    items = items[: args.limit] if args.limit else items
    driver = RolloutDriver(
        lambda: module.env_config.make(split, overrides, defer_scoring=True), module.agents,
        generation_batch_size=module.generation_batch_size,
    )
    with torch.no_grad():
        for chunk in env.caption_chunks(items, driver.generation_batch_size):
            caption_isolating(env, driver, chunk, out)
    out.close()
    print(out.summary(), file=sys.stderr)
    print(os.path.abspath(args.out))
    return 1 if out.counts["failed"] else 0


def caption_isolating(env: Any, driver: Any, items: list[dict[str, Any]], out: "Outcome") -> None:
    """Caption ``items``; when the batch fails, caption each independent unit of it on its own, so
    one unusable item costs only its own row (with its error)."""
    try:
        rows = env.caption(driver, items)
    except Exception as err:
        units = env.caption_chunks(items, 1)
        if len(units) == 1:
            for item in items:
                out.failed(item, err)
            return
        for unit in units:
            caption_isolating(env, driver, unit, out)
        return
    for row in rows:
        out.captioned(row)


class Outcome:
    """Writes every result row as it is produced (flushed), and counts captioned / failed / skipped."""

    def __init__(self, path: str, skipping: bool):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path, self.skipping = path, skipping
        self.handle = open(path, "w", encoding="utf-8")
        self.counts = {"captioned": 0, "failed": 0, "skipped": 0}

    def _write(self, row: dict[str, Any]) -> None:
        self.handle.write(json.dumps(row) + "\n")
        self.handle.flush()

    def captioned(self, row: dict[str, Any]) -> None:
        self._write(row)
        self.counts["captioned"] += 1
        print(f"[{row.get('id')}] {row['caption']}")
        for step in row.get("trace", [])[:-1]:
            print(f"    {step['agent']}/{step['kind']}: {step['text']}")

    def failed(self, item: dict[str, Any], err: BaseException) -> None:
        message = str(err) if isinstance(err, ManifestError) else f"{type(err).__name__}: {err}"
        self._write({"id": item.get("id"), "where": item.get("_where"), "caption": None, "error": message})
        self.counts["failed"] += 1
        print(f"agentcap caption: failed: {message}", file=sys.stderr)

    def refused(self, message: str) -> None:
        """A manifest row refused at load: skipped when the config says ``on_error: skip``, else failed."""
        kind = "skipped" if self.skipping else "failed"
        self._write({"id": None, "where": message.split(": ", 1)[0], "caption": None, "error": message, kind: True})
        self.counts[kind] += 1
        print(f"agentcap caption: {kind}: {message}", file=sys.stderr)

    def close(self) -> None:
        self.handle.close()

    def summary(self) -> str:
        c = self.counts
        return f"agentcap caption: {c['captioned']} captioned, {c['failed']} failed, {c['skipped']} skipped → {self.path}"
