"""`agentcap caption`: READ's recurrent inference feeds the model's own previous ADs back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # `agentcap caption` in a subprocess, ~9 s


def test_recurrent_captioning_uses_own_previous_ads(tmp_path, toy_movie, make_read_config):
    config = make_read_config(tmp_path / "run", toy_movie, [{"name": "e", "kind": "evaluate", "split": "val"}])
    out = tmp_path / "ads.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "agentcap.cli", "caption", "--config", str(config),
         "--manifest", str(toy_movie / "test.jsonl"), "--out", str(out), "--untrained"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len((toy_movie / "test.jsonl").read_text().splitlines())
    by_movie: dict[str, list[dict]] = {}
    for row in rows:
        by_movie.setdefault(row["movie"], []).append(row)
    for clips in by_movie.values():
        clips.sort(key=lambda r: r["position"])
        for k, clip in enumerate(clips):
            expected = [c["caption"] for c in clips[max(0, k - 3) : k]]
            assert clip["context"] == expected  # its own previous (at most three) ADs, not the gold ones
    assert result.stdout.strip().splitlines()[-1] == str(out.resolve())
