"""The ``agentcap`` command: LightningCLI's fit / validate / test / predict, plus the commands of
:data:`COMMANDS` (``envs``, ``caption``, ``evaluate``, ``plan``, …), each with its own argparse parser.

``fit`` resumes from ``<run_dir>/checkpoints/last.ckpt`` when it exists, so re-running a killed
command continues at the same stage and step. Unknown keys and wrong types are refused by
jsonargparse before anything is built.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import Any

from lightning.pytorch.cli import LightningCLI

from agentcap.agents.agent import MissingWeightsError
from agentcap.callbacks import SampleTable, TickCheckpoint, TickStep
from agentcap.module import GRPOModule
import agentcap.strategies  # noqa: F401  (registers grpo_ddp / grpo_ddp_spawn / grpo_fsdp)


#: Subcommands outside LightningCLI: name → ("module:function" taking argv, returning an exit code;
#: the one-line help ``agentcap --help`` lists). Add a command by adding a line.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("agentcap.cli:envs_command", "List the registered agentcap environments."),
    "caption": ("agentcap.inference:caption_command", "Caption clips or audio files with a trained system."),
    "evaluate": ("agentcap.evaluation.command:evaluate_command",
                 "The papers' metrics (BLEU, METEOR, ROUGE-L, CIDEr, R@k/N, …) for a run or predictions."),
    "plan": ("agentcap.plan:plan_command", "Memory per rank and stage of a config, from config.json files alone."),
}


class AgentcapCLI(LightningCLI):
    def _add_subcommands(self, parser, **kwargs) -> None:
        super()._add_subcommands(parser, **kwargs)
        from jsonargparse import ArgumentParser

        for name, (_, help) in COMMANDS.items():  # listed in --help; `main` runs them before LightningCLI
            parser._subcommands_action.add_subcommand(name, ArgumentParser(description=help), help=help)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--checkpoint_every", type=int, default=10, help="Ticks between checkpoints.")
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

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        self.trainer.callbacks.append(TickCheckpoint(every=self.run_config.get("checkpoint_every", 10)))
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
        from agentcap.evaluation.table import results_table

        path = self.model.write_summary()
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
        order = [s.name for s in self.model.schedule.stages if s.kind == "evaluate"]
        print(results_table(summary, title=f"agentcap {self.subcommand}: {self.model.run_dir}", order=order))
        print(os.path.abspath(path))

    def before_fit(self) -> None:
        self.log_config()
        kwargs = self.config_init[self.subcommand]
        last = TickCheckpoint.path(self.model.run_dir)
        if kwargs.get("ckpt_path") is None and os.path.isfile(last):
            kwargs["ckpt_path"] = last
            kwargs["weights_only"] = True  # agentcap checkpoints hold tensors and plain containers only
            if self.trainer.is_global_zero:
                print(f"agentcap: resuming from {last}", file=sys.stderr)

    def before_validate(self) -> None:
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


def envs_command(argv: list[str]) -> int:
    """``agentcap envs``: every registered agentcap environment, one line each."""
    import argparse

    import gymnasium as gym

    import agentcap  # noqa: F401  (registers the built-ins)

    parser = argparse.ArgumentParser(prog="agentcap envs", description="List the registered agentcap environments.")
    parser.add_argument("modules", nargs="*", help="modules to import first (they register their own envs, also listed)")
    modules = parser.parse_args(argv).modules
    for module in modules:
        __import__(module)
    for env_id, spec in sorted(gym.registry.items()):
        entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
        if env_id.startswith("agentcap/") or modules:
            summary = _first_doc_line(spec)
            print(f"{env_id:32s} {entry:48s} {summary}")
    return 0


def _first_doc_line(spec: Any) -> str:
    try:
        from gymnasium.envs.registration import load_env_creator

        creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
        return (creator.__doc__ or "").strip().splitlines()[0]
    except Exception as err:  # an env whose module fails to import is still listed
        return f"(cannot import: {err})"


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
    program, sys.argv = sys.argv, sys.argv[:1]  # `argv` is the command line: LightningCLI must not see both
    try:
        AgentcapCLI(GRPOModule, datamodule_class=None, args=argv, save_config_kwargs={"overwrite": True})
    except MissingWeightsError as err:
        print(f"agentcap: {err}{_demo_hint(argv)}", file=sys.stderr)
        raise SystemExit(2) from None
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
