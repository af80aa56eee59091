"""Why the toy AudioMap demo's held-out benchmark moves under GRPO: per-seed figures, markdown tables.

For each seed's run (``<root>/audiomap-demo-s<SEED>``, as ``tools/seeds.sh audiomap`` writes them) it
compares two evaluate stages (default ``before_grpo`` and ``after_grpo``):

* benchmark accuracy per category and subcategory (``benchmarks/<stage>/benchmark_items.jsonl``) and
  how many questions flip right → wrong and wrong → right;
* onset questions read two ways: the rule judge's (the choice's exact text, e.g. "5.8 s", must be in
  the subject's sentence) and the nearest choice to the onset the caption states (what "At about what
  time …" asks); and why each onset question that flipped right → wrong did (subject gone, onset
  moved by ≤ 0.2 s, moved further, exact onset still there);
* the templated captions parsed ("From A s to B s, a LOUDNESS PITCH TYPE sounds COUNT."): words,
  sentences, sentences that do not parse (a lost end time, a cut sentence), loudness words used,
  exact onsets of the reference events, mean onset error;
* the reward and its components per held-out item (``eval/<stage>.jsonl``);
* from the W&B offline file, each GRPO stage's share of zero-spread groups, the KL, and the training
  batch's reward components over its first and last 10 steps.

Means over seeds come with 95 % t intervals (``agentcap.evaluation.seeds.mean_interval``).

    python tools/audiomap_analysis.py runs/toy-audiomap 5 6 7
    python tools/audiomap_analysis.py runs/toy-audiomap 5 6 7 --against runs/toy-audiomap-kl
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import re
import struct
import sys
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from agentcap.evaluation.seeds import mean_interval  # noqa: E402
from agentcap.judges.questions import sentences  # noqa: E402
from agentcap.judges.temporal import parse_intervals  # noqa: E402

TEMPLATE = re.compile(r"From (\d+(?:\.\d+)?) s to (\d+(?:\.\d+)?) s, a (.*?) ?(beep|buzz|hiss|knock|chirp)s? sounds (.+)")
LOUDNESS = ("very soft", "very loud", "soft", "loud")  # longest first
ROWS = ("all", "perception", "type", "pitch", "loudness", "count", "temporal", "onset", "order")


# --- inputs ----------------------------------------------------------------------------------------
def jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def wandb_history(run_dir: str) -> list[dict[str, Any]]:
    """History rows of the run's offline W&B file (LevelDB log framing: 32 KiB blocks of records with
    a 7-byte header, after the file's 7-byte W&B header; each record a ``wandb.proto`` Record)."""
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(glob.glob(os.path.join(run_dir, "wandb", "latest-run", "*.wandb")))
    if not files:
        return []
    data, pos, pending, rows = open(files[0], "rb").read(), 7, b"", []
    block = 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind not in (1, 4):  # FIRST / MIDDLE of a record split over blocks
            continue
        record = pb.Record()
        try:
            record.ParseFromString(pending)
        except Exception:  # noqa: BLE001 - a torn tail: skip it
            continue
        if record.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def parse_caption(caption: str) -> list[dict[str, Any] | None]:
    """One dict per sentence of a templated caption (None: the sentence does not fit the template)."""
    out: list[dict[str, Any] | None] = []
    for sentence in sentences(caption):
        match = TEMPLATE.fullmatch(sentence.strip().rstrip("."))
        if match is None:
            out.append(None)
            continue
        attrs = match.group(3)
        out.append({"start": float(match.group(1)), "end": float(match.group(2)), "type": match.group(4),
                    "loudness": next((w for w in LOUDNESS if attrs.startswith(w)), None)})
    return out


def mean(values) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else float("nan")


# --- per seed --------------------------------------------------------------------------------------
def nearest_onset(row: dict[str, Any]) -> bool:
    """Onset question answered with the choice nearest the onset the subject's first timed sentence states."""
    subject = re.search(r"does the (\w+) begin", row["question"]).group(1)
    stated = None
    for sentence in sentences(row["caption"]):
        if re.search(rf"\b{subject}s?\b", sentence) and parse_intervals(sentence):
            stated = parse_intervals(sentence)[0].start
            break
    if stated is None:
        return False
    times = [float(c.split()[0]) for c in row["choices"]]
    return "ABCDEFGHIJ"[min(range(len(times)), key=lambda k: abs(times[k] - stated))] == row["answer"]


def in_row(item: dict[str, Any], name: str) -> bool:
    return name == "all" or name in (item["category"], item["subcategory"])


def seed_figures(run: str, test: dict[str, dict[str, Any]], before: str, after: str) -> dict[str, float]:
    fig: dict[str, float] = {}
    bench = {st: {r["id"]: r for r in jsonl(os.path.join(run, "benchmarks", st, "benchmark_items.jsonl"))}
             for st in (before, after)}
    b, a = bench[before], bench[after]
    for tag, items in (("before", b), ("after", a)):
        for name in ROWS:
            fig[f"{tag}:acc/{name}"] = mean(float(r["correct"]) for r in items.values() if in_row(r, name))
        fig[f"{tag}:acc/onset nearest"] = mean(float(nearest_onset(r)) for r in items.values() if r["subcategory"] == "onset")
    for name in ROWS:
        ids = [q for q in b if in_row(b[q], name)]
        fig[f"flips/{name} R->W"] = sum(b[q]["correct"] and not a[q]["correct"] for q in ids)
        fig[f"flips/{name} W->R"] = sum(a[q]["correct"] and not b[q]["correct"] for q in ids)
    why = collections.Counter()
    for q, row in b.items():
        if row["subcategory"] != "onset" or not row["correct"] or a[q]["correct"]:
            continue
        subject = re.search(r"does the (\w+) begin", row["question"]).group(1)
        gold = float(row["choices"]["ABCDEFGHIJ".index(row["answer"])].split()[0])
        starts = [e["start"] for e in parse_caption(a[q]["caption"]) if e and e["type"] == subject]
        gap = min((abs(s - gold) for s in starts), default=None)
        why["subject gone" if gap is None else "onset kept" if gap < 1e-6 else "moved <= 0.2 s" if gap <= 0.2 + 1e-9
            else "moved > 0.2 s"] += 1
    for reason in ("subject gone", "moved <= 0.2 s", "moved > 0.2 s", "onset kept"):
        fig[f"onset R->W/{reason}"] = why[reason]
    for tag, stage in (("before", before), ("after", after)):
        items = jsonl(os.path.join(run, "eval", f"{stage}.jsonl"))
        for key in ("reward", "esr", "ectr", "length"):
            fig[f"{tag}:{key}"] = mean(r[key] for r in items)
        parsed = [(r, parse_caption(r["caption"]), test[r["id"]]["events"]) for r in items]
        fig[f"{tag}:words"] = mean(len(r["caption"].split()) for r, _, _ in parsed)
        fig[f"{tag}:words / reference words"] = mean(len(r["caption"].split()) / len(r["reference"].split()) for r, _, _ in parsed)
        fig[f"{tag}:sentences"] = mean(len(p) for _, p, _ in parsed)
        fig[f"{tag}:clips with more sentences than events"] = sum(len(p) > len(ev) for _, p, ev in parsed)
        fig[f"{tag}:untemplated sentences"] = sum(e is None for _, p, _ in parsed for e in p)
        for word in ("very soft", "soft", "loud", "very loud"):
            fig[f"{tag}:says '{word}'"] = sum(e is not None and e["loudness"] == word for _, p, _ in parsed for e in p)
        golds = [(g, [e for e in p if e and e["type"] == g["type"]]) for _, p, ev in parsed for g in ev]
        fig[f"{tag}:exact onset"] = mean(float(any(abs(e["start"] - g["start"]) < 1e-6 for e in found)) for g, found in golds)
        fig[f"{tag}:onset error s"] = mean(min(abs(e["start"] - g["start"]) for e in found) for g, found in golds if found)
    history = [r for r in wandb_history(run) if "utility/caption/zero_spread" in r]
    stages = sorted({r["stage"] for r in history})
    for k, stage in enumerate(stages):
        rows = [r for r in history if r["stage"] == stage]
        tag = f"grpo {k + 1}"
        fig[f"{tag}:zero-spread groups"] = mean(r["utility/caption/zero_spread"] for r in rows)
        fig[f"{tag}:kl (last 10)"] = mean(r.get("loss/policy/kl", 0.0) for r in rows[-10:])
        for key in ("total", "esr", "ectr", "length"):
            fig[f"{tag}:{key} first 10"] = mean(r[f"reward/policy/{key}"] for r in rows[:10])
            fig[f"{tag}:{key} last 10"] = mean(r[f"reward/policy/{key}"] for r in rows[-10:])
    return fig


# --- tables ----------------------------------------------------------------------------------------
def fmt(values: Sequence[float]) -> str:
    return str(mean_interval(values))


def tables(root: str, seeds: Sequence[str], before: str, after: str, against: str | None) -> str:
    test = {r["id"]: r for r in jsonl("data/toy_soundscapes/test.jsonl")}
    roots = [root] + ([against] if against else [])
    figs = {r: {s: seed_figures(os.path.join(r, f"audiomap-demo-s{s}"), test, before, after) for s in seeds} for r in roots}
    lines = [f"Seeds {', '.join(seeds)}; means over seeds with 95 % t intervals (df = {len(seeds) - 1}); per seed after the bar.", ""]
    for r in roots:
        f = figs[r]
        paired = sorted({k.split(":", 1)[1] for k in f[seeds[0]] if k.startswith("before:")},
                        key=lambda k: list(f[seeds[0]]).index(f"before:{k}"))
        lines += [f"### {r}: {before} → {after}", "", "| figure | before | after | after − before | per seed (after − before) |",
                  "|---|---|---|---|---|"]
        for k in paired:
            bv = [f[s][f"before:{k}"] for s in seeds]
            av = [f[s][f"after:{k}"] for s in seeds]
            d = [y - x for x, y in zip(bv, av)]
            lines.append(f"| {k} | {fmt(bv)} | {fmt(av)} | {fmt(d)} | {', '.join(f'{x:+.3f}' for x in d)} |")
        rest = [k for k in f[seeds[0]] if ":" not in k or k.split(":", 1)[0] not in ("before", "after")]
        lines += ["", "| figure | mean over seeds | per seed |", "|---|---|---|"]
        for k in rest:
            v = [f[s].get(k, float("nan")) for s in seeds]
            lines.append(f"| {k} | {fmt(v)} | {', '.join(f'{x:.3f}' for x in v)} |")
        lines.append("")
    if against:
        a, b = figs[root], figs[against]
        lines += [f"### {against} − {root} (paired by seed)", "", "| figure | Δ after | Δ (after − before) |", "|---|---|---|"]
        for k in [k.split(":", 1)[1] for k in a[seeds[0]] if k.startswith("after:")]:
            d_after = [b[s][f"after:{k}"] - a[s][f"after:{k}"] for s in seeds]
            d_gain = [(b[s][f"after:{k}"] - b[s][f"before:{k}"]) - (a[s][f"after:{k}"] - a[s][f"before:{k}"]) for s in seeds]
            lines.append(f"| {k} | {fmt(d_after)} | {fmt(d_gain)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", help="folder of the runs, e.g. runs/toy-audiomap")
    parser.add_argument("seeds", nargs="+")
    parser.add_argument("--before", default="before_grpo")
    parser.add_argument("--after", default="after_grpo")
    parser.add_argument("--against", help="a second folder of runs of the same seeds (another recipe), compared by seed")
    args = parser.parse_args(argv)
    for root in filter(None, (args.root, args.against)):
        for seed in args.seeds:
            for stage in (args.before, args.after):
                items = os.path.join(root, f"audiomap-demo-s{seed}", "benchmarks", stage, "benchmark_items.jsonl")
                if not os.path.isfile(items):
                    parser.error(f"{items}: not found (seed {seed}'s run has no {stage!r} benchmark: run "
                                 f"`RUNS={root} bash tools/seeds.sh audiomap {' '.join(args.seeds)}` first)")
    print(tables(args.root, args.seeds, args.before, args.after, args.against))


if __name__ == "__main__":
    main()
