"""The ``agentcap`` command: LightningCLI's fit / validate / test / predict, plus the commands of
:data:`COMMANDS` (``envs``, ``caption``, ``evaluate``, ``export``, ``plan``), each with its own argparse parser.

``fit`` resumes from the run's newest readable checkpoint (``<run_dir>/checkpoints``), so re-running
a killed command continues at the same stage and step; a run directory whose saved ``config.yaml``
differs from the new config is refused unless ``--resume anyway`` (or ``fresh``). ``validate``,
``test`` and ``predict`` load the run's newest checkpoint and refuse when there is none. Unknown keys
and wrong types are refused by jsonargparse before anything is built.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import Any, Literal

import yaml
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

import agentcap.parallel.strategies  # noqa: F401  (registers grpo_ddp / grpo_ddp_spawn / grpo_fsdp)
from agentcap.agents.agent import MissingWeightsError
from agentcap.core.settings import ConfigError
from agentcap.evaluation.table import results_table
from agentcap.parallel.signals import StopOnSignal, stop_on_signals
from agentcap.resume.checkpoints import TickCheckpoint, latest_checkpoint, usable_checkpoint
from agentcap.resume.configs import config_paths, read_config
from agentcap.resume.guard import changed_keys, move_aside
from agentcap.resume.run_dir import RunLock, check_writable
from agentcap.training.callbacks import SampleTable, TickStep
from agentcap.training.finite import NonFiniteError
from agentcap.training.module import GRPOModule

#: Subcommands outside LightningCLI: name → ("module:function" taking argv, returning an exit code;
#: the one-line help ``agentcap --help`` lists). Add a command by adding a line.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("agentcap.commands.envs:envs_command", "List the registered agentcap environments."),
    "caption": ("agentcap.commands.caption:caption_command", "Caption clips or audio files with a trained system."),
    "evaluate": ("agentcap.commands.evaluate:evaluate_command",
                 "The papers' metrics (BLEU, METEOR, ROUGE-L, CIDEr, R@k/N, …) for a run or predictions."),
    "export": ("agentcap.commands.export:export_command", "Write each trained agent as a save_pretrained folder."),
    "plan": ("agentcap.commands.plan:plan_command", "Memory per rank and stage of a config, from config.json files alone."),
    "data": ("agentcap.commands.data:data_command", "Convert public datasets to manifests (convert); build question banks (bank)."),
}


class AgentcapCLI(LightningCLI):
    def _add_subcommands(self, parser, **kwargs) -> None:
        super()._add_subcommands(parser, **kwargs)
        from jsonargparse import ArgumentParser

        for name, (_, help) in COMMANDS.items():  # listed in --help; `main` runs them before LightningCLI
            parser._subcommands_action.add_subcommand(name, ArgumentParser(description=help), help=help)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--checkpoint_every", type=int, default=10, help="Ticks between checkpoints.")
        parser.add_argument("--checkpoint_keep", type=int, default=3, help="How many newest checkpoints to keep.")
        parser.add_argument(
            "--resume", type=Literal["auto", "anyway", "fresh"], default="auto",
            help="fit on a run_dir with checkpoints: auto resumes only when the saved config.yaml has the same "
                 "model and seed (else refuses, naming the keys); anyway resumes regardless; fresh moves the "
                 "old run's files aside and starts again.",
        )
        # everything a run writes (config.yaml, logs, checkpoints, summary) lands in its run_dir
        parser.link_arguments("model.run_dir", "trainer.default_root_dir")
        parser.set_defaults(
            {
                "trainer.max_epochs": 1,
                "trainer.num_sanity_val_steps": 0,
                "trainer.enable_checkpointing": False,
                "trainer.log_every_n_steps": 1,
                "trainer.accelerator": "auto",
                # stages choose the trainable agent; before the first one, Lightning's summary
                # would report "Trainable params: 0"
                "trainer.enable_model_summary": False,
            }
        )

    @property
    def run_config(self):
        """This subcommand's part of the parsed config."""
        return self.config.get(self.subcommand, self.config) if self.subcommand else self.config

    def before_instantiate_classes(self) -> None:
        trainer = self.run_config.get("trainer", {})
        # DDP's reducer cannot follow a trainable agent that changes between stages; the module
        # sums gradients itself, so plain "ddp" means our unwrapped variant.
        # Lightning's "fsdp" is FSDP1 over the whole module; ours is FSDP2 per agent.
        if trainer.get("strategy") in ("ddp", "ddp_spawn", "fsdp"):
            trainer["strategy"] = "grpo_" + trainer["strategy"]
        child_run_names(trainer.get("logger"), self.subcommand)
        _loggers_into_run_dir(trainer, self.run_config["model"]["run_dir"])
        # before the module writes its vocabulary, or validate evaluates and then cannot save
        check_writable(self.run_config["model"]["run_dir"], f"agentcap {self.subcommand}")

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        config = self.run_config
        self.trainer.callbacks.append(
            TickCheckpoint(every=config.get("checkpoint_every", 10), keep=config.get("checkpoint_keep", 3))
        )
        self.trainer.callbacks.append(SampleTable())
        self.trainer.callbacks.insert(0, TickStep())
        for logger in self.trainer.loggers:  # Lightning passes wandb a setting it deprecates ("anonymous")
            if getattr(logger, "_wandb_init", {}).get("anonymous", True) is None:
                logger._wandb_init.pop("anonymous")

    def log_config(self) -> None:
        """The resolved config, as `config.yaml` holds it, to every logger."""
        import yaml

        config = yaml.safe_load(self._parser(self.subcommand).dump(self.run_config))
        for logger in self.trainer.loggers:
            logger.log_hyperparams(config)

    def print_results(self) -> None:
        """The table of every evaluated stage in ``summary.json`` (schedule order), on the console."""
        path = self.model.write_summary()
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
        order = [s.name for s in self.model.schedule.stages if s.kind == "evaluate"]
        print(results_table(summary, title=f"agentcap {self.subcommand}: {self.model.run_dir}", order=order))
        print(os.path.abspath(path))

    _lock: RunLock | None = None

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        finally:  # also when fit fails: the next command (in this process too) may take the run_dir
            if self._lock is not None:
                self._lock.release()

    def before_fit(self) -> None:
        kwargs = self.config_init[self.subcommand]
        run_dir, mode = self.model.run_dir, self.run_config.get("resume", "auto")
        if self.trainer.is_global_zero:  # the process that trains owns the run_dir; other ranks are its own
            self._lock = RunLock(run_dir).acquire()
            if mode == "fresh" and kwargs.get("ckpt_path") is None:
                move_aside(run_dir)  # before anything (a logger) writes the new run's files
        self.log_config()
        if kwargs.get("ckpt_path") is not None:
            kwargs["weights_only"] = True  # checked by _parse_ckpt_path
            return
        if mode == "fresh":
            return
        last = latest_checkpoint(run_dir)
        if last is None:
            return
        changed = changed_keys(os.path.join(run_dir, "config.yaml"), self._dumped())
        if changed and mode == "auto":
            raise SystemExit(
                f"agentcap fit: {run_dir} holds a run started with another config ({'; '.join(changed)}).\n"
                "Resume it with the old config, pass --resume anyway to continue with the new one, "
                "--resume fresh to start over (the old files are moved aside), or choose another --model.run_dir."
            )
        if changed and self.trainer.is_global_zero:
            print(f"agentcap: --resume anyway: continuing {run_dir} with changed {'; '.join(changed)}", file=sys.stderr)
        kwargs["ckpt_path"] = last
        kwargs["weights_only"] = True  # agentcap checkpoints hold tensors and plain containers only
        if self.trainer.is_global_zero:
            print(f"agentcap: resuming from {last}", file=sys.stderr)

    def _dumped(self) -> dict[str, Any]:
        """This command's config as ``config.yaml`` would hold it."""
        return yaml.safe_load(self._parser(self.subcommand).dump(self.run_config, skip_unset=False)) or {}

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path`` is checked before LightningCLI reads it: a URL is downloaded into the run_dir
        (Lightning would load it with ``weights_only=False``), a file that would run code is refused in
        one line; before_fit / _load_trained then tell the Trainer ``weights_only=True``."""
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand) if subcommand else None
        if config is not None and config.get("ckpt_path"):
            config["ckpt_path"] = usable_checkpoint(str(config["ckpt_path"]), config["model"]["run_dir"],
                                                    "--ckpt_path", f"agentcap {subcommand}", lightning=True)
        super()._parse_ckpt_path()

    def _load_trained(self) -> None:
        """validate / test / predict evaluate the run's newest checkpoint, never untrained weights."""
        kwargs = self.config_init[self.subcommand]
        if kwargs.get("ckpt_path") is not None:
            kwargs["weights_only"] = True  # checked by _parse_ckpt_path
            return
        last = latest_checkpoint(self.model.run_dir)
        if last is None:
            raise SystemExit(
                f"agentcap {self.subcommand}: no checkpoint in {os.path.join(self.model.run_dir, 'checkpoints')}; "
                "train first (agentcap fit --config …) or pass --ckpt_path"
            )
        kwargs["ckpt_path"], kwargs["weights_only"] = last, True
        if self.trainer.is_global_zero:
            print(f"agentcap: {self.subcommand} with {last}", file=sys.stderr)

    def before_validate(self) -> None:
        self._load_trained()
        self.log_config()

    before_test = before_predict = before_validate

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:
            self.print_results()

    after_validate = after_test = after_fit


def child_run_names(logger: Any, subcommand: str | None) -> None:
    """`validate` / `test` / `predict` log to a run named ``<training run>-<subcommand>`` (W&B: in
    the training run's group), not to a second run that looks like the training one."""
    if subcommand in (None, "fit") or logger is None or isinstance(logger, bool):
        return
    for entry in logger if isinstance(logger, list) else [logger]:
        init = entry.get("init_args") if hasattr(entry, "get") else None
        if init is None or not init.get("name"):
            continue
        if str(entry.get("class_path", "")).endswith("WandbLogger"):
            init["group"] = init["name"]
        init["name"] = f"{init['name']}-{subcommand}"


class RunConfig(SaveConfigCallback):
    """``fit`` saves its config as ``<run_dir>/config.yaml`` (not in a logger folder shared by runs);
    validate / test / predict leave it alone, so it stays the config the checkpoints were trained with."""

    def __init__(self, parser, config, **kwargs):
        super().__init__(parser, config, **{**kwargs, "save_to_log_dir": False})

    def save_config(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            os.makedirs(pl_module.run_dir, exist_ok=True)
            self.parser.save(self.config, os.path.join(pl_module.run_dir, "config.yaml"), skip_unset=False,
                             overwrite=True)


def _loggers_into_run_dir(trainer: Any, run_dir: str) -> None:
    """Point every configured logger's ``save_dir`` at the run's folder."""
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init = getattr(logger, "init_args", None) if logger is not None else None
        if init is None:
            continue
        before = init.get("save_dir")
        if before not in (None, run_dir):
            print(f"agentcap: logger save_dir {before} → {run_dir} (everything a run writes is in its run_dir)",
                  file=sys.stderr)
        init["save_dir"] = run_dir
        if init.get("dir") is not None:  # WandbLogger's alias of save_dir
            init["dir"] = run_dir


#: Warnings a normal run raises that are false for agentcap (each says why).
QUIET = (
    # manual optimisation: each stage builds its own AdamW, so configure_optimizers returns None
    r".*this fit will run with no optimizer",
    # frozen agents (and every agent before its stage) are in eval mode by design
    r".*module\(s\) in eval mode",
    # the tick loader has a length and no workers
    r".*`IterableDataset` has `__len__` defined",
    # Lightning's own use of a torch API it has not caught up with
    r".*isinstance\(treespec, LeafSpec\)",
    # LightningCLI's own config dump still passes jsonargparse's old keyword
    r"\s*skip_none parameter was deprecated",
)


class _NoTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet() -> None:
    """Silence the false or advertising messages of a normal run (``QUIET``, Lightning's tips,
    transformers' weight-loading bars)."""
    for pattern in QUIET:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_NoTips())
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("WANDB_MODE", "offline" if not os.environ.get("WANDB_API_KEY") else "online")
    quiet()
    if argv and argv[0] in COMMANDS:
        import importlib

        module, function = COMMANDS[argv[0]][0].split(":")
        raise SystemExit(getattr(importlib.import_module(module), function)(argv[1:]))
    for path in config_paths(argv):  # an empty file: one sentence, not LightningCLI's blank "Unexpected config"
        read_config(path, "agentcap" + (f" {argv[0]}" if argv[0] in ("fit", "validate", "test", "predict") else ""))
    # `argv` becomes the command line LightningCLI reads (args=None: no "args and command line"
    # warning), and the one Lightning's DDP launcher re-runs for the other ranks
    program, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        with stop_on_signals():  # SIGTERM / SIGUSR1: save between ticks, exit 128 + signal (never 0)
            AgentcapCLI(GRPOModule, datamodule_class=None, args=None, save_config_callback=RunConfig,
                        save_config_kwargs={"overwrite": True}, trainer_defaults={"callbacks": [StopOnSignal()]})
    except MissingWeightsError as err:
        print(f"agentcap: {err}{_demo_hint(argv)}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ConfigError, NonFiniteError) as err:  # a setting out of range; a NaN / Inf that stopped the run
        print(f"agentcap: {err}", file=sys.stderr)
        raise SystemExit(2 if isinstance(err, ConfigError) else 1) from None
    finally:
        sys.argv = program


def _demo_hint(argv: list[str]) -> str:
    """Name the offline demo that mirrors a paper recipe, e.g. configs/read.yaml → configs/demo/read.yaml."""
    for i, arg in enumerate(argv):
        path = arg.split("=", 1)[1] if arg.startswith("--config=") else (argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None)
        if path:
            demo = os.path.join(os.path.dirname(path), "demo", os.path.basename(path))
            if os.path.isfile(demo) and os.path.abspath(demo) != os.path.abspath(path):
                return f"\nThe offline demo of this recipe runs anywhere: agentcap fit --config {demo}"
    return ""


if __name__ == "__main__":
    main()
