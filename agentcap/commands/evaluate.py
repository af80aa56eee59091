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

from agentcap.commands.outputs import JsonlOutput, check_output

# torch, Lightning and the metrics are imported where they are used: `agentcap evaluate --help` answers at once

SPLITS = ("test", "val", "train")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentcap evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group()  # one of them is needed, unless --benchmark has --predictions
    source.add_argument("--run", help="a run directory (holds config.yaml and checkpoints/last.ckpt)")
    source.add_argument("--config", help="a training config (agents + environment)")
    source.add_argument("--env", help="a registered environment id, with --manifest and --predictions")
    p.add_argument("--predictions", help="JSONL of {id, caption[, context]} rows to score instead of captioning "
                   "(with --benchmark: the clips' captions, by row id or audio file stem)")
    p.add_argument("--manifest", help="the items to score against (default: the config's split)")
    p.add_argument("--split", choices=SPLITS, default="test", help="the config's split (default: test)")
    p.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments of --env (e.g. a scorer folder)")
    p.add_argument("--checkpoint", help="weights (default: <run_dir>/checkpoints/last.ckpt)")
    p.add_argument("--limit", type=int, default=None, help="evaluate at most this many items")
    p.add_argument("--stage", default="evaluate", help="the summary.json entry to write (default: evaluate)")
    p.add_argument("--no-meteor", action="store_true", help="skip METEOR (saves its ~12 s JVM start)")
    p.add_argument("--out", help="also write the captions with their references here (JSONL)")
    p.add_argument("--benchmark", help="a benchmark manifest (MMAU / MMAR / MMSU rows, docs/data.md): caption its "
                   "clips with --run / --config, let --judge answer from the captions; --out is then a folder")
    p.add_argument("--judge", help="--benchmark's text-only judge: rule, a model folder, URL#MODEL or JSON "
                   "{url, model}")
    p.add_argument("--ad-eval", help="READ's LLM-AD-Eval with this served judge: URL#MODEL or JSON {url, model}")
    return p


def read_predictions(path: str) -> list[dict[str, Any]]:
    from agentcap.core.manifests import ManifestError, decode_line

    if not os.path.isfile(path):
        raise SystemExit(f"agentcap evaluate: --predictions {path!r} not found")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                line = decode_line(raw, f"{path}:{number}")
                row = json.loads(line)
            except ManifestError as err:
                raise SystemExit(f"agentcap evaluate: {err}") from None
            except json.JSONDecodeError as err:
                raise SystemExit(f"agentcap evaluate: {path}:{number}: not valid JSON ({err.msg})") from None
            if isinstance(row, dict) and row.get("caption") is None and row.get("error"):
                skipped.append(f"{path}:{number}: {row.get('error')}")  # a row `agentcap caption` refused
                continue
            if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("caption"), str):
                raise SystemExit(f"agentcap evaluate: {path}:{number}: expected an object with 'id' and a "
                                 f"string 'caption', got {line.strip()[:120]!r}")
            rows.append(row)
    if skipped:
        print(f"agentcap evaluate: {len(skipped)} rows of {path} have no caption (refused or failed when "
              f"captioned) and are left out, e.g. {skipped[0]}", file=sys.stderr)
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
    p = parser()
    args = p.parse_args(argv)
    if args.benchmark:
        return benchmark_command(args)
    if not (args.run or args.config or args.env):
        p.error("one of the arguments --run --config --env is required")
    from agentcap.core.env import first_rows, inference_rows
    from agentcap.core.manifests import ManifestError

    # --limit N: the manifest's first N rows are read (--predictions name their items by id: all rows)
    limit = None if args.predictions else args.limit or None
    try:  # rows need what captioning reads; scoring says which metrics the fields present allow
        with inference_rows(), first_rows(limit):
            return _evaluate(args)
    except ManifestError as err:  # a refused manifest row: one line naming file, line and field
        raise SystemExit(f"agentcap evaluate: {err}") from None


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    from agentcap.core.registry import UnknownEnvError, make_env
    from agentcap.evaluation.captioning import CaptionMetrics, warn
    from agentcap.evaluation.rollouts import write_summary
    from agentcap.evaluation.skipped import skipped_metrics
    from agentcap.evaluation.table import results_table
    from agentcap.evaluation.tasks import MissingReferenceError, check_references, task_metrics
    from agentcap.rollout.driver import RolloutDriver
    from agentcap.training.loading import env_config_of, trained_module

    if args.env and not (args.manifest and args.predictions):
        raise SystemExit("agentcap evaluate: --env needs --manifest and --predictions")
    config = os.path.join(args.run, "config.yaml") if args.run else args.config
    if args.run and not os.path.isfile(config):
        raise SystemExit(f"agentcap evaluate: --run {args.run!r}: no config.yaml there (is it a run directory?)")
    if args.out:  # before anything is computed: a wrong --out must not cost the metrics
        check_output("agentcap evaluate", "--out", args.out, {
            "--predictions": args.predictions, "--manifest": args.manifest, "config": config,
            "--checkpoint": args.checkpoint, "run summary": args.run and os.path.join(args.run, "summary.json")})
    overrides = {"manifest": args.manifest} if args.manifest else None
    module = None
    if args.env:
        try:
            env = make_env(args.env, {"manifest": args.manifest, **json.loads(args.env_kwargs)}, "--env").unwrapped
        except UnknownEnvError as err:
            raise SystemExit(f"agentcap evaluate: {err}") from None
        order: list[str] = []
    else:
        spec, stages = env_config_of(config)
        split = args.split if getattr(spec, args.split) or overrides else "val"
        env = spec.make(split, overrides).unwrapped
        order = stages
    if args.out:
        check_output("agentcap evaluate", "--out", args.out, {"manifest": env.manifest})
    if args.predictions:
        rows = read_predictions(args.predictions)[: args.limit]
        where = args.predictions
    else:
        items = env.items[: args.limit] if args.limit else env.items
        try:  # before any weights load or caption is made: without references nothing can be scored
            check_references(env, items)
        except MissingReferenceError as err:
            raise SystemExit(f"agentcap evaluate: {err}") from None
        module = trained_module(config, args.checkpoint)
        driver = RolloutDriver(lambda: module.env_config.make(split, overrides, defer_scoring=True), module.agents)
        with torch.no_grad():
            rows = env.caption(driver, items)
        where = config
    items = match(env.items, rows, where)
    unscored = unscored_metrics(env, items)
    for line in unscored:
        print(f"agentcap evaluate: {line}", file=sys.stderr)
    with CaptionMetrics(meteor=False if args.no_meteor else None) as captioning:
        warn(captioning.notes)
        try:
            result = task_metrics(env, items, rows, captioning)
        except MissingReferenceError as err:
            raise SystemExit(f"agentcap evaluate: {err}") from None
    result.update(ad_eval_metrics(args.ad_eval, env, items, rows))
    result.update(skipped_metrics(env, result, args.no_meteor))
    total = len(env.items)
    if args.limit and not args.predictions and len(rows) == args.limit:  # the manifest was read up to the limit
        result["_limit"] = f"--limit {args.limit}: the first {len(rows)} items"
    elif args.limit and len(rows) < total:  # a part of the split: the table's column says so
        result["_limit"] = f"--limit {args.limit}: {len(rows)} of {total} items"
    if args.out:  # written to <out>.partial, renamed when complete
        with JsonlOutput(args.out) as out:
            for row, item in zip(rows, items):
                out.write({**row, "reference": item.get(getattr(env, "reference_field", "caption"))})
    summary = {args.stage: result}
    run_dir = args.run or (module.run_dir if module is not None else None)
    if run_dir:
        path = write_summary(run_dir, summary, merge=True)
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)  # every evaluated stage of the run, for the table
        print(os.path.abspath(path), file=sys.stderr)
    print(results_table(summary, title=f"agentcap evaluate: {len(rows)} items", order=[*order, args.stage]))
    return 0


def unscored_metrics(env: Any, items: list[dict[str, Any]]) -> list[str]:
    """What the items' fields allow: the references the caption metrics use, and each task metric
    the fields present cannot give (a converted public dataset has captions, not question banks)."""
    from agentcap.evaluation.tasks import question_field, reference_field, references_of

    lines = []
    field = reference_field(env)
    with_refs = [len(references_of(env, item)) for item in items if item.get(field) is not None]
    if with_refs:
        lines.append(f"caption metrics against {sum(with_refs)} references of {len(with_refs)} items "
                     f"({min(with_refs)}–{max(with_refs)} each, all of an item's {field!r} and {field + 's'!r})")
    if len(with_refs) < len(items):
        lines.append(f"caption metrics: {len(items) - len(with_refs)} of {len(items)} items have no {field!r}")
    if getattr(env, "examiner_spec", None) is not None or "cloze" in getattr(env, "required_fields", {}) \
            or "mcq" in getattr(env, "required_fields", {}):
        bank = question_field(env)
        missing = sum(1 for item in items if not item.get(bank) and not item.get("_questions"))
        if missing:
            names = "cloze_accuracy, esr" if bank == "cloze" else "mcq_accuracy, g2p"
            lines.append(f"not computed from {missing} of {len(items)} items: {names} (no {bank!r} question bank; "
                         f"agentcap data bank builds one)")
    if "anchors" in getattr(env, "required_fields", {}):
        missing = sum(1 for item in items if not item.get("anchors"))
        if missing:
            lines.append(f"not computed: tiou ({missing} of {len(items)} items have no event 'anchors')")
    return lines


# --- READ's LLM-AD-Eval and the caption-as-evidence benchmarks --------------------------------------
def ad_eval_metrics(spec: str | None, env: Any, items: list[dict[str, Any]],
                    rows: list[dict[str, Any]]) -> dict[str, float]:
    """LLM-AD-Eval of an AD task with the ``--ad-eval`` judge, or else with the config's served coherence
    scorer's server; each row gets its score and the judge's reply (``--out``). None of them: ``{}``."""
    from agentcap.evaluation.ad_eval import llm_ad_eval
    from agentcap.evaluation.benchmark import parse_judge_spec
    from agentcap.evaluation.tasks import reference_field
    from agentcap.judges.served import served_judge_client

    if reference_field(env) != "ad":
        if spec:
            raise SystemExit(f"agentcap evaluate: --ad-eval scores audio descriptions; "
                             f"{type(env).__name__} writes none")
        return {}
    if spec:
        judge = parse_judge_spec(spec, "--ad-eval")
        if not isinstance(judge, dict):
            raise SystemExit(f"agentcap evaluate: --ad-eval needs a served judge (URL#MODEL or JSON), got {spec!r}")
        client = served_judge_client(judge, "--ad-eval")
    else:
        client = getattr(getattr(env, "scorer", None), "client", None)  # a served coherence scorer's server
        if client is None:
            return {}
    summary, scored = llm_ad_eval(client, [str(r.get("caption") or "") for r in rows],
                                  [str(i[reference_field(env)]) for i in items])
    for row, values in zip(rows, scored):
        row.update(values)
    return summary


def benchmark_command(args: argparse.Namespace) -> int:
    """``--benchmark``: caption-as-evidence accuracy (``agentcap.evaluation.benchmark``)."""
    import yaml

    from agentcap.evaluation.benchmark import (
        benchmark_table,
        build_benchmark_judge,
        captioner_identity,
        evaluate_benchmark,
        parse_judge_spec,
        read_benchmark,
    )
    from agentcap.resume.checkpoints import TickCheckpoint

    if not (args.run or args.config or args.predictions):
        raise SystemExit("agentcap evaluate: --benchmark needs --run RUN_DIR or --config CONFIG (the captioner), "
                         "or --predictions (captions made before)")
    if not args.judge:
        raise SystemExit("agentcap evaluate: --benchmark needs --judge (rule, a model folder, URL#MODEL or JSON)")
    config = os.path.join(args.run, "config.yaml") if args.run else args.config
    if config is not None and not os.path.isfile(config):
        raise SystemExit(f"agentcap evaluate: config {config!r} not found (is --run a run directory?)")
    try:
        rows = read_benchmark(args.benchmark, args.limit or None)  # streamed: the first --limit questions are read
        judge = build_benchmark_judge(parse_judge_spec(args.judge))
    except ValueError as err:  # ManifestError included: it names file, line and field
        raise SystemExit(f"agentcap evaluate: {err}") from None
    run_dir = args.run or "."
    if config is not None:
        with open(config, encoding="utf-8") as handle:
            run_dir = ((yaml.safe_load(handle) or {}).get("model") or {}).get("run_dir") or args.run or "."
    checkpoint = args.checkpoint or TickCheckpoint.path(run_dir)
    if args.checkpoint and not os.path.exists(args.checkpoint):  # a file, or a folder of shards
        raise SystemExit(f"agentcap evaluate: --checkpoint {args.checkpoint!r} not found")
    name = os.path.splitext(os.path.basename(args.benchmark))[0]
    out_dir = args.out or os.path.join(run_dir, "benchmarks", name)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):  # before any captioning
        raise SystemExit(f"agentcap evaluate: --benchmark writes a folder; --out {out_dir!r} is a file")

    if args.predictions:  # captions made before (agentcap caption --manifest BENCHMARK): no captioning here
        captioner, identity = predictions_captioner(args.predictions, rows)
    else:
        def captioner(clips: list[str]) -> dict[str, dict[str, Any]]:
            return caption_clips(config, args.checkpoint, clips)

        identity = captioner_identity(config, checkpoint)
    from agentcap.judges.replies import TooManyInvalidReplies
    from agentcap.parallel.http_client import ServerUnavailable

    try:
        summary = evaluate_benchmark(rows, captioner, identity, judge, out_dir)
    except (TooManyInvalidReplies, ServerUnavailable) as err:  # a judge gone wrong: one line naming its URL
        if os.environ.get("AGENTCAP_DEBUG"):
            raise
        raise SystemExit(f"agentcap evaluate: {err}") from None
    print(os.path.abspath(os.path.join(out_dir, "benchmark_summary.json")), file=sys.stderr)
    print(benchmark_table(summary, title=f"agentcap evaluate --benchmark {args.benchmark}: {len(rows)} questions"))
    return 0


def predictions_captioner(path: str, rows: list[dict[str, Any]]) -> tuple[Any, str]:
    """``--benchmark B --predictions P``: each clip's caption from P's rows, found by a benchmark row's
    id (``agentcap caption --manifest B`` writes those) or by the clip's stem (``caption --audio``);
    a clip without one is an error row. Also the cache identity of those captions (P's content)."""
    import hashlib

    from agentcap.core.manifests import audio_id

    by_id = {str(r["id"]): r["caption"] for r in read_predictions(path)}
    with open(path, "rb") as handle:
        identity = f"predictions:{hashlib.sha256(handle.read()).hexdigest()}"

    def captioner(clips: list[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for row in rows:
            clip = row["_clip"]
            if clip in clips and clip not in found:
                for key in (str(row["id"]), audio_id(str(row["audio"]))):
                    if key in by_id:
                        found[clip] = {"caption": by_id[key]}
                        break
        return {clip: found.get(clip, {"error": f"no caption for this clip in --predictions {path}"})
                for clip in clips}

    return captioner, identity


def caption_clips(config: str, checkpoint: str | None, clips: list[str]) -> dict[str, dict[str, Any]]:
    """Caption raw audio files as ``agentcap caption --audio`` does (the task's own inference, one
    unusable file costing only its own result): ``{path: {"caption"} or {"error"}}``."""
    import torch

    from agentcap.commands.caption import caption_isolating
    from agentcap.core.manifests import ManifestError
    from agentcap.rollout.driver import RolloutDriver
    from agentcap.training.loading import trained_module

    module = trained_module(config, checkpoint)
    split = "test" if module.env_config.test else "val"
    overrides: dict[str, Any] = {"on_error": "skip", "max_skip_fraction": 1.0}
    env = module.env_config.make(split, overrides).unwrapped
    if not hasattr(env, "item_from_audio"):
        raise SystemExit(f"agentcap evaluate: {module.env_config.id} does not caption raw audio files")
    results: dict[str, dict[str, Any]] = {}
    items = []
    for path in clips:
        try:
            items.append({**env.item_from_audio(path), "id": path})  # the path: unique, unlike its basename
        except ManifestError as err:  # missing, empty or undecodable: named by path
            results[path] = {"error": str(err)}
    collect = _Collected(results)
    driver = RolloutDriver(lambda: module.env_config.make(split, overrides, defer_scoring=True), module.agents,
                           generation_batch_size=module.generation_batch_size)
    with torch.no_grad():
        for chunk in env.caption_chunks(items, driver.generation_batch_size):
            caption_isolating(env, driver, chunk, collect)
    return results


class _Collected:
    """What ``caption_isolating`` reports, kept by clip path."""

    def __init__(self, results: dict[str, dict[str, Any]]):
        self.results = results

    def captioned(self, row: dict[str, Any]) -> None:
        self.results[row["id"]] = {"caption": row["caption"]}

    def failed(self, item: dict[str, Any], err: BaseException) -> None:
        self.results[item["id"]] = {"error": f"{type(err).__name__}: {err}"}

