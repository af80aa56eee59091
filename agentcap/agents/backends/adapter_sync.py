"""Adapter-only syncs: a LoRA agent's engine holds the base model and receives only the adapter.

After each update the agent's adapter tensors (peft's ``get_peft_model_state_dict``; DTensor shards
gathered one tensor at a time) are written as a peft folder, ``adapter_config.json`` +
``adapter_model.safetensors``, one folder per version under a private temporary directory of this
process. The engine generates with ``LoRARequest(name, version, folder)``: a new id per version, so
vLLM loads the new tensors instead of its cached ones. The folder and the engine's copy of the
previous version are dropped once the new one is in, so disk and engine memory hold one version.
An adapter of rank r is a few MB where the merged model is GBs.

Roles that share a base (``share_base_with``) share one engine: each role keeps its own versions
and folders, and the engine's LoRA ids come from one counter (``lora_ids``), so every role and
version has its own ``LoRARequest(f"{role}-vN", id, folder)``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping

import torch

from agentcap.agents.backends.weights import full

#: max_lora_rank values vLLM accepts (0.26 and 0.32); the engine takes the smallest ≥ the adapter's r.
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(r: int, where: str) -> int:
    for rank in LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"{where}.peft.r: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, got {r}")


class AdapterVersions:
    """The versions of one agent's adapter on disk, and the LoRA request of the newest."""

    def __init__(self, agent, lora_ids: Iterator[int] | None = None, root: str | None = None):
        self.agent = agent  # root: a folder another process reads (a served engine's); default: the system's temp
        self.root = tempfile.mkdtemp(prefix=f"agentcap-lora-{agent.name}-", dir=root)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        self.version = 0
        self.lora_ids = lora_ids if lora_ids is not None else itertools.count(1)  # the engine's, when shared
        self.ids: dict[int, int] = {}  # version → the engine's LoRA id

    @property
    def rank(self) -> int:
        adapters = self.agent.adapters
        return adapters.peft_model.peft_config[adapters.name].r

    def folder(self, version: int) -> str:
        return os.path.join(self.root, f"v{version}")

    @torch.no_grad()
    def tensors(self) -> dict[str, torch.Tensor]:
        """The agent's adapter now, as peft saves it (peft's names, whole tensors), copied to host
        memory: what a version holds, also kept as a snapshot while the learner moves on."""
        from peft import get_peft_model_state_dict

        adapters = self.agent.adapters
        state = get_peft_model_state_dict(adapters.peft_model, adapter_name=adapters.name)
        return {name: full(t).to("cpu", copy=True).contiguous() for name, t in state.items()}

    def save(self, tensors: Mapping[str, torch.Tensor] | None = None) -> int:
        """Write ``tensors`` (:meth:`tensors` of an earlier step; default: the adapter now) as the
        next version; returns the tensors written."""
        from safetensors.torch import save_file

        adapters = self.agent.adapters
        tensors = self.tensors() if tensors is None else dict(tensors)
        self.version += 1
        self.ids[self.version] = next(self.lora_ids)
        folder = self.folder(self.version)
        os.makedirs(folder)
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        adapters.peft_model.peft_config[adapters.name].save_pretrained(folder)  # adapter_config.json
        return len(tensors)

    def request(self):
        """The LoRA request of the newest version (None before the first save)."""
        if self.version == 0:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(f"{self.agent.name}-v{self.version}", self.ids[self.version], self.folder(self.version))

    def drop_older(self) -> list[int]:
        """Remove every folder but the newest; returns the engine's LoRA ids of the versions removed."""
        old = [v for v in range(1, self.version) if os.path.isdir(self.folder(v))]
        for version in old:
            shutil.rmtree(self.folder(version), ignore_errors=True)
        return [self.ids.pop(version) for version in old]
