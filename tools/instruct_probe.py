"""Does the Instruct know more than the Captioner's c0 says? A perception probe of real-speech ACE-Cap runs.

The evidence game gains only where an answer states a fact c0 lacks. This asks a run's Instruct,
greedily and with the run's own greedy c0 as the evidence so far (as in a held-out game), "When is the
<sound> heard?" for each of the world's six sound effects on each held-out clip, present or not, and
compares what it claims with the clip's gold events and with whether c0 already names the sound:

- claims: the answer states a time and no negation (the form "The bell is heard from 0.2 s to 0.4 s");
- on time: a claim whose first time is within 0.5 s of the sound's gold onset;
- beyond c0: the sounds c0 does not name. There, a claim rate on present sounds above the rate on
  absent ones is information the game can add; equal rates are a yes-sayer, whose answers carry none.

    OMP_NUM_THREADS=1 python tools/instruct_probe.py --config configs/real/acecap-supported.yaml \\
        --checkpoint runs/real/v8/acecap-demo-s21/checkpoints/last.ckpt --clips 16 --out probe-s21.jsonl

On an AudioMap run (``configs/real/audiomap-sft-qa.yaml``, whose warm start also answers questions)
its policy writes c0 and answers, hearing each question without c0 (the form of its question turns).

One JSON row per (clip, sound) goes to ``--out``; the table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

_TIME = re.compile(r"(\d+(?:\.\d+)?)\s*s\b")
_NEGATION = re.compile(r"\b(not|no|never|none)\b", re.I)


def claim(answer: str) -> tuple[bool, float | None]:
    """(whether the answer says the sound is heard at a time, that first time)."""
    times = _TIME.findall(answer)
    if not times or _NEGATION.search(answer):
        return False, None
    return True, float(times[0])


def named(caption: str, effect) -> bool:
    text = caption.lower()
    return effect.name in text or effect.key in text


def probe_rows(items, c0s, answers, effects) -> list[dict]:
    rows, k = [], 0
    for item, c0 in zip(items, c0s):
        onsets = {e["label"]: e["onset"] for e in item["events"] if e["type"] == "effect"}  # by caption name
        for effect in effects:
            said, at = claim(answers[k])
            present = effect.name in onsets
            rows.append({"id": item["id"], "sound": effect.name, "present": present, "in_c0": named(c0, effect),
                         "claims": said, "on_time": bool(said and present and abs(at - onsets[effect.name]) <= 0.5),
                         "answer": answers[k], "c0": c0})
            k += 1
    return rows


def rate(rows, **where) -> str:
    picked = [r for r in rows if all(r[key] == value for key, value in where.items())]
    if not picked:
        return "— (0)"
    return f"{sum(r['claims'] for r in picked) / len(picked):.2f} ({len(picked)})"


def table(rows) -> str:
    on_time = [r for r in rows if r["present"] and r["claims"]]
    lines = [
        "| sounds | Instruct claims heard: present | absent |",
        "|---|---|---|",
        f"| all | {rate(rows, present=True)} | {rate(rows, present=False)} |",
        f"| named in c0 | {rate(rows, present=True, in_c0=True)} | {rate(rows, present=False, in_c0=True)} |",
        f"| not named in c0 (what the game can add) | {rate(rows, present=True, in_c0=False)} | "
        f"{rate(rows, present=False, in_c0=False)} |",
        "",
        f"c0 names a present sound in {sum(r['in_c0'] for r in rows if r['present'])} of "
        f"{sum(r['present'] for r in rows)}, an absent one in {sum(r['in_c0'] for r in rows if not r['present'])} of "
        f"{sum(not r['present'] for r in rows)}; claims on a present sound on time (0.5 s): "
        f"{sum(r['on_time'] for r in on_time)} of {len(on_time)}; distinct answers: {len({r['answer'] for r in rows})}",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint", help="weights (default: the run's newest checkpoint)")
    p.add_argument("--clips", type=int, default=16, help="the first N test clips")
    p.add_argument("--out", required=True, help="JSONL, one row per (clip, sound)")
    args = p.parse_args(argv)

    import torch

    from agentcap.core.episode import Episode
    from agentcap.training.loading import trained_module
    from agentcap_envs.real.speech import EFFECTS

    torch.manual_seed(0)
    module = trained_module(args.config, args.checkpoint)
    env = module.env_config.make("test").unwrapped
    items = env.items[: args.clips]
    batch = module.generation_batch_size
    game = hasattr(env, "instruct_obs")  # else an AudioMap run: its policy captions and answers
    captioner, instruct = (module.agents["captioner"], module.agents["instruct"]) if game else (module.agents["policy"],) * 2
    with torch.no_grad():
        c0s = [g.text for g in captioner.generate(
            [env.captioner_obs(item) if game else env.begin(Episode(item=dict(item))) for item in items],
            greedy=True, batch_size=batch, old_logprobs=False)]
        # the game's Instruct reads c0 before the question; AudioMap's policy hears the question alone
        observations = [env.instruct_obs(item, c0, [], f"When is the {effect.name} heard?") if game
                        else env.question_obs(item, f"When is the {effect.name} heard?")
                        for item, c0 in zip(items, c0s) for effect in EFFECTS]
        answers = [g.text for g in instruct.generate(observations, greedy=True, batch_size=batch, old_logprobs=False)]
    rows = probe_rows(items, c0s, answers, EFFECTS)
    with open(args.out, "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in rows)
    print(table(rows))


if __name__ == "__main__":
    main()
