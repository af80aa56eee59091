"""``agentcap caption``: run trained, frozen agents on new clips or audio files.

The agents and environment come from the same config that trained them, the weights from a
checkpoint; a run without one is refused unless ``--untrained`` is given. The environment decides
how inference runs (READ feeds its own previous ADs back as context; ACE-Cap plays the
Composer–Instruct game until READY or the budget). Every result is written as one JSON line as soon
as it is produced, to ``<out>.partial``, which replaces ``<out>`` when the run ends (an interrupted
run leaves the earlier ``<out>`` whole); ``--out`` may not be an input. An item that cannot be used
gets a row with its error instead, the exit status is 1 when any failed, and a last line counts
captioned, failed and skipped items.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from agentcap.commands.outputs import JsonlOutput, check_output

# torch and the modules that import it load after the arguments parse: `agentcap caption --help` stays fast


def caption_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentcap caption", description=__doc__)
    parser.add_argument("--config", required=True, help="the training config (agents + environment)")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--checkpoint", help="weights; default the run's newest readable checkpoint")
    weights.add_argument("--untrained", action="store_true",
                         help="caption with untrained weights (without it, a run with no checkpoint is refused)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--manifest", help="a manifest of the environment's format (default: the test split)")
    source.add_argument("--audio", nargs="+", help="audio files (environments that take raw audio)")
    parser.add_argument("--out", default="captions.jsonl", help="JSONL output")
    parser.add_argument("--limit", type=int, default=None, help="caption at most this many items")
    args = parser.parse_args(argv)
    from agentcap.core.env import first_rows, inference_rows

    # a row needs its media, not the fields only scoring reads (gold, banks, anchors); --limit N reads N rows
    with inference_rows(), first_rows(args.limit or None):
        return _caption(args)


def _caption(args: argparse.Namespace) -> int:
    from agentcap.core.manifests import NoUsableRows
    from agentcap.resume.checkpoints import latest_checkpoint
    from agentcap.training.loading import load_module

    inputs = {"--config": args.config, "--manifest": args.manifest, "--checkpoint": args.checkpoint,
              "--audio file": args.audio}
    check_output("agentcap caption", "--out", args.out, inputs)  # before any work: a wrong --out costs nothing

    module = load_module(args.config, None, "agentcap caption")
    checkpoint = None if args.untrained else args.checkpoint or latest_checkpoint(module.run_dir)
    if checkpoint is not None:
        module = load_module(args.config, checkpoint, "agentcap caption")
    elif not args.untrained:
        raise SystemExit(f"agentcap caption: no checkpoint in {module.run_dir} (train first: agentcap fit "
                         f"--config {args.config}, or give --checkpoint; --untrained captions with untrained weights)")
    else:
        print("agentcap caption: --untrained: using untrained weights", file=sys.stderr)
    split = "test" if module.env_config.test else "val"
    spec_kwargs = {**module.env_config.kwargs, **getattr(module.env_config, split)}
    on_error = spec_kwargs.get("on_error", "raise")
    # every row is read; an unusable one becomes an error row instead of stopping the whole run
    overrides: dict[str, Any] = {"on_error": "skip", "max_skip_fraction": 1.0}
    if args.manifest:
        overrides["manifest"] = args.manifest
    check_output("agentcap caption", "--out", args.out,
                 {"manifest": overrides.get("manifest", spec_kwargs.get("manifest")), "checkpoint": checkpoint})
    try:
        env = module.env_config.make(split, overrides).unwrapped
    except NoUsableRows as err:  # every row refused: still one error row each, the reasons, a failed exit
        with Outcome(args.out, skipping=on_error == "skip") as out:
            for message, row_id in zip(err.report.skipped, err.report.ids):
                out.refused(message, row_id)
        print(f"agentcap caption: {err}", file=sys.stderr)
        print(out.summary(), file=sys.stderr)
        return 1
    except ValueError as err:  # e.g. an empty manifest: nothing to write
        print(f"agentcap caption: {err}", file=sys.stderr)
        return 1
    if args.audio and not hasattr(env, "item_from_audio"):
        raise SystemExit(f"{module.env_config.id} does not take raw audio files; use --manifest")
    with Outcome(args.out, skipping=on_error == "skip") as out:  # renamed onto --out when every item is done
        for message, row_id in zip(env.skipped.skipped, env.skipped.ids):
            out.refused(message, row_id)
        caption_items(args, module, env, split, overrides, out)
    print(out.summary(), file=sys.stderr)
    print(os.path.abspath(args.out))
    return 1 if out.counts["failed"] else 0


def caption_items(args: argparse.Namespace, module: Any, env: Any, split: str, overrides: dict[str, Any],
                  out: "Outcome") -> None:
    """Caption the ``--audio`` files or the manifest's items, batch by batch, into ``out``."""
    import torch

    from agentcap.core.manifests import ManifestError, warn_truncation
    from agentcap.rollout.driver import RolloutDriver

    if args.audio:
        items: list[dict[str, Any]] = []
        for path in args.audio:
            try:
                items.append(env.item_from_audio(path))  # decodes and checks the file, as a manifest row
            except ManifestError as err:
                out.failed({"id": os.path.splitext(os.path.basename(path))[0], "audio": path}, err)  # the stem, as a success
        # the manifest's clips are counted when the env loads; these files are cut just the same
        warn_truncation(items, getattr(env, "max_seconds", None), f"{type(env).__name__} --audio")
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


class Outcome(JsonlOutput):
    """Writes every result row as it is produced (flushed, to ``<path>.partial`` until the run ends),
    and counts captioned / failed / skipped."""

    def __init__(self, path: str, skipping: bool):
        super().__init__(path, "agentcap caption")
        self.skipping = skipping
        self.counts = {"captioned": 0, "failed": 0, "skipped": 0}

    def _write(self, row: dict[str, Any]) -> None:
        self.write(row)

    def captioned(self, row: dict[str, Any]) -> None:
        self._write(row)
        self.counts["captioned"] += 1
        print(f"[{row.get('id')}] {row['caption']}")
        for step in row.get("trace", [])[:-1]:
            print(f"    {step['agent']}/{step['kind']}: {step['text']}")

    def failed(self, item: dict[str, Any], err: BaseException) -> None:
        from agentcap.core.manifests import ManifestError

        message = str(err) if isinstance(err, ManifestError) else f"{type(err).__name__}: {err}"
        self._write({"id": item.get("id"), "where": item.get("_where"), "caption": None, "error": message})
        self.counts["failed"] += 1
        print(f"agentcap caption: failed: {message}", file=sys.stderr)

    def refused(self, message: str, row_id: Any = None) -> None:
        """A manifest row refused at load: skipped when the config says ``on_error: skip``, else failed."""
        kind = "skipped" if self.skipping else "failed"
        self._write({"id": row_id, "where": message.split(": ", 1)[0], "caption": None, "error": message, kind: True})
        self.counts[kind] += 1
        print(f"agentcap caption: {kind}: {message}", file=sys.stderr)

    def summary(self) -> str:
        c = self.counts
        return f"agentcap caption: {c['captioned']} captioned, {c['failed']} failed, {c['skipped']} skipped → {self.path}"
