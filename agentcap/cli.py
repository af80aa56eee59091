"""The ``agentcap`` command: LightningCLI's fit / validate / test / predict, plus ``envs``, ``caption`` and ``export``.

``fit`` resumes from ``<run_dir>/checkpoints/last.ckpt`` when it exists, so re-running a killed
command continues at the same stage and step. Unknown keys and wrong types are refused by
jsonargparse before anything is built.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from lightning.pytorch.cli import LightningCLI

from agentcap.agents.agent import MissingWeightsError
from agentcap.callbacks import SampleTable, TickCheckpoint
from agentcap.module import GRPOModule
import agentcap.strategies  # noqa: F401  (registers grpo_ddp / grpo_ddp_spawn)


class AgentcapCLI(LightningCLI):
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
        if trainer.get("strategy") in ("ddp", "ddp_spawn"):
            trainer["strategy"] = "grpo_" + trainer["strategy"]

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        self.trainer.callbacks.append(TickCheckpoint(every=self.run_config.get("checkpoint_every", 10)))
        self.trainer.callbacks.append(SampleTable())

    def before_fit(self) -> None:
        kwargs = self.config_init[self.subcommand]
        last = TickCheckpoint.path(self.model.run_dir)
        if kwargs.get("ckpt_path") is None and os.path.isfile(last):
            kwargs["ckpt_path"] = last
            kwargs["weights_only"] = True  # agentcap checkpoints hold tensors and plain containers only
            if self.trainer.is_global_zero:
                print(f"agentcap: resuming from {last}", file=sys.stderr)

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:
            path = self.model.write_summary()
            print(os.path.abspath(path))


def envs_command(argv: list[str]) -> int:
    """``agentcap envs``: every registered agentcap environment, one line each."""
    import gymnasium as gym

    import agentcap  # noqa: F401  (registers the built-ins)

    for module in argv:
        __import__(module)
    for env_id, spec in sorted(gym.registry.items()):
        entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
        if env_id.startswith("agentcap/") or argv:
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


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("WANDB_MODE", "offline" if not os.environ.get("WANDB_API_KEY") else "online")
    if argv and argv[0] == "envs":
        raise SystemExit(envs_command(argv[1:]))
    if argv and argv[0] == "caption":
        from agentcap.inference import caption_command

        raise SystemExit(caption_command(argv[1:]))
    if argv and argv[0] == "export":
        from agentcap.export import export_command

        raise SystemExit(export_command(argv[1:]))
    try:
        AgentcapCLI(GRPOModule, datamodule_class=None, args=argv, save_config_kwargs={"overwrite": True})
    except MissingWeightsError as err:
        print(f"agentcap: {err}{_demo_hint(argv)}", file=sys.stderr)
        raise SystemExit(2) from None


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
