"""Held-out figures of a demo over seeds, with 95 % confidence intervals.

Why: one seed's before/after numbers move by as much as RL's gain, so a demo's claim is its mean
over seeds nobody tuned on, with an interval. For each metric this prints

* every stage's mean over seeds with a t interval (df = seeds − 1);
* for each (before, after) pair of stages, the paired difference over seeds (the training run's
  noise: does the gain hold for a new seed?) and over items (after − before on the same held-out
  item, pooled over seeds: is the evaluation set large enough to see the gain?; benchmark metrics
  pair question by question);
* for ACE-Cap, the Pearson correlation between the questions a Composer asked and the clip's
  number of events, per stage (the adaptive stopping the paper claims), and what asking enough
  pays: G2P of the evidence and of the final caption when the Composer asked at least as many
  questions as the clip has events, minus when it asked fewer (within clips of equal event count).
  The stop utility (Eq. 15) sees only the final caption, so evidence that c^F drops earns nothing.
* with ``--control ROOT`` (runs of the same seeds under a recipe without the part being measured,
  e.g. its SFT stages without the GRPO stages), each pair's change minus the control's, seed by seed
  and item by item (same seed, same held-out item): what the measured part adds to what the rest
  of the recipe does alone.

The t quantiles are scipy.stats', checked against printed tables in tests/test_seed_stats.py.

    python tools/seed_stats.py read 5 6 7 --pairs before_grpo:after_grpo
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import scipy.stats

from agentcap.evaluation.items import read_benchmark_items, read_eval_items
from agentcap.resume import numerics

# Seeds the demo recipes were tuned on in earlier stops (issues 3, 4, 6); figures that claim a gain
# come from other seeds.
TUNED_SEEDS = (0, 1, 2)


# --- the t distribution -----------------------------------------------------------------------
def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    return float(scipy.stats.t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"need 0 < p < 1 and df > 0, got p={p}, df={df}")
    return float(scipy.stats.t.ppf(p, df))


# --- summaries --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided t interval; ``half`` is NaN with fewer than two values."""

    mean: float
    half: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    def __str__(self) -> str:
        if math.isnan(self.mean):
            return "n/a"
        if math.isnan(self.half):
            return f"{self.mean:.3f}"
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and t interval (sample std, df = n − 1) of the finite values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(float("nan"), float("nan"), 0)
    mean = sum(xs) / n
    if n < 2:
        return Interval(mean, float("nan"), n)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return Interval(mean, t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n), n)


def paired_cell(after: Sequence[dict[str, float]], before: Sequence[dict[str, float]], key: str, digits: int = 3) -> str:
    """The run-paired difference after − before of ``key``: its mean and interval, then each run's."""
    deltas = [a[key] - b[key] for a, b in zip(after, before)]
    return f"{mean_interval(deltas)} ({', '.join(f'{d:+.{digits}f}' for d in deltas)})"


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's r; NaN when either side is constant (a Composer that always asks 3 questions)."""
    if len(xs) != len(ys):
        raise ValueError(f"pearson needs equal lengths, got {len(xs)} and {len(ys)}")
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-12 or syy <= 1e-12:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def enough_minus_short(rows: Sequence[dict[str, float]], metric: str) -> float:
    """Mean ``metric`` of episodes that asked ≥ events questions minus that of those that asked fewer,
    within each event count, averaged with weights n_enough · n_short / n (a stratum with only one
    side says nothing); NaN when no stratum has both."""
    strata: dict[float, tuple[list[float], list[float]]] = {}
    for r in rows:
        enough, short = strata.setdefault(r["events"], ([], []))
        (enough if r["questions"] >= r["events"] else short).append(r[metric])
    total = weight = 0.0
    for enough, short in strata.values():
        if enough and short:
            w = len(enough) * len(short) / (len(enough) + len(short))
            total += w * (sum(enough) / len(enough) - sum(short) / len(short))
            weight += w
    return total / weight if weight else float("nan")


# --- one demo over seeds ----------------------------------------------------------------------
def load_runs(name: str, seeds: Sequence[str], root: str = "runs") -> dict[str, str]:
    """Run folders by seed, ``<root>/<name>-demo-s<seed>``, each with its summary.json."""
    runs = {}
    for seed in seeds:
        folder = os.path.join(root, f"{name}-demo-s{seed}")
        if not os.path.isfile(os.path.join(folder, "summary.json")):
            raise FileNotFoundError(f"{folder}/summary.json: no finished run for seed {seed}")
        runs[seed] = folder
    return runs


def read_summary(folder: str) -> dict:
    """A finished run's summary.json: each evaluated stage's figures by metric."""
    with open(os.path.join(folder, "summary.json")) as f:
        return json.load(f)


def item_changes(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], metric: str
                 ) -> dict[str, float]:
    """after − before of ``metric`` by item id, on every item both stages evaluated."""
    shared = sorted(set(before) & set(after))
    return {i: after[i][metric] - before[i][metric] for i in shared if metric in before[i] and metric in after[i]}


def paired_items(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], metric: str) -> list[float]:
    """after − before of ``metric`` on every item both stages evaluated."""
    return list(item_changes(before, after, metric).values())


def stage_items(folder: str, pair: tuple[str, str]) -> list[dict[str, dict[str, float]]]:
    """A run's held-out items (evaluation rows and benchmark questions) at both stages of ``pair``."""
    return [{**read_eval_items(folder, st), **read_benchmark_items(folder, st)} for st in pair]


def change(summary: dict, items: list[dict[str, dict[str, float]]], pair: tuple[str, str], metric: str
           ) -> tuple[float, dict[str, float]]:
    """One run's after − before of ``metric``: in its summary, and per held-out item."""
    before, after = pair
    return (summary[after].get(metric, float("nan")) - summary[before].get(metric, float("nan")),
            item_changes(items[0], items[1], metric))


def against_control(name: str, seeds: Sequence[str], pairs: Sequence[tuple[str, str]], root: str, control: str,
                    names: Sequence[str]) -> list[str]:
    """Each pair's change minus the control runs' change, over seeds and over (seed, item) pairs."""
    sides = []
    for folder in (root, control):
        runs = load_runs(name, seeds, folder)
        sides.append({s: (read_summary(f), f) for s, f in runs.items()})
    lines = []
    for pair in pairs:
        lines += ["", f"{pair[1]} − {pair[0]} minus the same in {control} (same seeds): over seeds, and over the "
                  "held-out items both evaluated, seed by seed.", "",
                  "| metric | Δ here | Δ control | here − control over seeds | over items | per seed |",
                  "|---|---|---|---|---|---|"]
        items = [{s: stage_items(side[s][1], pair) for s in seeds} for side in sides]
        for m in names:
            here, there = ([change(side[s][0], got[s], pair, m) for s in seeds] for side, got in zip(sides, items))
            diffs = [h[0] - c[0] for h, c in zip(here, there)]
            per_item = [h[1][i] - c[1][i] for h, c in zip(here, there) for i in sorted(set(h[1]) & set(c[1]))]
            lines.append(f"| {m} | {mean_interval([h[0] for h in here])} | {mean_interval([c[0] for c in there])} | "
                         f"{mean_interval(diffs)} | {mean_interval(per_item)} (n={len(per_item)}) | "
                         + ", ".join(f"{d:+.3f}" for d in diffs) + " |")
    return lines


def report(name: str, seeds: Sequence[str], pairs: Sequence[tuple[str, str]], root: str = "runs",
           metrics: Sequence[str] | None = None, control: str | None = None) -> str:
    """The markdown tables for one demo (what ``tools/seeds.sh`` prints)."""
    runs = load_runs(name, seeds, root)
    summaries = {s: read_summary(f) for s, f in runs.items()}
    # the stages every seed evaluated (one run may also hold an `agentcap evaluate` entry)
    stages = [st for st in next(iter(summaries.values())) if all(st in r for r in summaries.values())]
    names = metrics or sorted({m for r in summaries.values() for st in r.values() for m in st})
    tuned = [s for s in seeds if s.isdigit() and int(s) in TUNED_SEEDS]
    lines = [f"## {name}: seeds {', '.join(seeds)}" + (f" (tuned on: {', '.join(tuned)})" if tuned else " (none tuned on)"),
             f"Means over seeds with 95 % t intervals; tuned seeds in earlier stops: {', '.join(map(str, TUNED_SEEDS))}.", "",
             "| stage | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for stage in stages:
        cells = [str(mean_interval([summaries[s][stage].get(m, float("nan")) for s in seeds])) for m in names]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines += ["", numerics_line(runs)]
    for before, after in pairs:
        items = {s: stage_items(f, (before, after)) for s, f in runs.items()}
        lines += ["", f"Paired {after} − {before}: over seeds (df = seeds − 1), and over held-out items pooled over seeds.", "",
                  "| metric | before | after | Δ over seeds | Δ over items | per seed |", "|---|---|---|---|---|---|"]
        for m in names:
            b = [summaries[s][before].get(m, float("nan")) for s in seeds]
            a = [summaries[s][after].get(m, float("nan")) for s in seeds]
            diffs = [y - x for x, y in zip(b, a)]
            per_item = [d for s in seeds for d in paired_items(*items[s], m)]
            per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
            lines.append(f"| {m} | {mean_interval(b)} | {mean_interval(a)} | {mean_interval(diffs)} | "
                         f"{mean_interval(per_item)} (n={len(per_item)}) | {per_seed} |")
    correlations, payoffs = [], []
    for stage in stages:
        per_seed, payoff = [], {"g2p_evidence": [], "g2p_final": []}
        for s, folder in runs.items():
            try:
                rows = list(read_eval_items(folder, stage).values())
            except FileNotFoundError:
                break
            rows = [r for r in rows if "questions" in r and "events" in r]
            if rows:
                per_seed.append(pearson([r["questions"] for r in rows], [r["events"] for r in rows]))
            if rows and all(m in r for r in rows for m in payoff):
                for m, values in payoff.items():
                    values.append(enough_minus_short(rows, m))
        if len(per_seed) == len(seeds):
            values = ", ".join("n/a" if math.isnan(r) else f"{r:.3f}" for r in per_seed)
            r = mean_interval(per_seed)
            of = f" ({r.n} of {len(seeds)} seeds)" if 0 < r.n < len(seeds) else ""  # n/a seeds asked a constant count
            correlations.append(f"| {stage} | {r}{of} | {values} |")
        if all(len(v) == len(seeds) and not any(map(math.isnan, v)) for v in payoff.values()):
            payoffs.append(f"| {stage} | {mean_interval(payoff['g2p_evidence'])} | {mean_interval(payoff['g2p_final'])} |")
    if correlations:
        lines += ["", "Pearson r(questions asked, events in the clip) over held-out clips "
                  "(n/a: the Composer asked the same number every time).", "",
                  "| stage | r over seeds | per seed |", "|---|---|---|", *correlations]
    if payoffs:
        lines += ["", "What asking enough pays: G2P when the Composer asked ≥ as many questions as the clip has "
                  "events, minus when it asked fewer, within clips of equal event count (stages where every "
                  "seed has both kinds).", "",
                  "| stage | G2P(E): enough − fewer | G2P(c^F): enough − fewer |", "|---|---|---|", *payoffs]
    if control is not None:
        lines += against_control(name, seeds, pairs, root, control, names)
    return "\n".join(lines)


def numerics_line(runs: dict[str, str]) -> str:
    """What the seeds ran on (``numerics.json``): one line when they agree, else each seed's; the
    same seed repeats its figures only on the same numerics."""
    described = {}
    for seed, folder in runs.items():
        start = numerics.first_start(folder)
        described[seed] = numerics.describe(start) if start is not None else "not recorded"
    if len(set(described.values())) == 1:
        return f"Numerics (run_dir/numerics.json, every seed): {next(iter(described.values()))}."
    return "Numerics differ between seeds: " + "; ".join(f"seed {s}: {d}" for s, d in described.items()) + "."


def parse_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in filter(None, text.split(",")):
        before, sep, after = part.partition(":")
        if not sep or not before or not after:
            raise SystemExit(f"--pairs: expected BEFORE:AFTER[,BEFORE:AFTER...], got {part!r}")
        pairs.append((before, after))
    return pairs


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="demo name: runs/<name>-demo-s<seed>")
    parser.add_argument("seeds", nargs="+")
    parser.add_argument("--pairs", default="", help="BEFORE:AFTER stage pairs, comma-separated")
    parser.add_argument("--metrics", default="", help="comma-separated metrics (default: all)")
    parser.add_argument("--root", default="runs")
    parser.add_argument("--control", default=None,
                        help="root of the same seeds' control runs: each pair's change minus theirs")
    args = parser.parse_args(argv)
    text = report(args.name, args.seeds, parse_pairs(args.pairs), args.root,
                  [m for m in args.metrics.split(",") if m] or None, args.control)
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
