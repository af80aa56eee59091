"""tools/real_recheck.py: a run's two ends re-measured on more clips, merged for seed_stats."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import real_recheck  # noqa: E402

from agentcap.evaluation.seeds import report  # noqa: E402

STAGES = [{"name": "sft_captioner", "kind": "sft", "agent": "captioner", "steps": 2},
          {"name": "S1", "kind": "evaluate", "split": "test"},
          {"name": "captioner_grpo", "kind": "grpo", "agent": "captioner", "steps": 2},
          {"name": "S2", "kind": "evaluate", "split": "test"}]


def _write(folder: Path, stage: str, captions: dict[str, str], accuracy: float) -> None:
    (folder / "eval").mkdir(parents=True, exist_ok=True)
    (folder / "benchmarks" / stage).mkdir(parents=True)
    with open(folder / "eval" / f"{stage}.jsonl", "w") as f:
        for i, c in captions.items():
            f.write(json.dumps({"id": i, "caption": c, "reward": accuracy}) + "\n")
    (folder / "benchmarks" / stage / "benchmark_items.jsonl").write_text("")


def test_the_start_is_rerun_on_more_clips_and_the_end_tested_into_one_folder(tmp_path, monkeypatch):
    config = {"model": {"stages": STAGES, "eval_limit": 2, "benchmark": {"path": "b.jsonl", "limit": 9}}}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config))
    source = tmp_path / "runs" / "acecap-demo-s5"
    _write(source, "S1", {"a": "x", "b": "y"}, 0.0)  # the run's own start, on its 2 clips
    (source / "checkpoints").mkdir()
    (source / "checkpoints" / "last.ckpt").write_text("")
    calls = []

    def fake(cmd, log):
        calls.append(cmd)
        run_dir = Path(cmd[cmd.index("--model.run_dir") + 1])
        if cmd[1] == "fit":  # the warm-ups again: same captions on the run's clips, one clip more
            start = yaml.safe_load(open(cmd[cmd.index("--config") + 1]))
            assert [s["name"] for s in start["model"]["stages"]] == ["sft_captioner", "S1"]
            assert start["model"]["eval_limit"] == 3 and start["model"]["benchmark"] == {"path": "b.jsonl", "limit": 14}
            _write(run_dir, "S1", {"a": "x", "b": "changed", "c": "z"}, 0.1)
            (run_dir / "summary.json").write_text(json.dumps({"S1": {"reward": 0.1}}))
        else:
            assert cmd[1] == "test" and cmd[cmd.index("--ckpt_path") + 1] == str(source / "checkpoints" / "last.ckpt")
            _write(run_dir, "test", {"a": "x2", "b": "y2", "c": "z2"}, 0.4)
            (run_dir / "summary.json").write_text(json.dumps({"S1": {"reward": 0.0}, "S2": {"reward": 0.3},
                                                              "test": {"reward": 0.4}}))

    monkeypatch.setattr(real_recheck, "run", fake)
    out = tmp_path / "out"
    real_recheck.main(["5", "--runs", str(source.parent), "--out", str(out), "--config", str(recipe),
                       "--clips", "3", "--questions", "14"])
    dest = out / "acecap-demo-s5"
    assert json.loads((dest / "summary.json").read_text()) == {"S1": {"reward": 0.1}, "S2": {"reward": 0.4}}
    assert (dest / "eval" / "S2.jsonl").read_text().count("\n") == 3
    assert len(calls) == 2
    table = report("acecap", ["5"], [("S1", "S2")], root=str(out))
    assert "| reward | 0.100" in table and "0.300 [" in table and "(n=3)" in table


def test_a_start_that_does_not_reproduce_the_run_is_reported(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": {"stages": STAGES, "benchmark": {"path": "b.jsonl"}}}))
    source = tmp_path / "runs" / "acecap-demo-s5"
    _write(source, "S1", {"a": "x", "b": "y", "c": "w"}, 0.0)
    (source / "checkpoints").mkdir()
    (source / "checkpoints" / "last.ckpt").write_text("")

    def fake(cmd, log):
        run_dir = Path(cmd[cmd.index("--model.run_dir") + 1])
        stage = "S1" if cmd[1] == "fit" else "test"
        _write(run_dir, stage, {"a": "x", "b": "other", "c": "w"}, 0.0)
        (run_dir / "summary.json").write_text(json.dumps({stage: {"reward": 0.0}}))

    monkeypatch.setattr(real_recheck, "run", fake)
    real_recheck.main(["5", "--runs", str(source.parent), "--out", str(tmp_path / "out"), "--config", str(recipe)])
    assert "on 2 of its 3 clips" in capsys.readouterr().out


def test_a_schedule_with_one_evaluation_has_no_end_to_compare(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": {"stages": STAGES[:2], "benchmark": {"path": "b.jsonl"}}}))
    source = tmp_path / "runs" / "acecap-demo-s5" / "checkpoints"
    source.mkdir(parents=True)
    (source / "last.ckpt").write_text("")
    with pytest.raises(ValueError, match="recipe.yaml: model.stages has 1 evaluate stage"):
        real_recheck.main(["5", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--config", str(recipe)])
    assert not (tmp_path / "out" / "acecap-demo-s5").exists()
