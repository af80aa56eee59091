"""What a run shows and logs: the results table, callback metrics, config, samples, captions, timing."""

from __future__ import annotations

import json

import pytest
import yaml

from agentcap.cli import AgentcapCLI, main
from agentcap.training.module import GRPOModule

STAGES = [
    {"name": "sft", "kind": "sft", "agent": "policy", "steps": 2},
    {"name": "before", "kind": "evaluate", "split": "test"},
    {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 2},
    {"name": "after", "kind": "evaluate", "split": "test"},
]


@pytest.fixture(scope="module")
def run(tmp_path_factory, toy_movie):
    """One tiny READ fit, in process, with the papers' metrics and a checkpoint watching one of them."""
    from conftest import read_config

    pytest.importorskip("pycocoevalcap")
    run_dir = tmp_path_factory.mktemp("run")
    config = read_config(run_dir, toy_movie, STAGES, eval_metrics="papers")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli = AgentcapCLI(
            GRPOModule, datamodule_class=None, save_config_kwargs={"overwrite": True},
            args=["fit", "--config", str(config), "--trainer.enable_checkpointing=true",
                  "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                  "--trainer.callbacks.monitor=eval/after/bleu1", "--trainer.callbacks.mode=max",
                  f"--trainer.callbacks.dirpath={run_dir / 'best'}"],
        )
    return cli, run_dir, out.getvalue()


@pytest.mark.slow  # a Trainer fit (the run fixture)
def test_fit_ends_with_the_table_of_summary_json(run):
    cli, run_dir, stdout = run
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = stdout.strip().splitlines()
    assert lines[-1].endswith("summary.json")
    header = next(line for line in lines if line.startswith("metric"))
    assert [c.strip() for c in header.split("|")] == ["metric", "before", "after"]
    table = {c[0].strip(): [v.strip() for v in c[1:]] for c in (line.split("|") for line in lines) if len(c) == 3}
    for metric in ("reward", "accuracy", "bleu1", "bleu4", "rouge_l", "cider_d", "bertscore", "recall@1/5"):
        assert table[metric] == [f"{summary[s][metric]:.4f}" for s in ("before", "after")], metric


@pytest.mark.slow  # a Trainer fit (the run fixture)
def test_eval_metrics_reach_callback_metrics_and_a_monitor(run):
    cli, run_dir, _ = run
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = cli.trainer.callback_metrics
    assert float(metrics["eval/after/bleu1"]) == pytest.approx(summary["after"]["bleu1"])
    assert float(metrics["eval/before/reward"]) == pytest.approx(summary["before"]["reward"])
    checkpoint = cli.trainer.checkpoint_callback
    assert checkpoint.monitor == "eval/after/bleu1"
    assert float(checkpoint.best_model_score) == pytest.approx(summary["after"]["bleu1"])
    assert list((run_dir / "best").glob("*.ckpt"))


@pytest.mark.slow  # a Trainer fit (the run fixture)
def test_config_samples_captions_and_timing_are_logged(run):
    cli, run_dir, _ = run
    hparams = yaml.safe_load(next(run_dir.rglob("hparams.yaml")).read_text())
    assert hparams["model"]["group_size"] == 4 and hparams["model"]["stages"][0]["name"] == "sft"
    sample = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert {"reference", "reward", "reward/accuracy", "reward/format", "reward/length"} <= set(sample)
    rows = [json.loads(line) for line in (run_dir / "eval" / "after.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {"id", "caption", "reference", "context", "reward", "accuracy"} <= set(rows[0])
    assert not (run_dir / "captions").exists()  # one per-item file per stage
    header = next(run_dir.rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    for name in ("time/rollout_s", "time/update_s", "throughput/generated_tokens_per_s", "memory/peak_rss_gib"):
        assert name in header, name


@pytest.mark.slow  # a Trainer fit (the run fixture)
def test_the_docs_metrics_table_names_every_logged_key(run):
    """docs/metrics.md's table against the CSV header of a fit: every logged key matches a documented
    key pattern (``<agent>``, ``<stage>``, … stand for one path part), and the log lines were printed
    (stdout is not a terminal here)."""
    import re
    from pathlib import Path

    _, run_dir, stdout = run
    header = next(run_dir.rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    patterns = documented_keys(Path(__file__).parents[1] / "docs" / "metrics.md")
    undocumented = [k for k in header if k != "step" and not any(re.fullmatch(p, k) for p in patterns)]
    assert not undocumented, f"logged but not in docs/metrics.md: {undocumented}"
    lines = [line for line in stdout.splitlines() if line.startswith("agentcap: [")]
    assert lines[0].startswith("agentcap: [1/4] sft tick 1/6 policy loss ")
    assert any(line.startswith("agentcap: [3/4] grpo tick ") and " reward " in line and " clipped " in line
               for line in lines), lines


def documented_keys(path) -> list[str]:
    """The table's keys as regular expressions: `<name>` is one path part (`<metric>`: one or more)."""
    import re

    keys = []
    for line in path.read_text().splitlines():
        if line.startswith("| `"):
            for key in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
                pattern = re.escape(key).replace(re.escape("<metric>"), ".+")
                keys.append(re.sub(re.escape("<") + r"[a-z_]+" + re.escape(">"), "[^/]+", pattern))
    return keys


def test_clipped_completions_are_those_cut_at_max_new_tokens():
    from types import SimpleNamespace

    import torch

    from agentcap.rollout.driver import RolloutBatch
    from agentcap.training.logs import rollout_metrics

    policy = SimpleNamespace(max_new_tokens=3, eos_ids=[9])
    ids = [[1, 2, 3], [1, 9], [1, 2, 9], [4, 5, 6]]  # cut, stopped, stopped at the budget, cut
    spans = [SimpleNamespace(agent="policy", kind="answer", trajectory=t, action_index=0, utility=1.0,
                             completion_ids=torch.tensor(i)) for t, i in enumerate(ids)]
    scores = [SimpleNamespace(reward=1.0, components={"a": 1.0}, extras={}) for _ in ids]
    batch = RolloutBatch(episodes=[], scores=scores, spans=spans, turns=[1] * 4, trajectory_ids=[0, 1, 2, 3])
    metrics = rollout_metrics(batch, spans, "policy", group_size=2, agents={"policy": policy})
    assert metrics["rollout/policy/clipped"] == 0.5
    assert metrics["reward/policy/a"] == 1.0 and metrics["reward_std/policy/a"] == 0.0


def _fake_module(stages, tick, logged):
    from types import SimpleNamespace

    from agentcap.core.schedule import Schedule, Stage

    module = SimpleNamespace(schedule=Schedule([Stage(**s) for s in stages], ["policy"]), tick=tick)
    module.__dict__.update(logged=logged, _logged_tick=tick - 1)
    return module


def test_a_stage_without_spread_warns_once():
    from types import SimpleNamespace

    from agentcap.training.callbacks import SpreadWatch

    stages = [{"name": "rl", "kind": "grpo", "agent": "policy", "steps": 30}]
    watch, trainer = SpreadWatch(steps=3), SimpleNamespace(is_global_zero=True)
    flat = {"utility/answer/zero_spread": 1.0, "loss/policy/grad_norm": 0.0}
    with pytest.warns(UserWarning, match="zero spread for 3 steps") as caught:
        for tick in range(1, 7):
            watch.on_train_batch_end(trainer, _fake_module(stages, tick, flat), None, None, 0)
    assert len(caught) == 1 and "grad_norm 0" in str(caught[0].message)
    watch = SpreadWatch(steps=3)  # a step with spread starts the count again
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for tick, spread in enumerate([1.0, 1.0, 0.5, 1.0, 1.0], start=1):
            logged = {"utility/answer/zero_spread": spread}
            watch.on_train_batch_end(trainer, _fake_module(stages, tick, logged), None, None, 0)


def test_log_lines_name_the_stage_tick_reward_loss_and_time():
    import io
    from types import SimpleNamespace

    from agentcap.training.callbacks import LogLines

    stages = [{"name": "rl", "kind": "grpo", "agent": "policy", "steps": 4},
              {"name": "after", "kind": "evaluate", "split": "test"}]
    out = io.StringIO()
    lines, trainer = LogLines(stream=out), SimpleNamespace(is_global_zero=True, progress_bar_callback=None,
                                                            log_every_n_steps=2)
    lines.on_train_start(trainer, None)
    metrics = {"reward/policy/total": 0.25, "reward_std/policy/total": 0.1, "loss/policy/loss": -0.5,
               "rollout/policy/clipped": 0.125, "utility/answer/zero_spread": 0.5}
    for tick in range(1, 6):
        logged = metrics if tick < 5 else {"eval/after/reward": 0.75}
        lines.on_train_batch_end(trainer, _fake_module(stages, tick, logged), None, None, 0)
    printed = out.getvalue().splitlines()
    assert [line.split(" s/tick")[0].rsplit(" ", 1)[0] for line in printed] == [
        "agentcap: [1/2] rl tick 1/5 policy reward 0.25 ± 0.1 loss -0.5 clipped 0.125 zero_spread 0.50",
        "agentcap: [1/2] rl tick 2/5 policy reward 0.25 ± 0.1 loss -0.5 clipped 0.125 zero_spread 0.50",
        "agentcap: [1/2] rl tick 4/5 policy reward 0.25 ± 0.1 loss -0.5 clipped 0.125 zero_spread 0.50",
        "agentcap: [2/2] after tick 5/5 (test) reward 0.75",
    ]


def test_one_wandb_run_per_run_dir(tmp_path):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    from agentcap.cli import continue_logger_runs

    first = WandbLogger(project="p", save_dir=str(tmp_path), offline=True)
    continue_logger_runs([first], str(tmp_path))
    stored = (tmp_path / "wandb_id").read_text().strip()
    assert first._wandb_init["id"] == stored and first._wandb_init["resume"] == "allow"
    again = WandbLogger(project="p", save_dir=str(tmp_path), offline=True)
    continue_logger_runs([again], str(tmp_path))  # a restart: the same run
    assert again._wandb_init["id"] == stored
    chosen = WandbLogger(project="p", save_dir=str(tmp_path), offline=True, id="mine")
    continue_logger_runs([chosen], str(tmp_path))
    assert chosen._wandb_init["id"] == "mine"


@pytest.mark.slow  # a Trainer fit (the run fixture) and a test run
def test_test_subcommand_prints_the_table_and_logs_a_named_child_run(run, capsys):
    cli, run_dir, _ = run
    config = run_dir / "config.yaml"
    main(["test", "--config", str(config), "--model.eval_metrics=rewards",
          "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={run_dir}",
          "--trainer.logger.name=demo"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert [c.strip() for c in header.split("|")] == ["metric", "before", "after", "test"]
    assert (run_dir / "demo-test").is_dir()  # not a second "demo" run


def test_child_run_names():
    from agentcap.cli import child_run_names

    wandb = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"name": "read-demo"}}
    child_run_names(wandb, "test")
    assert wandb["init_args"] == {"name": "read-demo-test", "group": "read-demo"}
    fit = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"name": "read-demo"}}
    child_run_names(fit, "fit")
    assert fit["init_args"] == {"name": "read-demo"}


def test_rollout_metrics_report_the_spread_inside_groups():
    from types import SimpleNamespace

    import torch

    from agentcap.rollout.driver import RolloutBatch
    from agentcap.training.logs import rollout_metrics

    # trajectories 0-1 form group 0 and 2-3 group 1 (group = global trajectory id // G)
    spans = [SimpleNamespace(kind="answer", trajectory=t, action_index=0, utility=u, completion_ids=torch.zeros(1))
             for t, u in enumerate([1.0, 1.0, 0.0, 2.0])]
    scores = [SimpleNamespace(reward=u, components={}, extras={}) for u in (1.0, 1.0, 0.0, 2.0)]
    batch = RolloutBatch(episodes=[], scores=scores, spans=spans, turns=[1, 1, 1, 1], trajectory_ids=[0, 1, 2, 3])
    metrics = rollout_metrics(batch, spans, "policy", group_size=2)
    assert metrics["utility/answer/zero_spread"] == 0.5  # group 0 teaches nothing
    assert metrics["utility/answer/group_std"] == 0.5  # mean of std 0 and std 1
    assert metrics["reward/policy/total"] == 1.0 and metrics["rollout/turns"] == 1.0
    assert metrics["reward_std/policy/total"] == pytest.approx(0.5**0.5)  # std of 1, 1, 0, 2


def test_update_metrics_add_the_ranks_shares():
    """With one process the update's statistics pass through (each is already the whole weighted mean)."""
    from agentcap.training.logs import update_metrics

    stats = {"pg_loss": 0.25, "ratio": 1.0, "sampler_gap_max": 0.5, "grad_norm": 2.0}
    assert update_metrics(stats, "policy") == {f"loss/policy/{k}": v for k, v in stats.items()}


def test_captions_table_is_the_per_item_rows():
    """Loggers with tables (W&B) get the rows of eval/<stage>.jsonl, every field a column."""
    from agentcap.training.logs import log_captions

    class TableLogger:
        def log_table(self, **kwargs):
            self.logged = kwargs

    logger = TableLogger()
    rows = [{"id": "a", "caption": "x", "reward": 0.5, "context": ["p", "q"]},
            {"id": "b", "caption": "y", "reward": 1.0, "trace": "captioner/caption: y"}]
    log_captions([logger, object()], "after", rows, step=3)  # a logger without tables is skipped
    assert logger.logged["key"] == "eval/after/captions" and logger.logged["step"] == 3
    assert logger.logged["columns"] == ["id", "caption", "reward", "context", "trace"]
    assert logger.logged["data"] == [["a", "x", 0.5, "p | q", None], ["b", "y", 1.0, None, "captioner/caption: y"]]


# --- every logged figure is the global value --------------------------------------------------
def _step_records(trajectories):
    """A rollout batch of the given global trajectory ids (G = 2) and the update stats of its rank."""
    from types import SimpleNamespace

    import torch

    from agentcap.core.episode import Score
    from agentcap.rollout.driver import RolloutBatch

    rewards = [0.1, 0.7, 0.4, 0.4, 1.0, 0.2]
    scores = [Score(reward=rewards[t], components={"accuracy": rewards[t] / 2, "format": float(t % 2)},
                    utilities=[rewards[t]], extras={"questions": float(t)}) for t in trajectories]
    spans = [SimpleNamespace(kind="answer", trajectory=i, action_index=0, utility=rewards[t],
                             completion_ids=torch.zeros(t + 1)) for i, t in enumerate(trajectories)]
    batch = RolloutBatch(episodes=[], scores=scores, spans=spans, turns=[1 + t % 3 for t in trajectories],
                         trajectory_ids=list(trajectories), generate_calls={"policy": 1})
    # each rank's share of globally weighted means (token weights over all 21 tokens): they add up
    tokens = sum(t + 1 for t in trajectories)
    stats = {"pg_loss": 0.5 * tokens / 21, "ratio": tokens / 21, "sampler_gap_max": 0.01 * max(trajectories),
             "grad_norm": 3.0}
    return batch, spans, stats


def _metrics_of(trajectories):
    from agentcap.training.logs import rollout_metrics, update_metrics

    batch, spans, stats = _step_records(trajectories)
    return {**rollout_metrics(batch, spans, "policy", group_size=2), **update_metrics(stats, "policy")}


def _two_rank_metrics(rank, port, out):
    import json

    from gloo import process_group

    with process_group(rank, port):
        metrics = _metrics_of([0, 1, 4, 5] if rank == 0 else [2, 3])  # whole groups per rank, unevenly split
        with open(f"{out}.{rank}", "w") as handle:
            json.dump(metrics, handle)


@pytest.mark.slow  # two gloo processes
def test_logged_metrics_of_two_processes_equal_one(tmp_path):
    """Rewards (a torchmetrics Metric), utilities per group, lengths, turns and the update's loss
    terms: two ranks holding 4 and 2 trajectories log what one process with all 6 logs."""
    import json

    from gloo import run_in_two_processes

    one = _metrics_of(list(range(6)))
    run_in_two_processes(_two_rank_metrics, str(tmp_path / "m"))
    for rank in (0, 1):
        two = json.loads((tmp_path / f"m.{rank}").read_text())
        assert two.keys() == one.keys()
        for key, value in one.items():
            assert abs(two[key] - value) < 1e-9, (rank, key, value, two[key])
    assert one["reward/policy/total"] == sum([0.1, 0.7, 0.4, 0.4, 1.0, 0.2]) / 6
    assert one["loss/policy/ratio"] == 1.0 and one["utility/answer/zero_spread"] == 1 / 3
