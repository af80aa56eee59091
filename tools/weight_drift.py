"""How far a run moved its warm start, per part of the model: the relative change of the weights.

A LoRA pair changes W by (alpha / r)·B·A; a module trained in full (peft's ``modules_to_save``) by
its copy − W0. Both are measured against ‖W0‖, the warm start's own tensor, and summed per part
(audio tower, projector, language model): ‖ΔW‖ / ‖W0‖ over the part's adapted tensors. GRPO's KL term
sees only the tokens it samples; this sees what every held-out caption runs through (docs/real.md,
"The projector frozen").

    python tools/weight_drift.py runs/real/numbers/audiomap-demo-s26 runs/real/frozenproj/audiomap-demo-s48
"""

from __future__ import annotations

import argparse
import glob
import math
import os
from collections import defaultdict
from collections.abc import Sequence

import torch
import yaml
from safetensors import safe_open


def part_path(key: str) -> str:
    """A parameter's path without the wrappers' ``model`` levels, which differ between a checkpoint
    of the peft-wrapped agent and the saved HF folder (``model.language_model.layers.0…`` there,
    ``language_model.model.layers.0…`` here)."""
    return ".".join(p for p in key.split(".") if p != "model")


def deltas(state: dict[str, torch.Tensor], role: str, scale: float) -> dict[str, tuple[str, torch.Tensor]]:
    """(kind, ΔW) of every tensor adapter ``role`` changes, by :func:`part_path` of its base weight."""
    prefix = f"agents.{role}."
    out: dict[str, tuple[str, torch.Tensor]] = {}
    for key, value in state.items():
        if not key.startswith(prefix):
            continue
        key = key[len(prefix):]
        if f".lora_A.{role}." in key:
            b = state[prefix + key.replace(".lora_A.", ".lora_B.")]
            out[part_path(key.replace(f".lora_A.{role}", ""))] = ("lora", scale * (b.float() @ value.float()))
        elif f".modules_to_save.{role}." in key:
            out[part_path(key.replace(f".modules_to_save.{role}", ""))] = ("full", value.float())
    return out


def drift(run: str, role: str = "policy", base: str | None = None) -> dict[tuple[str, str], tuple[float, int]]:
    """(part, kind) → (‖ΔW‖ / ‖W0‖ over the part's changed tensors, how many) for ``run``'s last checkpoint."""
    config_path = os.path.join(run, "config.yaml")
    with open(config_path) as handle:
        agent = yaml.safe_load(handle)["model"]["agents"][role]
    peft = agent.get("peft") or {}
    if not peft:
        raise ValueError(f"{config_path}: model.agents.{role}.peft is empty — no adapter to measure")
    base = base or agent["model"]
    files = sorted(glob.glob(os.path.join(base, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{base}: no *.safetensors (model.agents.{role}.model of {config_path})")
    ckpt = os.path.join(run, "checkpoints", "last.ckpt")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    changed = deltas(state, role, peft["alpha"] / peft["r"])
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # Σ‖ΔW‖², Σ‖W0‖², tensors
    found: set[str] = set()
    for path in files:
        with safe_open(path, "pt") as handle:
            for key in handle.keys():
                name = part_path(key)
                if name not in changed:
                    continue
                kind, delta = changed[name]
                w0 = handle.get_tensor(key).float()
                if delta.shape != w0.shape:
                    raise ValueError(f"{ckpt}: {name} has shape {tuple(delta.shape)}, {path}:{key} {tuple(w0.shape)}")
                if kind == "full":
                    delta = delta - w0
                found.add(name)
                cell = sums[(name.split(".")[0], kind)]
                cell[0] += float(delta.pow(2).sum())
                cell[1] += float(w0.pow(2).sum())
                cell[2] += 1
    missing = sorted(set(changed) - found)
    if missing:
        raise KeyError(f"{ckpt}: {missing[0]} (and {len(missing) - 1} more) not in the warm start {base}")
    return {key: (math.sqrt(d / w) if w else math.inf, int(n)) for key, (d, w, n) in sums.items()}


def main(argv: Sequence[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--role", default="policy")
    p.add_argument("--base", help="the warm start's folder (default: the run's model.agents.<role>.model)")
    args = p.parse_args(argv)
    lines = ["| run | part | trained as | tensors | ‖ΔW‖ / ‖W0‖ |", "|---|---|---|---|---|"]
    for run in args.runs:
        for (part, kind), (rel, n) in sorted(drift(run, args.role, args.base).items()):
            lines.append(f"| {os.path.basename(os.path.normpath(run))} | {part} | {kind} | {n} | {rel:.4f} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
