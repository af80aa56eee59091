"""A run's logged training curves, read from its offline W&B file without syncing it anywhere.

Runs log offline (`offline: true` in the recipes) and this machine reaches no W&B server, so the
per-step metrics (a reward component on the sampled rollouts, the KL, the group spread) would be
out of reach until someone syncs them. The ``.wandb`` file is W&B's own record log: a 7-byte
header (":W&B", magic, version), then LevelDB-log blocks of 32 KiB whose records carry
``wandb_internal_pb2.Record`` protobufs; the ``history`` records are the ``log`` calls. This reads
those and prints one metric per run, and, with ``--windows``, the paired change between two step
windows over runs with a 95 % t interval (seeds as the unit).

    python tools/wandb_history.py runs/real/audiomap-count-demo-s7{2,3} --key reward/policy/count \\
        --windows 5-8,13-16
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import struct
import sys
from collections.abc import Iterator, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agentcap.evaluation.seeds import mean_interval  # noqa: E402

HEADER = b":W&B"
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(path: str) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        data = handle.read()
    if not data.startswith(HEADER):
        raise ValueError(f"{path}: not a W&B run file (it does not start with {HEADER!r})")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a record header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def history(path: str) -> list[dict[str, object]]:
    """Every ``log`` call of the run file at ``path``, in order, as {metric: value}."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for raw in _records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def run_file(run: str) -> str:
    """The run directory's W&B file (its latest run)."""
    found = sorted(glob.glob(os.path.join(run, "wandb", "latest-run", "*.wandb")))
    if not found:
        raise FileNotFoundError(f"{run}: no wandb/latest-run/*.wandb (was the run logged with WandbLogger?)")
    return found[0]


def series(run: str, key: str) -> list[float]:
    return [float(row[key]) for row in history(run_file(run)) if key in row]


def main(argv: Sequence[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (each holds wandb/latest-run)")
    p.add_argument("--key", required=True, help="a logged metric, e.g. reward/policy/count")
    p.add_argument("--windows", help="two 1-based step windows A-B,C-D: the change of their means, paired by run")
    args = p.parse_args(argv)
    values = {run: series(run, args.key) for run in args.runs}
    lines = [f"{run}: " + ", ".join(f"{v:.3f}" for v in vals) for run, vals in values.items()]
    if args.windows:
        (a, b), (c, d) = [tuple(int(x) for x in w.split("-")) for w in args.windows.split(",")]
        deltas = []
        for run, vals in values.items():
            if len(vals) < max(b, d):
                raise ValueError(f"{run}: {args.key} was logged {len(vals)} times, fewer than step {max(b, d)}")
            deltas.append(sum(vals[c - 1:d]) / (d - c + 1) - sum(vals[a - 1:b]) / (b - a + 1))
        lines.append(f"steps {c}-{d} − steps {a}-{b}: {mean_interval(deltas)} ("
                     + ", ".join(f"{x:+.3f}" for x in deltas) + ")")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
