"""The console of a run (agentcap.training.console): the stage on the bar, only its own metrics, an ETA
from the schedule, a bar of an evaluation's items; typos on the command line get a suggestion."""

from __future__ import annotations

import contextlib
import io

import pytest

from agentcap.core.schedule import Schedule, Stage
from agentcap.training.console import StageProgressBar


class Recording(StageProgressBar):
    """The stage bar, keeping what it showed after every tick and the evaluation items it heard."""

    def __init__(self):
        super().__init__()
        self.shown: list[tuple[str, dict]] = []
        self.evaluated: list[tuple[str, int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        task = self.progress.tasks[self.train_progress_bar_id]
        self.shown.append((f"{task.description} {int(task.completed)}/{int(task.total)}",
                           self.get_metrics(trainer, pl_module)))

    def evaluation_progress(self, stage, done, total):
        self.evaluated.append((stage, done, total))
        super().evaluation_progress(stage, done, total)


@pytest.mark.slow  # a Trainer fit
def test_bar_shows_the_stage_and_only_its_own_metrics(tmp_path, toy_movie, make_read_config):
    from agentcap.cli import AgentcapCLI
    from agentcap.training.module import GRPOModule

    stages = [
        {"name": "warmup", "kind": "sft", "agent": "policy", "steps": 2},
        {"name": "rl", "kind": "grpo", "agent": "policy", "steps": 2},
        {"name": "after", "kind": "evaluate", "split": "val"},
    ]
    config = make_read_config(tmp_path / "run", toy_movie, stages, generation_batch_size=2)
    bar = Recording()
    with contextlib.redirect_stdout(io.StringIO()):
        AgentcapCLI(GRPOModule, datamodule_class=None, save_config_kwargs={"overwrite": True},
                    trainer_defaults={"callbacks": [bar]},
                    args=["fit", "--config", str(config), "--trainer.enable_progress_bar=true"])
    (sft1, sft2, rl1, rl2, after) = bar.shown
    assert sft1[0] == "[1/3] warmup 1/2" and sft2[0] == "[1/3] warmup 2/2"
    assert rl1[0] == "[2/3] rl 1/2" and rl2[0] == "[2/3] rl 2/2" and after[0] == "[3/3] after 1/1"
    assert "loss/policy/sft" in sft2[1] and "reward/policy/total" not in sft2[1]
    for _, metrics in (rl1, rl2):  # the SFT loss is gone once GRPO starts
        assert "reward/policy/total" in metrics and "loss/policy/sft" not in metrics
    assert "loss/policy/sft" not in after[1] and "reward/policy/total" not in after[1]
    for _, metrics in bar.shown:
        assert "v_num" not in metrics
    assert [m["tick"] for _, m in bar.shown] == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    # the evaluation (eval_limit 4, two items per rollout call) reported its items as they finished
    assert bar.evaluated == [("after", 0, 4), ("after", 2, 4), ("after", 4, 4)]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, bar", [(io.StringIO, False), (_Terminal, True)])
def test_no_bar_unless_the_output_is_a_terminal(stream, bar, tmp_path, toy_movie, make_read_config):
    """A log file gets LogLines' one line per logging step, not a bar's redraws; a terminal gets the bar."""
    import yaml

    from agentcap.cli import AgentcapCLI
    from agentcap.training.module import GRPOModule

    config = make_read_config(tmp_path / "run", toy_movie, [{"name": "warmup", "kind": "sft", "agent": "policy",
                                                             "steps": 1}])
    document = yaml.safe_load(config.read_text())
    del document["trainer"]["enable_progress_bar"]  # unset: the output decides
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    with contextlib.redirect_stdout(stream()):
        cli = AgentcapCLI(GRPOModule, datamodule_class=None, run=False, args=["--config", str(config)])
    assert isinstance(cli.trainer.progress_bar_callback, StageProgressBar) is bar
    assert (cli.trainer.progress_bar_callback is None) is not bar


def test_time_left_counts_each_stage_at_its_own_pace():
    schedule = Schedule([Stage("a", "sft", "p", steps=4), Stage("b", "grpo", "p", steps=3),
                         Stage("e", "evaluate"), Stage("c", "grpo", "p", steps=2)], ["p"])
    bar = StageProgressBar()
    assert bar.estimate_seconds_left(schedule, 0) is None  # nothing measured yet
    bar._seconds[0] = [1.0, 1.0]  # two SFT ticks done at 1 s each
    # nothing measured for GRPO or evaluation yet: the run's mean tick (1 s) for the 8 ticks left
    assert bar.estimate_seconds_left(schedule, 2) == pytest.approx(2 * 1 + 3 * 1 + 1 + 2 * 1)
    bar._seconds[0] += [1.0, 1.0]
    bar._seconds[1] = [10.0]
    # b: 2 ticks at its 10 s; e: the run's mean (14 s / 5 ticks); c: GRPO's 10 s
    assert bar.estimate_seconds_left(schedule, 5) == pytest.approx(2 * 10 + 14 / 5 + 2 * 10)
    bar._seconds[2] = [30.0]
    assert bar.estimate_seconds_left(schedule, 7) == pytest.approx(30 + 2 * 10)
    assert bar.estimate_seconds_left(schedule, 9) == pytest.approx(10)  # c's first tick is done


def test_unknown_subcommand_suggests_the_nearest(capsys):
    from agentcap.launcher import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fti", "--config", "x.yaml"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'fti'" in err and "did you mean 'fit'" in err


def test_skipped_rows_are_logged_once_and_when_they_change():
    from types import SimpleNamespace

    from agentcap.training.module import GRPOModule

    module = SimpleNamespace(splits=SimpleNamespace(skipped_rows={"train": 2}))
    assert GRPOModule._skipped_rows(module) == {"data/train/skipped_rows": 2.0}
    assert GRPOModule._skipped_rows(module) == {}  # the next steps: nothing new
    module.splits.skipped_rows.update(val=1)
    assert GRPOModule._skipped_rows(module) == {"data/val/skipped_rows": 1.0}
