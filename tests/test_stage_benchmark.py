"""``--model.benchmark``: evaluate stages report caption-as-evidence accuracy through ``evaluate_benchmark``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentcap.core.schedule import Stage
from agentcap.core.settings import ConfigError
from agentcap.evaluation.benchmark import BenchmarkConfig, RuleJudge, evaluate_benchmark, read_benchmark, stage_metrics
from agentcap.evaluation.items import read_eval_items
from agentcap.training.loading import trained_module

ROOT = Path(__file__).resolve().parents[1]
S1 = Stage(name="S1", kind="evaluate", split="test")


def three_questions(world: Path, path: Path) -> Path:
    """Three questions on two test clips: the first evaluated by the stage (eval_limit 2), the last not."""
    def row(n: int, clip: str, answer: str, category: str) -> dict:
        return {"id": f"q{n}", "audio": str(world / "audio" / clip), "question": f"Which sound is number {n}?",
                "choices": ["beep", "knock", "hiss"], "answer": answer, "answer_text": "beep knock hiss".split()["AB".index(answer)],
                "benchmark": "toy", "task": "identification", "category": category, "subcategory": None, "layer": None,
                "duration": None}

    rows = [row(0, "test-0000.wav", "A", "perception"), row(1, "test-0000.wav", "B", "temporal"),
            row(2, "test-0002.wav", "A", "perception")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class FakeJudge:
    """Answers A to everything and keeps what it was asked."""

    identity = "fake"

    def __init__(self):
        self.asks = []

    def choose(self, asks):
        self.asks += asks
        return ["A"] * len(asks)


def module_with_benchmark(tmp_path, world, make_game_config, benchmark: dict):
    config = make_game_config(tmp_path / "run", world, [{"name": "S1", "kind": "evaluate", "split": "test"}], trainer={"logger": False},
                              benchmark=benchmark)
    return trained_module(str(config), None)


def test_hand_checked_accuracy_with_a_fake_judge(tmp_path, toy_soundscapes, make_game_config):
    path = three_questions(toy_soundscapes, tmp_path / "three.jsonl")
    module = module_with_benchmark(tmp_path, toy_soundscapes, make_game_config, {"path": str(path)})
    module._benchmark_judge = judge = FakeJudge()
    result = module.evaluate(S1)
    # answers A, B, A; the judge says A each time: 2 of 3 right, perception 2/2, temporal 0/1
    assert result["benchmark/accuracy"] == pytest.approx(2 / 3)
    assert result["benchmark/perception"] == 1.0 and result["benchmark/temporal"] == 0.0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["S1"]["benchmark/accuracy"] == pytest.approx(2 / 3)
    # the evaluated clip's questions saw the stage's own caption; the other clip was rolled out apart
    rows = read_eval_items(str(tmp_path / "run"), "S1")
    first = rows["test-0000"]
    assert [a.caption for a in judge.asks[:2]] == [first["caption"]] * 2
    assert len(judge.asks) == 3 and isinstance(judge.asks[2].caption, str)


def test_summary_equals_evaluate_benchmark_on_the_same_captions(tmp_path, toy_soundscapes, make_game_config):
    path = toy_soundscapes / "benchmark.jsonl"
    module = module_with_benchmark(tmp_path, toy_soundscapes, make_game_config, {"path": str(path), "judge": "rule"})
    result = module.evaluate(S1)
    items = [json.loads(line) for line in
             (tmp_path / "run" / "benchmarks" / "S1" / "benchmark_items.jsonl").read_text().splitlines()]
    questions = read_benchmark(str(path))
    assert len(items) == len(questions) and all(isinstance(i["caption"], str) for i in items)
    captions = {q["_clip"]: {"caption": i["caption"]} for q, i in zip(questions, items)}
    again = evaluate_benchmark(questions, lambda clips: {c: captions[c] for c in clips}, "by hand", RuleJudge(),
                               str(tmp_path / "again"))
    expected = stage_metrics(again)
    assert {"benchmark/accuracy", "benchmark/perception", "benchmark/temporal"} <= set(expected)
    assert {k: v for k, v in result.items() if k.startswith("benchmark/")} == expected


def test_sampled_stages_and_runs_without_a_benchmark_report_none(tmp_path, toy_soundscapes, make_game_config):
    path = three_questions(toy_soundscapes, tmp_path / "three.jsonl")
    module = module_with_benchmark(tmp_path, toy_soundscapes, make_game_config, {"path": str(path)})
    sampled = module.evaluate(Stage(name="S1_sampled", kind="evaluate", split="test", greedy=False))
    assert not any(k.startswith("benchmark/") for k in sampled)
    module.benchmark = None
    assert not any(k.startswith("benchmark/") for k in module.evaluate(S1))


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"--model.benchmark.path must be a non-empty string"):
        BenchmarkConfig(path="")
    with pytest.raises(ConfigError, match=r"--model.benchmark.limit must be ≥ 1, got 0"):
        BenchmarkConfig(path="b.jsonl", limit=0)


@pytest.mark.slow
def test_fit_logs_and_prints_the_benchmark_row(tmp_path, toy_soundscapes, make_game_config):
    path = three_questions(toy_soundscapes, tmp_path / "three.jsonl")
    config = make_game_config(tmp_path / "run", toy_soundscapes, [{"name": "S1", "kind": "evaluate", "split": "test"}], benchmark={"path": str(path)})
    result = subprocess.run([sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    accuracy = summary["S1"]["benchmark/accuracy"]
    assert any(line.split("|")[0].strip() == "benchmark/accuracy" and f"{accuracy:.4f}" in line
               for line in result.stdout.splitlines())
    header = next((tmp_path / "run").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    assert {"eval/S1/benchmark/accuracy", "eval/S1/benchmark/perception", "eval/S1/benchmark/temporal"} <= set(header)
