"""The ``agentcap`` command: LightningCLI's fit / validate / test / predict, plus the commands of
:data:`COMMANDS` (``envs``, ``caption``, ``evaluate``, ``export``, ``plan``), each with its own argparse parser.

``fit`` resumes from the run's newest readable checkpoint (``<run_dir>/checkpoints``), so re-running
a killed command continues at the same stage and step; a run directory whose saved ``config.yaml``
differs from the new config is refused unless ``--resume anyway`` (or ``fresh``). ``validate``,
``test`` and ``predict`` load the run's newest checkpoint and refuse when there is none. Unknown keys
and wrong types are refused by jsonargparse before anything is built.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any, Literal

import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

import agentcap.parallel.strategies  # noqa: F401  (registers grpo_ddp / grpo_ddp_spawn / grpo_fsdp)
from agentcap.agents.agent import MissingWeightsError
from agentcap.commands.menu import COMMANDS, did_you_mean, refuse_unknown
from agentcap.core.manifests import ManifestError
from agentcap.core.settings import ConfigError
from agentcap.judges.replies import TooManyInvalidReplies
from agentcap.parallel import watchdog
from agentcap.parallel.http_client import ServerUnavailable
from agentcap.parallel.loading import load_by_shard
from agentcap.parallel.signals import StopOnSignal, stop_on_signals
from agentcap.resume import numerics
from agentcap.resume.checkpoints import TickCheckpoint, latest_checkpoint, usable_checkpoint
from agentcap.resume.configs import config_paths, read_config
from agentcap.resume.disk import OutOfSpace, is_full, no_space
from agentcap.resume.run_dir import RunLock, check_writable, logger_run_id
from agentcap.training.callbacks import print_results
from agentcap.training.finite import NonFiniteError
from agentcap.training.module import GRPOModule
from agentcap.training.resume_guard import changed_keys, move_aside


class SuggestingParser(LightningArgumentParser):
    """An unknown flag or config key is refused in two lines naming the nearest known one, instead of
    the subcommand's whole usage (hundreds of lines of Trainer flags) and no suggestion."""

    def error(self, message: str, ex: Exception | None = None):
        parser = getattr(ex, "subcommand_parser", None) or self
        subcommands = getattr(parser, "_subcommands_action", None)  # a config file's key: the subcommands' options
        parsers = [parser, *(subcommands._name_parser_map.values() if subcommands is not None else [])]
        message += did_you_mean(message, [o for p in parsers for a in p._actions for o in a.option_strings
                                          if o.startswith("--")])
        if not self.exit_on_error or callable(self._error_handler):
            return super().error(message, ex)
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"{prog}: error: {message}\n(its options: {prog} --help)\n")
        raise SystemExit(2)


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
            "--collective_timeout", type=float, default=None,
            help="Seconds a collective of grpo_ddp / grpo_fsdp waits for a silent rank before the run stops "
                 "(default 600, or $AGENTCAP_COLLECTIVE_TIMEOUT); a rank that waits 60 s "
                 "($AGENTCAP_WATCHDOG_AFTER) names the ranks that have not arrived.",
        )
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
        # sharded agents are built on the meta device and load shard by shard (agentcap.parallel.loading)
        load_by_shard(trainer.get("strategy") == "grpo_fsdp" or "GRPOFSDPStrategy" in str(trainer.get("strategy")))
        child_run_names(trainer.get("logger"), self.subcommand)
        _loggers_into_run_dir(trainer, self.run_config["model"]["run_dir"])
        if _has_model_checkpoint(trainer.get("callbacks")):
            trainer["enable_checkpointing"] = True  # a ModelCheckpoint needs it; no flag to remember
        # before the module writes its vocabulary, or validate evaluates and then cannot save
        check_writable(self.run_config["model"]["run_dir"], f"agentcap {self.subcommand}")
        TickCheckpoint.check(self.run_config.get("checkpoint_every", 10), self.run_config.get("checkpoint_keep", 3))
        timeout = self.run_config.get("collective_timeout")
        if timeout is not None:  # read by the strategies, here and on the ranks Lightning's launcher starts
            if not timeout > 0 or timeout == float("inf"):
                raise ConfigError(f"--collective_timeout must be > 0 seconds, got {timeout}")
            os.environ[watchdog.TIMEOUT_ENV] = repr(float(timeout))

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        config = self.run_config
        # the module adds its other callbacks (GRPOModule.configure_callbacks) and keeps this one
        self.trainer.callbacks.append(
            TickCheckpoint(every=config.get("checkpoint_every", 10), keep=config.get("checkpoint_keep", 3))
        )
        for logger in self.trainer.loggers:  # Lightning passes wandb a setting it deprecates ("anonymous")
            if getattr(logger, "_wandb_init", {}).get("anonymous", True) is None:
                logger._wandb_init.pop("anonymous")

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        """Our stage bar is the default console (``agentcap.training.console``), unless the config
        turns the bar off or brings its own. Output that is not a terminal (a log file, a job
        scheduler's capture) gets no bar unless the config asks for one: a bar's redraws are noise
        there, and ``LogLines`` prints one line per logging step instead."""
        from lightning.pytorch.callbacks import ProgressBar

        from agentcap.training.console import StageProgressBar

        configured = list(callbacks)
        for given in (config.get("callbacks"), self.trainer_defaults.get("callbacks")):
            configured += given if isinstance(given, list) else [given] if given is not None else []
        own_bar = any(isinstance(c, ProgressBar) for c in configured)
        if config.get("enable_progress_bar") is None and not own_bar and not sys.stdout.isatty():
            config = {**config, "enable_progress_bar": False}
        if config.get("enable_progress_bar") is not False and not own_bar:
            callbacks = [*callbacks, StageProgressBar()]
        return super()._instantiate_trainer(config, callbacks)

    def log_config(self) -> None:
        """The resolved config, as `config.yaml` holds it, to every logger."""
        import yaml

        config = yaml.safe_load(self._parser(self.subcommand).dump(self.run_config))
        for logger in self.trainer.loggers:
            logger.log_hyperparams(config)

    def print_results(self) -> None:
        """The table of every evaluated stage in ``summary.json`` (schedule order), on the console."""
        print_results(self.model, f"agentcap {self.subcommand}")

    _lock: RunLock | None = None

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        finally:  # also when fit fails: the next command (in this process too) may take the run_dir
            if self._lock is not None:
                self._lock.release()

    def before_fit(self) -> None:
        self._resume_or_refuse()
        if self.trainer.is_global_zero:  # accepted: only now may a logger start its run
            continue_logger_runs(self.trainer.loggers, self.model.run_dir)
        self.log_config()

    def _resume_or_refuse(self) -> None:
        kwargs = self.config_init[self.subcommand]
        run_dir, mode = self.model.run_dir, self.run_config.get("resume", "auto")
        if self.trainer.is_global_zero:  # the process that trains owns the run_dir; other ranks are its own
            self._lock = RunLock(run_dir).acquire()
            if mode == "fresh" and kwargs.get("ckpt_path") is None:
                move_aside(run_dir)  # before anything (a logger) writes the new run's files
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

    def after_validate(self) -> None:  # fit's table comes from the module's ResultsTable callback
        if self.trainer.is_global_zero:
            self.print_results()

    after_test = after_validate


def continue_logger_runs(loggers: Any, run_dir: str) -> None:
    """One W&B run per run_dir: a ``WandbLogger`` given no ``id`` logs to the run whose id
    ``<run_dir>/wandb_id`` holds (made by the first fit), resumed (``resume="allow"``), so a restarted
    run continues its curves instead of opening a new run. Called once the config is accepted."""
    for logger in loggers:
        init = getattr(logger, "_wandb_init", None)
        if init is None or init.get("id") or getattr(logger, "_experiment", None) is not None:
            continue
        init["id"] = logger._id = logger_run_id(run_dir)
        init.setdefault("resume", "allow")


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
    """``fit`` saves its config as ``<run_dir>/config.yaml`` (not in a logger folder shared by runs)
    and appends its numerics (threads, pinned CPU kernels, versions) to ``numerics.json``; validate /
    test / predict leave both alone, so they stay what the checkpoints were trained with."""

    def __init__(self, parser, config, **kwargs):
        super().__init__(parser, config, **{**kwargs, "save_to_log_dir": False})

    def save_config(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            os.makedirs(pl_module.run_dir, exist_ok=True)
            self.parser.save(self.config, os.path.join(pl_module.run_dir, "config.yaml"), skip_unset=False,
                             overwrite=True)
            numerics.record(pl_module.run_dir, report=lambda line: print(line, file=sys.stderr))


def _has_model_checkpoint(callbacks: Any) -> bool:
    """Whether the configured trainer callbacks (class_path entries) hold a ``ModelCheckpoint``."""
    import importlib

    from lightning.pytorch.callbacks import ModelCheckpoint

    for entry in callbacks if isinstance(callbacks, list) else [callbacks]:
        path = str(entry.get("class_path", "")) if hasattr(entry, "get") else ""
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name) if module else None
        except (ImportError, AttributeError):
            continue  # jsonargparse names the bad class_path itself
        if isinstance(entry, ModelCheckpoint) or (isinstance(cls, type) and issubclass(cls, ModelCheckpoint)):
            return True
    return False


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
    # ModelCheckpoint(every_n_train_steps) under manual optimisation: a tick's checkpoint after its update is the point
    r".*Using ModelCheckpoint with manual optimization and every_n_train_steps",
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


#: ``--debug`` anywhere on the command line: errors a user can fix keep their traceback (the
#: environment variable carries it to the ranks Lightning's launcher starts).
DEBUG = "AGENTCAP_DEBUG"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:
        argv.remove("--debug")
        os.environ[DEBUG] = "1"
    os.environ.setdefault("WANDB_MODE", "offline" if not os.environ.get("WANDB_API_KEY") else "online")
    refuse_unknown(argv)  # `agentcap fti`: "did you mean 'fit'?", not LightningCLI's list of choices
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
                        parser_class=SuggestingParser,
                        save_config_kwargs={"overwrite": True},
                        trainer_defaults={"callbacks": [StopOnSignal(), watchdog.RankWatchdog()]})
    except (MissingWeightsError, ConfigError, ManifestError, NonFiniteError) as err:
        # weights not on disk; a setting out of range; a refused manifest row; a NaN / Inf that stopped
        # the run: the message says what to fix, a traceback would bury it (kept under --debug)
        if os.environ.get(DEBUG):
            raise
        hint = _demo_hint(argv) if isinstance(err, MissingWeightsError) else ""
        print(f"agentcap: {err}{hint}", file=sys.stderr)
        raise SystemExit(1 if isinstance(err, NonFiniteError) else 2) from None
    except (TooManyInvalidReplies, ServerUnavailable) as err:
        # a served judge that answers nonsense or not at all: its one line names the URL and model
        if os.environ.get(DEBUG):
            raise
        print(f"agentcap: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except (OSError, RuntimeError) as err:
        # a dead or silent rank broke a collective: RankWatchdog named it in one line, not gloo's traceback
        if watchdog.failure()[0] and not os.environ.get(DEBUG):
            raise SystemExit(1) from None
        if not is_full(err) or os.environ.get(DEBUG):
            raise
        # a full disk (or TMPDIR): the file and the room its folder has, not torch's "file write failed"
        print(f"agentcap: {err if isinstance(err, OutOfSpace) else no_space(err)}", file=sys.stderr)
        raise SystemExit(1) from None
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
