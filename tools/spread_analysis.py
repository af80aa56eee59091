"""Where a GRPO run had nothing to learn from: groups whose utilities are all equal, per stage and kind.

GRPO learns only from spread inside a group; a group whose utilities tie gets zero advantages. This
reads each run's offline W&B history (``utility/<kind>/zero_spread``, the fraction of a step's groups
that tie) and its ``samples.jsonl`` (the first group of sampled steps: how many distinct questions the
Composer asked and how many distinct answers the Instruct gave), per GRPO stage, summed over runs;
and, per evaluation, what the Composer's final caption did to c0 in the held-out games
(``eval/<stage>.jsonl`` traces): copied it word for word (then the question and the answer change
nothing, and every Composer group ties), or stated fewer or more sentences than it; and in how many
the answers raised G2P above c0's (R_G(E) > R_G(c0): the evidence told the examiner something new).
Last, what a group's spread is about: per stage, each reward component's standard deviation inside the
logged groups and its correlation with the advantage (a component the advantage does not follow is
one GRPO cannot be teaching, whatever its weight), the same for the response's length in words, and
how many groups differ only in their numbers (the same words, other onsets: the advantage is timing).

    python tools/spread_analysis.py runs/real/v5/acecap-demo-s12 runs/real/v5/acecap-demo-s13 \\
        --config configs/real/acecap.yaml
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from audiomap_analysis import wandb_history  # noqa: E402

from agentcap.judges.questions import sentences  # noqa: E402
from agentcap.resume.appended import read_appended  # noqa: E402


def zero_spread(run: str, stages: list[dict], groups_per_step: int) -> dict[tuple[str, str], tuple[float, int]]:
    """(stage, kind) -> (groups that tie, groups) over the run's GRPO steps."""
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for row in wandb_history(run):
        if "stage" not in row:
            continue
        name = stages[int(row["stage"])]["name"]
        for key, value in row.items():
            if key.startswith("utility/") and key.endswith("/zero_spread"):
                cell = out[(name, key.split("/")[1])]
                cell[0] += value * groups_per_step
                cell[1] += groups_per_step
    return {k: (round(v[0]), v[1]) for k, v in out.items()}


def sampled_groups(run: str) -> dict[str, list[tuple[int, int]]]:
    """stage -> per logged group (distinct questions asked, distinct answers given)."""
    ticks: dict[tuple[str, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for (stage, tick, agent, kind), rows in logged_groups(run).items():
        texts = {str(r["response"]).strip() for r in rows}
        if kind == "question":
            ticks[(stage, tick)]["questions"] |= texts
        elif agent == "instruct":
            ticks[(stage, tick)]["answers"] |= texts
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (stage, _), seen in sorted(ticks.items()):
        if seen["questions"]:
            out[stage].append((len(seen["questions"]), len(seen["answers"])))
    return out


def logged_groups(run: str) -> dict[tuple[str, int, str, str], list[dict]]:
    """(stage, tick, agent, kind) -> the rows of that step's logged group in ``samples.jsonl``."""
    path = os.path.join(run, "samples.jsonl")
    groups: dict[tuple[str, int, str, str], list[dict]] = defaultdict(list)
    if os.path.exists(path):
        for _, row in read_appended(path):  # a torn last line is named and dropped
            groups[(row["stage"], row["tick"], row.get("agent", ""), row.get("kind", ""))].append(row)
    return groups


def component_spread(run: str) -> dict[str, dict[str, tuple[float, float, int]]]:
    """stage -> reward component (or ``words``) -> (mean std inside the logged groups, Pearson r of the
    advantage with its deviation from the group mean (nan where either has no spread), groups), over
    the sampled steps' logged groups."""
    groups = logged_groups(run)
    for rows in groups.values():
        for row in rows:
            row["words"] = len(str(row.get("response", "")).split())  # does the advantage favour shorter ones?
    pooled: dict[str, dict[str, list[list[float]]]] = defaultdict(lambda: defaultdict(lambda: [[], [], []]))
    for (stage, *_), rows in groups.items():
        if len(rows) < 2 or any("advantage" not in r for r in rows):
            continue
        for name in dict.fromkeys(k for r in rows for k in r if k in ("reward", "words") or k.startswith("reward/")):
            values = np.array([r.get(name, np.nan) for r in rows], dtype=float)
            if np.isnan(values).any():
                continue
            stds, deviations, advantages = pooled[stage][name]
            stds.append(float(values.std()))
            deviations.extend(values - values.mean())
            advantages.extend(float(r["advantage"]) for r in rows)
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for stage, names in pooled.items():
        out[stage] = {}
        for name, (stds, deviations, advantages) in names.items():
            spread = np.std(deviations) > 0 and np.std(advantages) > 0
            r = float(np.corrcoef(deviations, advantages)[0, 1]) if spread else math.nan
            out[stage][name] = (float(np.mean(stds)), r, len(stds))
    return out


def number_only_groups(run: str) -> dict[str, tuple[int, int]]:
    """stage -> (logged groups whose responses differ, but only in their numbers; logged groups whose
    responses differ): where every rollout says the same words, the advantage can only be about the
    numbers (AudioMap's onsets and ends)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (stage, *_), rows in logged_groups(run).items():
        texts = [str(r.get("response", "")) for r in rows]
        if len(set(texts)) > 1:
            out[stage][0] += len({re.sub(r"\d+(\.\d+)?", "#", t) for t in texts}) == 1
            out[stage][1] += 1
    return {stage: (n, m) for stage, (n, m) in out.items()}


def turns(trace: str) -> dict[str, str]:
    """The last text of each ``role/kind`` of an episode trace (one ``role/kind: text`` per turn)."""
    found: dict[str, str] = {}
    for block in trace.split("\n"):
        if ": " in block and "/" in block.split(": ", 1)[0]:
            key, text = block.split(": ", 1)
            found[key] = text.strip()
        elif found:  # a turn's text that spans lines
            key = list(found)[-1]
            found[key] += "\n" + block
    return found


def rewrites(run: str, stages: list[dict]) -> dict[str, tuple[int, int, int, int, int]]:
    """Per evaluation: (games, c^F == c0, fewer sentences than c0, more, games whose answers raised
    G2P: R_G(E) > R_G(c0)) over the held-out games."""
    out = {}
    for stage in (s["name"] for s in stages if s["kind"] == "evaluate"):
        path = os.path.join(run, "eval", f"{stage}.jsonl")
        if not os.path.exists(path):
            continue
        rows = [row for _, row in read_appended(path)]
        games = [(turns(row.get("trace", "")), row) for row in rows]
        games = [(g, row) for g, row in games if "captioner/caption" in g and "composer/final" in g]
        pairs = [(g["captioner/caption"], g["composer/final"]) for g, _ in games]
        counts = [(len(sentences(c0)), len(sentences(final))) for c0, final in pairs]
        informed = sum(row.get("g2p_evidence", 0.0) > row.get("g2p_c0", 0.0) + 1e-9 for _, row in games)
        out[stage] = (len(pairs), sum(c0 == final for c0, final in pairs),
                      sum(f < c for c, f in counts), sum(f > c for c, f in counts), informed)
    return out


def main(argv: Sequence[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--config", required=True, help="the runs' recipe (stage names, group and batch sizes)")
    args = p.parse_args(argv)
    with open(args.config) as handle:
        model = yaml.safe_load(handle)["model"]
    stages, groups = model["stages"], model["rollout_batch_size"] // model["group_size"]
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    per_run: dict[tuple[str, str], list[str]] = defaultdict(list)
    for run in args.runs:
        for key, (tied, n) in zero_spread(run, stages, groups).items():
            totals[key][0] += tied
            totals[key][1] += n
            per_run[key].append(f"{tied}/{n}")
    lines = ["| stage | utility kind | groups without spread | per run |", "|---|---|---|---|"]
    order = {s["name"]: i for i, s in enumerate(stages)}
    for (stage, kind), (tied, n) in sorted(totals.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        lines.append(f"| {stage} | {kind} | {tied} of {n} | {', '.join(per_run[(stage, kind)])} |")
    lines += ["", "| run | stage | logged groups: (distinct questions, distinct answers) |", "|---|---|---|"]
    for run in args.runs:
        for stage, cells in sampled_groups(run).items():
            lines.append(f"| {os.path.basename(run)} | {stage} | {' '.join(f'({q}, {a})' for q, a in cells)} |")
    lines += ["", "| run | evaluation | held-out games | c^F = c0 | fewer sentences than c0 | more | answers raise G2P |",
              "|---|---|---|---|---|---|---|"]
    for run in args.runs:
        for stage, (n, same, fewer, more, informed) in rewrites(run, stages).items():
            lines.append(f"| {os.path.basename(run)} | {stage} | {n} | {same} | {fewer} | {more} | {informed} |")
    lines += ["", "| run | stage | reward component or words | std inside a group | r with the advantage | logged groups |",
              "|---|---|---|---|---|---|"]
    for run in args.runs:
        for stage, names in component_spread(run).items():
            for name, (std, r, n) in names.items():
                corr = "—" if math.isnan(r) else f"{r:+.2f}"
                lines.append(f"| {os.path.basename(run)} | {stage} | {name} | {std:.3f} | {corr} | {n} |")
    lines += ["", "| run | stage | logged groups that differ only in their numbers |", "|---|---|---|"]
    for run in args.runs:
        for stage, (numbers, differ) in number_only_groups(run).items():
            lines.append(f"| {os.path.basename(run)} | {stage} | {numbers} of {differ} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
