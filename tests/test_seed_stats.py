"""agentcap.evaluation.seeds (tools/seed_stats.py): t quantiles against printed tables, intervals and Pearson's r by hand,
and the report read from per-item evaluation rows."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from agentcap.evaluation import seeds as stats
from agentcap.evaluation.items import read_benchmark_items, read_eval_items, write_eval_items
from agentcap.resume import numerics


@pytest.mark.parametrize(
    ("df", "expected"),  # two-sided 95 % critical values, t_{0.975}(df), from a printed t table
    [(1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139), (30, 2.042272), (1000, 1.962339)],
)
def test_t_quantile_matches_tables(df: int, expected: float) -> None:
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=2e-6)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=2e-6)


def test_t_cdf_known_values() -> None:
    assert stats.t_cdf(0.0, 3) == pytest.approx(0.5)
    assert stats.t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert stats.t_cdf(2.0, 2) == pytest.approx(0.5 + 2.0 / (2 * math.sqrt(6.0)))  # df=2 closed form


def test_mean_interval_by_hand() -> None:
    interval = stats.mean_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, se 1/sqrt(3), df 2
    assert interval.mean == pytest.approx(2.0)
    assert interval.half == pytest.approx(4.302653 / math.sqrt(3.0), abs=1e-6)
    assert (interval.low, interval.high) == pytest.approx((2.0 - 2.484138, 2.0 + 2.484138), abs=1e-5)
    one = stats.mean_interval([0.5, float("nan")])  # NaN is left out; one value has no interval
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.half) and str(one) == "0.500"
    assert str(stats.mean_interval([])) == "n/a"


def test_pearson_matches_numpy_and_flags_constant() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=20), rng.normal(size=20)
    assert stats.pearson(list(x), list(x + y)) == pytest.approx(float(np.corrcoef(x, x + y)[0, 1]))
    assert math.isnan(stats.pearson([3, 3, 3], [1, 2, 3]))  # always 3 questions: r undefined
    with pytest.raises(ValueError, match="equal lengths"):
        stats.pearson([1, 2], [1])


def _fake_run(root, seed: int, gain: float) -> None:
    folder = root / f"toy-demo-s{seed}"
    before = {f"c{i}": {"reward": 0.1 * i, "questions": 3.0, "events": float(1 + i % 3)} for i in range(6)}
    after = {k: {"reward": v["reward"] + gain, "questions": v["events"], "events": v["events"]} for k, v in before.items()}
    for stage, rows in (("S1", before), ("S4", after)):
        write_eval_items(str(folder), stage, [{"id": k, **v} for k, v in rows.items()])
    summary = {st: {"reward": float(np.mean([r["reward"] for r in rows.values()]))}
               for st, rows in (("S1", before), ("S4", after))}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_report_pairs_items_and_correlates_questions(tmp_path) -> None:
    for seed, gain in ((5, 0.1), (6, 0.2), (7, 0.3)):
        _fake_run(tmp_path, seed, gain)
    assert read_eval_items(str(tmp_path / "toy-demo-s5"), "S1")["c2"]["reward"] == pytest.approx(0.2)
    text = stats.report("toy", ["5", "6", "7"], [("S1", "S4")], root=str(tmp_path), metrics=["reward"])
    assert "(none tuned on)" in text
    gains = stats.mean_interval([0.1, 0.2, 0.3])  # over seeds: mean 0.2, sd 0.1, df 2
    assert "| reward | 0.250 [" in text and str(gains) in text
    assert "(n=18)" in text  # 6 items x 3 seeds, paired
    assert "| S1 | n/a | n/a, n/a, n/a |" in text  # constant questions before
    assert "| S4 | 1.000 [1.000, 1.000] | 1.000, 1.000, 1.000 |" in text  # questions = events after
    # one run also holds an `agentcap evaluate` entry: the tables keep the stages every seed has
    summary = tmp_path / "toy-demo-s6" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "evaluate": {"reward": 1.0}}))
    assert "| evaluate |" not in stats.report("toy", ["5", "6", "7"], [("S1", "S4")], root=str(tmp_path))


def test_report_names_the_numerics_the_seeds_ran_on(tmp_path) -> None:
    for seed in (5, 6):
        _fake_run(tmp_path, seed, 0.1)
    text = stats.report("toy", ["5", "6"], [("S1", "S4")], root=str(tmp_path), metrics=["reward"])
    assert "Numerics (run_dir/numerics.json, every seed): not recorded." in text
    start = numerics.current()
    numerics.record(str(tmp_path / "toy-demo-s5"), numerics=start)
    numerics.record(str(tmp_path / "toy-demo-s6"), numerics={**start, "started": "later"})
    numerics.record(str(tmp_path / "toy-demo-s6"), numerics={**start, "torch_threads": 9}, report=lambda _: None)
    text = stats.report("toy", ["5", "6"], [("S1", "S4")], root=str(tmp_path), metrics=["reward"])
    assert f"every seed): {numerics.describe(start)}." in text  # a run's first start counts, not a resume
    numerics.record(str(tmp_path / "toy-demo-s7"), numerics={**start, "torch_threads": 9})
    _fake_run(tmp_path, 7, 0.1)
    text = stats.report("toy", ["5", "6", "7"], [("S1", "S4")], root=str(tmp_path), metrics=["reward"])
    assert "Numerics differ between seeds: seed 5: " in text and "seed 7: 9 torch threads, " in text


def _fake_benchmark(folder, stage: str, correct: list[bool]) -> None:
    out = folder / "benchmarks" / stage
    out.mkdir(parents=True)
    rows = [{"id": f"c{i}-q0", "category": "speech content" if i % 2 else "sound events", "correct": c}
            for i, c in enumerate(correct)]
    (out / "benchmark_items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_pairs_benchmark_questions_one_by_one(tmp_path) -> None:
    # two seeds, four questions: seed 5 gains question 0, seed 6 gains question 1 and loses question 3
    for seed, before, after in ((5, [0, 0, 1, 1], [1, 0, 1, 1]), (6, [0, 0, 1, 1], [0, 1, 1, 0])):
        _fake_run(tmp_path, seed, 0.0)
        folder = tmp_path / f"toy-demo-s{seed}"
        _fake_benchmark(folder, "S1", [bool(c) for c in before])
        _fake_benchmark(folder, "S4", [bool(c) for c in after])
        summary = json.loads((folder / "summary.json").read_text())
        summary["S1"]["benchmark/accuracy"], summary["S4"]["benchmark/accuracy"] = np.mean(before), np.mean(after)
        (folder / "summary.json").write_text(json.dumps(summary))
    assert read_benchmark_items(str(tmp_path / "toy-demo-s5"), "S4")["benchmark:c0-q0"] == {
        "benchmark/accuracy": 1.0, "benchmark/sound events": 1.0}
    assert read_benchmark_items(str(tmp_path / "toy-demo-s5"), "S2") == {}  # no benchmark asked there
    text = stats.report("toy", ["5", "6"], [("S1", "S4")], root=str(tmp_path),
                        metrics=["benchmark/accuracy", "benchmark/speech content"])
    over_items = stats.mean_interval([1, 0, 0, 0, 0, 1, 0, -1])  # after - before, question by question
    assert f"| {over_items} (n=8) |" in text
    assert "| benchmark/speech content |" in text and "(n=4) |" in text  # questions 1 and 3 of each seed
    bad = tmp_path / "toy-demo-s5" / "benchmarks" / "S1" / "benchmark_items.jsonl"
    bad.write_text('{"id": "c0-q0"}\n')
    with pytest.raises(ValueError, match=r"benchmark_items.jsonl, line 1: .*'correct'"):
        read_benchmark_items(str(tmp_path / "toy-demo-s5"), "S1")


def test_report_subtracts_a_control_seed_by_seed_and_item_by_item(tmp_path) -> None:
    here, control = tmp_path / "here", tmp_path / "control"
    for seed, gain, base in ((5, 0.1, 0.05), (6, 0.3, 0.05)):
        _fake_run(here, seed, gain)
        _fake_run(control, seed, base)
    # the control gains question 0 on seed 5; the measured runs gain questions 0 and 1
    for root, after in ((here, [1, 1, 0, 1]), (control, [1, 0, 0, 1])):
        folder = root / "toy-demo-s5"
        _fake_benchmark(folder, "S1", [False, False, False, True])
        _fake_benchmark(folder, "S4", [bool(c) for c in after])
    text = stats.report("toy", ["5", "6"], [("S1", "S4")], root=str(here), metrics=["reward", "benchmark/accuracy"],
                        control=str(control))
    section = text.split(f"S4 − S1 minus the same in {control}")[1].splitlines()
    row = next(line for line in section if line.startswith("| reward |"))
    assert row.endswith("| +0.050, +0.250 |")
    assert str(stats.mean_interval([0.05, 0.25])) in row  # over seeds: (0.1 - 0.05), (0.3 - 0.05)
    assert str(stats.mean_interval([0.05] * 6 + [0.25] * 6)) + " (n=12)" in row  # 6 clips x 2 seeds
    bench = next(line for line in section if line.startswith("| benchmark/accuracy |"))
    assert "(n=4)" in bench
    assert str(stats.mean_interval([0, 1, 0, 0])) in bench  # only seed 5 answered questions; question 1 is the gain
    with pytest.raises(FileNotFoundError, match="toy-demo-s7"):
        stats.report("toy", ["5", "7"], [("S1", "S4")], root=str(here), control=str(control))


def test_report_names_tuned_seeds_and_missing_runs(tmp_path) -> None:
    _fake_run(tmp_path, 0, 0.1)
    _fake_run(tmp_path, 5, 0.1)
    assert "(tuned on: 0)" in stats.report("toy", ["0", "5"], [], root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="toy-demo-s9"):
        stats.report("toy", ["9"], [], root=str(tmp_path))


def test_enough_minus_short_compares_within_event_counts() -> None:
    rows = [
        {"events": 1.0, "questions": 1.0, "g2p_final": 0.5},
        {"events": 1.0, "questions": 0.0, "g2p_final": 0.1},
        {"events": 2.0, "questions": 3.0, "g2p_final": 0.0},
        {"events": 2.0, "questions": 2.0, "g2p_final": 0.2},
        {"events": 2.0, "questions": 1.0, "g2p_final": -0.4},
        {"events": 3.0, "questions": 3.0, "g2p_final": 9.0},  # no 'fewer' side: says nothing
    ]
    # events 1: 0.5 - 0.1 = 0.4 (weight 1/2); events 2: 0.1 - (-0.4) = 0.5 (weight 2/3)
    expected = (0.5 * 0.4 + 2 / 3 * 0.5) / (0.5 + 2 / 3)
    assert stats.enough_minus_short(rows, "g2p_final") == pytest.approx(expected)
    assert math.isnan(stats.enough_minus_short(rows[-1:], "g2p_final"))


def test_report_shows_what_asking_enough_pays_and_how_many_seeds_a_correlation_averages(tmp_path) -> None:
    rows = {
        5: [(1, 1, 0.4), (1, 0, 0.0), (2, 2, 0.2), (2, 1, -0.2)],  # questions vary: r defined
        6: [(1, 4, 0.1), (1, 4, 0.1), (2, 4, 0.3), (2, 4, 0.3)],  # always 4: r n/a, no 'fewer' side
    }
    for seed, items in rows.items():
        folder = tmp_path / f"toy-demo-s{seed}"
        evals = [{"id": f"c{i}", "events": float(e), "questions": float(q), "g2p_evidence": g, "g2p_final": g}
                 for i, (e, q, g) in enumerate(items)]
        write_eval_items(str(folder), "S1", evals)
        (folder / "summary.json").write_text(json.dumps({"S1": {"g2p_final": 0.0}}))
    text = stats.report("toy", ["5", "6"], [], root=str(tmp_path))
    assert "| S1 | 0.707 (1 of 2 seeds) | 0.707, n/a |" in text
    assert "What asking enough pays" not in text  # seed 6 never asked fewer: no row
    rows[6][0] = (1, 0, -0.3)  # now both seeds have both sides
    (tmp_path / "toy-demo-s6").mkdir(exist_ok=True)
    write_eval_items(str(tmp_path / "toy-demo-s6"), "S1", [
        {"id": f"c{i}", "events": float(e), "questions": float(q), "g2p_evidence": g, "g2p_final": g}
        for i, (e, q, g) in enumerate(rows[6])])
    text = stats.report("toy", ["5", "6"], [], root=str(tmp_path))
    # seed 5: (0.4 - 0.0) and (0.2 - -0.2), equal weights -> 0.4; seed 6: 0.1 - -0.3 = 0.4
    assert f"| S1 | {stats.mean_interval([0.4, 0.4])} | {stats.mean_interval([0.4, 0.4])} |" in text


# --- tools/seeds.sh: one toy world, then JOBS seeds at once ------------------------------------
FAKE_DEMO = """\
echo "$DEMO_STEP $*" >> calls.txt
if [ "$DEMO_STEP" = fit ]; then
  echo "start $3" >> order.txt
  sleep 1
  case "$*" in *"--model.seed 6 "*) echo boom; exit 3 ;; esac
  echo "end $3" >> order.txt
fi
"""


@pytest.fixture
def seeds_repo(tmp_path):
    """tools/seeds.sh in a folder whose demo.sh and python only record how they were called."""
    (tmp_path / "tools").mkdir()
    shutil.copy(Path(__file__).parents[1] / "tools" / "seeds.sh", tmp_path / "tools" / "seeds.sh")
    (tmp_path / "tools" / "demo.sh").write_text(FAKE_DEMO)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "stats $*"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def _seeds(repo, *seeds, **env):
    return subprocess.run(["bash", "tools/seeds.sh", "acecap", *seeds], cwd=repo, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=60, check=False)


def test_seeds_sh_prepares_the_world_once_then_runs_jobs_seeds_at_once(seeds_repo) -> None:
    done = _seeds(seeds_repo, "5", "7", "8", JOBS="2", RUNS="out")
    assert done.returncode == 0, done.stderr
    calls = (seeds_repo / "calls.txt").read_text().splitlines()
    assert calls[0] == "prepare acecap" and len(calls) == 4
    assert sorted(c.split()[3] for c in calls[1:]) == ["5", "7", "8"]  # --seed_everything S
    assert all(c.startswith("fit acecap") and "--model.run_dir out/acecap-demo-s" in c for c in calls[1:])
    order = (seeds_repo / "order.txt").read_text().split("\n")
    assert set(order[:2]) == {"start 5", "start 7"} and order.index("start 8") > 2  # two at once, then the third
    assert "stats tools/seed_stats.py acecap 5 7 8 --pairs S1:S4,S1:S5,S4:S5,S1_sampled:S5_sampled --root out" in done.stdout
    assert (seeds_repo / "out" / "acecap-seeds.md").exists()


def test_seeds_sh_a_failed_seed_names_its_log_and_fails_without_tables(seeds_repo) -> None:
    done = _seeds(seeds_repo, "5", "6", JOBS="2")
    assert done.returncode == 1
    assert "seed 6: failed, see runs/acecap-demo-s6.log" in done.stderr
    assert "boom" in (seeds_repo / "runs" / "acecap-demo-s6.log").read_text()
    assert "seed 5:" in done.stdout and "stats" not in done.stdout


def test_seeds_sh_one_job_runs_the_seeds_in_turn(seeds_repo) -> None:
    assert _seeds(seeds_repo, "5", "7").returncode == 0
    assert (seeds_repo / "order.txt").read_text().split() == ["start", "5", "end", "5", "start", "7", "end", "7"]


@pytest.mark.parametrize("jobs", ["0", "two"])
def test_seeds_sh_refuses_a_bad_jobs_count(seeds_repo, jobs) -> None:
    done = _seeds(seeds_repo, "5", JOBS=jobs)
    assert done.returncode == 2 and f"JOBS='{jobs}'" in done.stderr
    assert not (seeds_repo / "calls.txt").exists()
