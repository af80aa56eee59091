"""Time and peak memory of loading a big audio manifest with ``--limit 10``: streamed against whole.

Why (issue 34, case 11): a 1,000,000-row manifest was read and checked whole before ``--limit 10``
applied (118 s, 3.7 GB), and every audio row was decoded at load (about 1.8 ms a row). Now the
reading stops at the limit (``read_manifest(limit=...)``, ``agentcap.core.env.first_rows``, which
``caption`` and ``evaluate --limit`` use), and the load reads each clip's header; the samples are
decoded when the item is used.

Each measurement loads ``agentcap/ClozeCaption-v0`` in a fresh process and reports its wall time and
its peak RSS above what it held after its imports (``ru_maxrss``):

- ``before``: the old path: every row read and checked, every clip decoded at load
  (``audio_check="decode"``, no limit), then the first 10 items taken. It costs ~2 ms a row, so it runs
  on ``--before-rows`` rows (default 20,000) and is scaled to ``--rows`` linearly (its time and its
  memory grow with the rows: every row is checked and kept); the printout says so.
- ``whole``: every row read, headers only (no limit): what a ``fit`` on the file pays at load now.
- ``after``: ``first_rows(10)``, headers only, on the ``--rows`` manifest itself.

    python tools/bench_manifest.py                    # 1,000,000 rows (before: 20,000 rows, scaled)
    python tools/bench_manifest.py --smoke            # 2,000 rows (before: 500) (CI)
    python tools/bench_manifest.py --worker after --manifest m.jsonl --limit 10   # one process
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

CLIPS, SECONDS, RATE = 16, 5.0, 16000


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def write_world(folder: str) -> None:
    """``CLIPS`` tones of ``SECONDS`` s under ``folder/audio``."""
    import numpy as np
    import soundfile

    os.makedirs(os.path.join(folder, "audio"), exist_ok=True)
    t = np.arange(int(SECONDS * RATE)) / RATE
    for k in range(CLIPS):
        wave = (0.3 * np.sin(2 * np.pi * (220 + 40 * k) * t)).astype(np.float32)
        soundfile.write(os.path.join(folder, "audio", f"clip{k}.wav"), wave, RATE)


def write_manifest(path: str, rows: int) -> str:
    """``rows`` ClozeCaption rows (audio, caption, one cloze question, one anchor) over the clips."""
    with open(path, "w", encoding="utf-8") as handle:
        for n in range(rows):
            row = {
                "id": f"r{n}", "audio": f"audio/clip{n % CLIPS}.wav", "duration": SECONDS,
                "caption": "From 1.0 s to 2.0 s, a loud low chirp sounds twice.",
                "cloze": [{"passage": "From 1.0 s to 2.0 s, a loud low ___ sounds twice.",
                           "options": ["knock", "buzz", "beep", "chirp", "Not given"], "answer": "D"}],
                "anchors": [{"event": "a loud low chirp", "start": 1.0, "end": 2.0}],
            }
            handle.write(json.dumps(row) + "\n")
    return path


def worker(mode: str, manifest: str, limit: int) -> dict:
    """Load ``manifest`` as ``mode`` says in this process; the peak RSS it added and the time it took."""
    import gymnasium as gym
    import soundfile  # noqa: F401  (imported before the baseline: their code is not the load's memory)
    import torchaudio.functional  # noqa: F401

    import agentcap_envs  # registers the environments
    import agentcap_envs.cloze_caption  # noqa: F401  (gym.make would import it inside the measurement)
    from agentcap.core.env import first_rows

    before = peak_rss_bytes()
    start = time.perf_counter()
    if mode == "before":  # the whole file checked and every clip decoded, then the limit
        env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest, audio_check="decode").unwrapped
        items = env.items[:limit]
    else:
        with first_rows(limit if mode == "after" else None):
            env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest).unwrapped
        items = env.items[:limit]
    seconds = time.perf_counter() - start
    return {"mode": mode, "rows_loaded": len(env.items), "items": len(items), "seconds": seconds,
            "peak_increase": peak_rss_bytes() - before}


def measure(mode: str, manifest: str, limit: int) -> dict:
    """``worker`` in a fresh interpreter, so one measurement's peak does not hide the next."""
    out = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--manifest", manifest, "--limit", str(limit)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--before-rows", type=int, default=20_000, help="rows the old path is run on (then scaled)")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="2,000 rows, the old path on 500 (CI)")
    parser.add_argument("--worker", choices=["before", "whole", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.manifest, args.limit)))
        return 0
    if args.smoke:
        args.rows, args.before_rows = 2000, 500
    with tempfile.TemporaryDirectory() as folder:
        write_world(folder)
        small = write_manifest(os.path.join(folder, "small.jsonl"), min(args.before_rows, args.rows))
        started = time.perf_counter()
        big = write_manifest(os.path.join(folder, "big.jsonl"), args.rows)
        print(f"{args.rows:,} rows, {os.path.getsize(big) / 1e6:.0f} MB, written in {time.perf_counter() - started:.1f} s; "
              f"--limit {args.limit}", file=sys.stderr)
        scale = args.rows / min(args.before_rows, args.rows)
        results = {"before": measure("before", small, args.limit), "whole": measure("whole", small, args.limit),
                   "after": measure("after", big, args.limit)}
    for mode in ("before", "whole"):  # per row, scaled to --rows
        results[mode].update(scaled_seconds=results[mode]["seconds"] * scale,
                             scaled_peak_increase=results[mode]["peak_increase"] * scale)
    results["after"].update(scaled_seconds=results["after"]["seconds"],
                            scaled_peak_increase=results["after"]["peak_increase"])
    for mode, row in results.items():
        measured = (f"measured on {row['rows_loaded']:,} rows {row['seconds']:.2f} s, +{row['peak_increase'] / 1e6:.1f} MB"
                    if mode != "after" else "measured on the file itself")
        print(f"{mode:>6}: {row['scaled_seconds']:9.2f} s  peak +{row['scaled_peak_increase'] / 1e6:9.1f} MB  "
              f"for {args.rows:,} rows ({measured})")
    before, after = results["before"], results["after"]
    print(f"before/after: time x{before['scaled_seconds'] / after['scaled_seconds']:,.0f}, "
          f"peak memory x{before['scaled_peak_increase'] / max(after['scaled_peak_increase'], 1):,.0f}")
    print(json.dumps({"rows": args.rows, "before_rows": args.before_rows, "limit": args.limit, **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
