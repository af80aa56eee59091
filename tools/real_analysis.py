"""What the real-speech AudioMap captions say, before and after GRPO, against the clips' events.

The benchmark and the rewards read captions through examiners; this reads them against the world's
own event lists (``data/real_speech/test.jsonl``), so a gain can be told apart from enumeration:
events named per clip against the clip's events, precision and recall of the named sound effects,
spoken sentences quoted against those said, quotes that are another training recording's transcript
word for word (what a model that looks sentences up, not transcribes, writes), repeated sentences,
length against the reference, and ESR split by what its cloze question asks (an effect's name, an
onset, a quoted word, an order), so a change in ESR can be traced to the part of the caption that
moved. Each sentence's leave-one-out share of the run's own reward (what per-sentence credit trains
with), averaged over a caption's quote sentences and over its sound-effect sentences, shows which
kind of sentence the reward pays more. Where a stage has a benchmark evaluation, its stored
captions are also judged again by the current rule judge (``RuleJudge``; its version names the rows), so runs judged by an older version
can be compared under the new one without captioning anything again. Means over runs with 95 % t
intervals, and the paired after − before differences.

    python tools/real_analysis.py runs/real/audiomap-demo-s4 runs/real/audiomap-demo-s5 \\
        --stages before_grpo,after_grpo
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agentcap.core.episode import Action, Episode  # noqa: E402
from agentcap.evaluation.benchmark import Ask, RuleJudge  # noqa: E402
from agentcap.evaluation.seeds import mean_interval, paired_cell  # noqa: E402
from agentcap.judges.questions import question_bank, sentence_spans, sentences  # noqa: E402
from agentcap.judges.rule import RuleExaminer  # noqa: E402
from agentcap.rewards.functional.cloze import answer_scores  # noqa: E402
from agentcap_envs.cloze_caption import ClozeCaptionEnv  # noqa: E402
from agentcap_envs.real.speech import EFFECTS  # noqa: E402

_QUOTE = re.compile(r'"([^"]+)"')
#: The cloze attributes of the real-speech world's banks (agentcap_envs.real.speech), in table order.
ATTRIBUTES = ("name", "onset", "word", "order")
#: The real-speech benchmark's categories, and the subcategories rule judge v3 reads differently from v2.
CATEGORIES = ("sound events", "speech content", "temporal order")
SUBCATEGORIES = ("onset", "effect count")


def _named_effects(text: str) -> set[str]:
    return {e.name for e in EFFECTS if re.search(rf"\b{re.escape(e.name)}\b", text, re.IGNORECASE)}


def caption_figures(caption: str, item: dict, training_quotes: frozenset[str] = frozenset(),
                    examiner: RuleExaminer | None = None) -> dict[str, float]:
    """One caption's figures against its clip's event list; ``training_quotes`` are the training
    recordings' transcripts (lower case), and ``examiner`` (the rule examiner by default) answers the
    clip's cloze bank for the ESR parts (NaN where the bank asks nothing of that kind)."""
    events = item["events"]
    gold_effects = {e["label"] for e in events if e["type"] == "effect"}
    gold_effects = {x.name for x in EFFECTS if x.key in gold_effects or x.name in gold_effects}
    gold_quotes = {e["transcript"].lower() for e in events if e["type"] == "speech"}
    parts = sentences(caption)
    named = _named_effects(caption)
    quotes = [q.lower() for q in _QUOTE.findall(caption)]
    return {
        "words": len(caption.split()),
        "words / reference": len(caption.split()) / max(1, len(item["caption"].split())),
        "sentences - events": len(parts) - len(events),
        "more sentences than events": float(len(parts) > len(events)),
        "repeated sentence": float(len({re.sub(r"^from [\d.]+ s to [\d.]+ s, ", "", p.lower()) for p in parts})
                                   < len(parts)),
        "effect precision": len(named & gold_effects) / len(named) if named else float("nan"),
        "effect recall": len(named & gold_effects) / len(gold_effects) if gold_effects else float("nan"),
        "quotes - speech events": len(quotes) - len(gold_quotes),
        "exact quotes": sum(q in gold_quotes for q in quotes) / len(quotes) if quotes else float("nan"),
        "another recording's transcript": (sum(q not in gold_quotes and q in training_quotes for q in quotes)
                                           / len(quotes) if quotes else float("nan")),
        "truncated (no final period)": float(not caption.rstrip().endswith((".", '."'))),
        **esr_parts(caption, item, examiner or RuleExaminer()),
    }


def esr_parts(caption: str, item: dict, examiner: RuleExaminer) -> dict[str, float]:
    """Eq. 3's mean score over the clip's cloze questions of each attribute (its ESR, split)."""
    bank = question_bank(item)
    scores = answer_scores(examiner.answer([caption] * len(bank), bank), [q.answer for q in bank])
    parts = {}
    for attribute in ATTRIBUTES:
        mine = [float(s) for q, s in zip(bank, scores) if (q.meta or {}).get("attribute") == attribute]
        parts[f"ESR {attribute}"] = mean_interval(mine).mean  # NaN (invalid reply, or none asked) left out, as ESR does
    return parts


def benchmark_figures(run: str, stage: str, judge: RuleJudge | None = None) -> dict[str, float]:
    """The stage's benchmark accuracy as it was judged in the run, and judged again by ``judge`` (the
    current rule judge) overall, per category and for :data:`SUBCATEGORIES`; all NaN when the stage
    has no benchmark evaluation. A clip that failed to caption stays wrong, as in the run."""
    judge = judge or RuleJudge()
    rejudged = f"benchmark ({judge.identity})"
    keys = ["benchmark (as run)", rejudged, *(f"{rejudged} {g}" for g in CATEGORIES + SUBCATEGORIES)]
    path = os.path.join(run, "benchmarks", stage, "benchmark_items.jsonl")
    if not os.path.exists(path):
        return dict.fromkeys(keys, float("nan"))
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    answers = iter(judge.choose([Ask(r["caption"], r["question"], tuple(r["choices"]))
                                 for r in rows if r.get("caption") is not None]))
    right = [float(r.get("caption") is not None and next(answers) == r["answer"]) for r in rows]

    def accuracy(group: str | None) -> float:
        mine = [ok for r, ok in zip(rows, right) if group is None or group in (r.get("category"), r.get("subcategory"))]
        return sum(mine) / len(mine) if mine else float("nan")

    return {keys[0]: sum(bool(r["correct"]) for r in rows) / len(rows), rejudged: accuracy(None),
            **{f"{rejudged} {g}": accuracy(g) for g in CATEGORIES + SUBCATEGORIES}}


def sentence_shares(captions: Sequence[str], items: Sequence[dict], env_kwargs: dict) -> list[dict[str, float]]:
    """Per caption, the mean leave-one-out share of its quote sentences and of its other (sound-effect)
    sentences, scored as ``ClozeCaption-v0`` with ``env_kwargs`` scores them (NaN where it has none);
    then, in captions with both kinds, the quote's mean share minus the effect's, in all and by each
    weighted reward component alone (which term pays which kind of sentence)."""
    kwargs = {k: v for k, v in env_kwargs.items() if k not in ("manifest", "items", "credit", "defer_scoring")}
    out = _kind_shares(captions, items, kwargs)
    by_term = {name: _kind_shares(captions, items, {**kwargs, "weights": {name: w}, "credit_terms": None})
               for name, w in (kwargs.get("weights") or {}).items() if w}
    for suffix, shares in {"": out, **{f", {name}": alone for name, alone in by_term.items()}}.items():
        for row, kinds in zip(out, shares):
            row[f"quote - effect share{suffix}"] = kinds["share, quote sentence"] - kinds["share, effect sentence"]
    return out


def _kind_shares(captions: Sequence[str], items: Sequence[dict], kwargs: dict) -> list[dict[str, float]]:
    env = ClozeCaptionEnv(items=list(items), credit="sentence", **kwargs)
    scores = env.score([Episode(item, actions=[Action("policy", "caption", caption)])
                        for caption, item in zip(captions, items)])
    out = []
    for caption, score in zip(captions, scores):
        kinds: dict[str, list[float]] = {"share, quote sentence": [], "share, effect sentence": []}
        for (start, end), (_, share) in zip(sentence_spans(caption), score.text_credit[0] or []):
            quoted = _QUOTE.search(caption[start:end]) is not None
            kinds["share, quote sentence" if quoted else "share, effect sentence"].append(share)
        out.append({k: sum(v) / len(v) if v else float("nan") for k, v in kinds.items()})
    return out


def _run_env_kwargs(run: str) -> dict | None:
    """The ClozeCaption-v0 settings a run was trained with (its ``config.yaml``), or None."""
    path = os.path.join(run, "config.yaml")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        env = (yaml.safe_load(handle).get("model") or {}).get("env") or {}
    return env.get("kwargs") if env.get("id") == "agentcap/ClozeCaption-v0" else None


def stage_figures(run: str, stage: str, items: dict[str, dict],
                  training_quotes: frozenset[str] = frozenset()) -> dict[str, float]:
    """Each figure's mean over the stage's captions (NaNs, e.g. no effect named, left out), then the
    stage's benchmark figures (:func:`benchmark_figures`)."""
    path = os.path.join(run, "eval", f"{stage}.jsonl")
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    examiner = RuleExaminer()
    per = [caption_figures(r["caption"], items[r["id"]], training_quotes, examiner) for r in rows]
    env_kwargs = _run_env_kwargs(run)
    if env_kwargs is not None:
        shares = sentence_shares([r["caption"] for r in rows], [items[r["id"]] for r in rows], env_kwargs)
        per = [{**p, **q} for p, q in zip(per, shares)]
    return {**{k: mean_interval([p[k] for p in per]).mean for k in per[0]}, **benchmark_figures(run, stage)}


def main(argv: Sequence[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--stages", default="before_grpo,after_grpo")
    p.add_argument("--manifest", default="data/real_speech/test.jsonl", help="the evaluated clips")
    p.add_argument("--training", default="data/real_speech/train.jsonl",
                   help="the training clips, whose transcripts a looked-up quote repeats")
    args = p.parse_args(argv)
    with open(args.manifest, encoding="utf-8") as handle:
        items = {row["id"]: row for row in map(json.loads, handle)}
    with open(args.training, encoding="utf-8") as handle:
        training_quotes = frozenset(e["transcript"].lower() for row in map(json.loads, handle)
                                    for e in row["events"] if e["type"] == "speech")
    stages = args.stages.split(",")
    figures = {s: [stage_figures(run, s, items, training_quotes) for run in args.runs] for s in stages}
    keys = list(figures[stages[0]][0])
    lines = ["| figure | " + " | ".join(stages) + " | " + " | ".join(f"{a} → {b}" for a, b in zip(stages, stages[1:]))
             + " |", "|---" * (2 * len(stages)) + "|"]
    for k in keys:
        cells = [str(mean_interval([f[k] for f in figures[s]])) for s in stages]
        cells += [paired_cell(figures[after], figures[before], k, 2) for before, after in zip(stages, stages[1:])]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
