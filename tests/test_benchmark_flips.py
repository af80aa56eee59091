"""tools/benchmark_flips.py: questions never answered, flips between two stages and the judge's abstentions, per category."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import benchmark_flips  # noqa: E402


def _stage(run: Path, stage: str, answers: list[tuple[str, bool, str | None]]) -> None:
    folder = run / "benchmarks" / stage
    folder.mkdir(parents=True)
    rows = [{"id": f"q{i}", "category": cat, "correct": ok, "letter": letter} for i, (cat, ok, letter) in enumerate(answers)]
    (folder / "benchmark_items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_flips_never_right_and_abstentions_per_category(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    # q0 speech (never right), q1 speech (a: up), q2 order (b: down), q3 order (right throughout)
    _stage(a, "S1", [("speech", False, None), ("speech", False, "B"), ("order", False, None), ("order", True, "A")])
    _stage(a, "S5", [("speech", False, None), ("speech", True, "A"), ("order", False, "C"), ("order", True, "A")])
    _stage(b, "S1", [("speech", False, None), ("speech", False, None), ("order", True, "A"), ("order", True, "A")])
    _stage(b, "S5", [("speech", False, None), ("speech", False, None), ("order", False, None), ("order", True, "A")])
    text = benchmark_flips.main([str(a), str(b), "--before", "S1", "--after", "S5"])
    assert "| speech | 2 | 1 | 1 | 0 | 3 / 0 |" in text
    assert "| order | 2 | 0 | 0 | 1 | 1 / 1 |" in text
    assert "| all | 4 | 1 | 1 | 1 | 4 / 1 |" in text
    with pytest.raises(FileNotFoundError, match="S3.*asked no benchmark"):
        benchmark_flips.main([str(a), "--after", "S3"])
