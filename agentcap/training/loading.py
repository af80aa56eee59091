"""Loading a run: the module a training config describes, with a checkpoint's weights.

Used by every command that runs trained agents (``caption``, ``evaluate``, ``export``);
checkpoints load with ``weights_only=True``: they hold tensors and plain containers only. A sharded
checkpoint (a folder, ``grpo_fsdp``) is consolidated in this one process, no process group needed.
"""

from __future__ import annotations

import os
import sys

from jsonargparse import ArgumentParser
from lightning import seed_everything

from agentcap.resume.checkpoints import TickCheckpoint, read_checkpoint, usable_checkpoint
from agentcap.resume.configs import read_config
from agentcap.rollout.splits import EnvConfig
from agentcap.training.module import GRPOModule


def load_module(config: str, checkpoint: str | None, command: str = "agentcap"):
    """Build the GRPOModule a training config describes and load a checkpoint's weights into it.

    ``checkpoint`` may be an http(s) URL (downloaded into ``<run_dir>/downloads/``); a file that would
    run code to load is refused in one line (:func:`usable_checkpoint`)."""
    document = read_config(config, command)
    if not isinstance(document.get("model"), dict):
        raise SystemExit(f"{command}: {config}: no 'model' section (give the config `agentcap fit` ran with)")
    # only the model section matters here; a run's saved config.yaml (all of LightningCLI's keys) works too
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(GRPOModule, "model")
    seed = document.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):  # random-init bases (toy, tiny) as in training
        seed_everything(seed, verbose=False)
    init = parser.instantiate_classes(parser.parse_object({"model": document["model"]}))
    module: GRPOModule = init.model
    if checkpoint is not None:
        if "://" not in checkpoint and not os.path.exists(checkpoint):
            raise SystemExit(f"{command}: --checkpoint {checkpoint!r} not found "
                             f"(train first: agentcap fit --config {config})")
        path = usable_checkpoint(checkpoint, module.run_dir, "--checkpoint", command)
        module.load_state_dict(read_checkpoint(path)["state_dict"])
    module.eval()
    return module


def env_config_of(config: str):
    """The environment and the evaluate stages' names of a training config (no agent is built)."""
    model = read_config(config, "agentcap evaluate").get("model")
    if not isinstance(model, dict) or not isinstance(model.get("env"), dict):
        raise SystemExit(f"agentcap evaluate: {config}: no 'model.env' section (give the config `agentcap fit` ran with)")
    stages = [s.get("name") for s in model.get("stages", []) if isinstance(s, dict) and s.get("kind") == "evaluate"]
    return EnvConfig(**model["env"]), stages


def trained_module(config: str, checkpoint: str | None):
    """The run's trained module (its newest checkpoint, or ``checkpoint``); untrained weights, said so, when none."""
    module = load_module(config, None, "agentcap evaluate")
    path = checkpoint or TickCheckpoint.path(module.run_dir)
    if checkpoint or os.path.exists(path):
        return load_module(config, path, "agentcap evaluate")
    print(f"agentcap evaluate: no checkpoint at {path}; scoring untrained weights", file=sys.stderr)
    return module
