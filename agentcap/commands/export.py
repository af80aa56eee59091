"""``agentcap export``: each trained agent of a run as a ``save_pretrained`` folder.

The agents and their checkpoint come from the training config (as ``agentcap caption`` reads
them). A fully fine-tuned agent is saved as it is. A LoRA agent is either merged into its base
(``--merge``, the default: one plain model folder) or kept separate (``--no-merge``): its folder
then holds the adapter (``adapter_config.json``) pointing at a base folder written once per base,
which ``transformers`` loads through its peft integration. Each folder also gets the agent's
tokenizer or processor, so ``AutoModelForCausalLM.from_pretrained(folder)`` and
``AutoTokenizer.from_pretrained(folder)`` are all a user needs.

A sharded checkpoint (a folder of per-rank shards, written under ``grpo_fsdp``) is consolidated
here in one process, without a process group.

Merging works on a copy of the peft model, so roles sharing one base each get exactly their own
adapter merged (the copy costs one more model in host memory while it is written).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

from agentcap.commands.outputs import check_output

# torch and Lightning are imported where they are used: `agentcap export --help` answers at once


def trained_roles(module) -> list[str]:
    """Roles some stage of the schedule trains, in config order."""
    trained = {s.agent for s in module.schedule.stages if s.kind in ("sft", "grpo")}
    return [name for name in module.agents if name in trained]


def _save_tokenizer(agent, folder: str) -> None:
    (agent.processor or agent.tokenizer).save_pretrained(folder)


def _save_model(model: "torch.nn.Module", folder: str) -> None:
    model.save_pretrained(folder)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        print(f"agentcap export: {folder} is not a Hugging Face model (toy format)", file=sys.stderr)


def export_agent(agent, out: str, merge: bool = True, bases: dict[int, str] | None = None) -> str:
    """Write one agent under ``out/<role>``; returns that folder. ``bases`` caches written bases."""
    folder = os.path.join(out, agent.name)
    adapters = agent.adapters
    if adapters is None:
        _save_model(agent.model, folder)
    elif merge:
        import torch

        with torch.no_grad():
            merged = copy.deepcopy(adapters.peft_model).merge_and_unload(adapter_names=[agent.name])
        _save_model(merged, folder)
        del merged
    else:
        bases = {} if bases is None else bases
        key = id(adapters.peft_model)
        if key not in bases:  # one base folder per base model, shared by the roles on it
            bases[key] = os.path.abspath(os.path.join(out, f"{agent.name}-base"))
            _save_model(copy.deepcopy(adapters.peft_model).unload(), bases[key])
            _save_tokenizer(agent, bases[key])
        adapters.peft_model.save_pretrained(out, selected_adapters=[agent.name])  # writes out/<role>/
        config_path = os.path.join(folder, "adapter_config.json")
        with open(config_path) as handle:
            config = json.load(handle)
        config["base_model_name_or_path"] = bases[key]
        with open(config_path, "w") as handle:
            json.dump(config, handle, indent=2)
    _save_tokenizer(agent, folder)
    return folder


def export_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentcap export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the training config (agents + schedule)")
    parser.add_argument("--out", required=True, help="output folder; one sub-folder per agent")
    parser.add_argument("--checkpoint", help="weights: a .ckpt file or a sharded checkpoint folder; "
                                             "default <run_dir>/checkpoints/last.ckpt")
    parser.add_argument("--merge", action=argparse.BooleanOptionalAction, default=True,
                        help="merge LoRA adapters into their base (default) or keep them separate")
    parser.add_argument("--agents", nargs="+", help="roles to export (default: every role the schedule trains)")
    args = parser.parse_args(argv)
    check_output("agentcap export", "--out", args.out, {"--config": args.config, "--checkpoint": args.checkpoint},
                 folder=True)
    from agentcap.resume.checkpoints import TickCheckpoint, read_checkpoint, usable_checkpoint
    from agentcap.training.loading import load_module

    module = load_module(args.config, None, "agentcap export")
    checkpoint = args.checkpoint or TickCheckpoint.path(module.run_dir)
    if "://" not in checkpoint and not os.path.exists(checkpoint):
        raise SystemExit(f"agentcap export: no checkpoint at {checkpoint} (train first: agentcap fit --config {args.config})")
    path = usable_checkpoint(checkpoint, module.run_dir, "--checkpoint", "agentcap export")  # URL, code refused
    # a sharded checkpoint (a folder of shards, grpo_fsdp) is consolidated here, in this one process
    module.load_state_dict(read_checkpoint(path)["state_dict"])
    roles = args.agents or trained_roles(module)
    unknown = sorted(set(roles) - set(module.agents))
    if unknown:
        raise SystemExit(f"agentcap export: --agents {unknown} are not configured roles {sorted(module.agents)}")
    os.makedirs(args.out, exist_ok=True)
    bases: dict[int, str] = {}
    for role in roles:
        print(os.path.abspath(export_agent(module.agents[role], args.out, merge=args.merge, bases=bases)))
    return 0
