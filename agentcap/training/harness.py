"""agentcap's own GRPO update outside a Lightning Trainer: what the benchmarks, the prepared GPU
check and the loss tests run, so a figure they print is a figure of agentcap.

In training, ``GRPOModule.update`` calls :func:`agentcap.training.update.update` (minibatches,
micro-batches under the global normaliser, the clipped objective, ``optim.optimizer_step``).
:class:`UpdateHarness` calls the same function with what the Trainer would hand it:

- backward: a plain ``loss.backward()``. Lightning's ``manual_backward`` comes down to that for
  ``32`` and ``bf16-mixed`` (its precision plugin's backward on the strategy's closure-free path);
- precision ``bf16-mixed``: the update runs under ``torch.autocast(bfloat16)``, as Lightning's
  ``MixedPrecision`` plugin wraps every training step; the trained parameters stay float32;
- the stage's optimiser (``training.optim.build_optimizer``: AdamW over the trainable parameters)
  and, with β > 0, its KL reference (``agents.reference.kl_reference``), as ``_begin_stage`` builds them;
- sharding: :func:`shard` is ``GRPOModule.configure_model`` under ``grpo_fsdp`` (FSDP2 through
  ``parallel.sharding.shard_agents``, bf16 compute under ``bf16-mixed``) on the caller's process
  group (:func:`process_group`, one process by default).

``UpdateHarness.of_module`` runs a built ``GRPOModule``'s own ``update`` (stage begun as training
begins it). :func:`rows` turns sampled generations and rewards into the update's rows, with
advantages from :func:`agentcap.training.update.set_advantages`, the function ``grpo_step`` calls.
Imports no environment code (no gymnasium): it runs where only torch, transformers and Lightning are.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentcap.agents.agent import Agent
from agentcap.agents.generation import Generation
from agentcap.algorithms.loop import AdvantageStd
from agentcap.training.optim import build_optimizer
from agentcap.training.update import UpdateSettings, set_advantages, update

__all__ = ["IdsTokenizer", "Row", "UpdateHarness", "autocast", "process_group", "rows", "shard"]


def autocast(precision: str, device: torch.device | str):
    """What Lightning wraps a training step in: bf16 autocast for ``bf16-mixed``, nothing for ``32``."""
    if precision == "bf16-mixed":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    if precision in ("32", "32-true"):
        return contextlib.nullcontext()
    raise ValueError(f"precision {precision!r}: the harness runs 32 or bf16-mixed")


class UpdateHarness:
    """The update of ``agent`` as training runs it, one call per rollout batch (see the module doc).

    Args:
        agent: the trainable agent (made trainable here; shard it first with :func:`shard`).
        settings: the module's update settings (defaults: ``GRPOModule``'s).
        lr, weight_decay: the stage's AdamW (ignored when ``optimizer`` is given).
        precision: ``32`` or ``bf16-mixed``.
        optimizer: another optimiser (a test's), stepped by ``optim.optimizer_step`` all the same.
        reference: the KL reference; with β > 0 and none given, ``kl_reference(agent)``.
    """

    def __init__(self, agent: Agent, settings: UpdateSettings | None = None, *, lr: float = 1e-6,
                 weight_decay: float = 0.0, precision: str = "32", optimizer: torch.optim.Optimizer | None = None,
                 reference: Any = None):
        self.agent, self.settings, self.precision = agent, settings or UpdateSettings(), precision
        self._module = None
        agent.set_trainable(True)
        self.optimizer = optimizer if optimizer is not None else build_optimizer(agent, lr, weight_decay)
        if reference is None and self.settings.beta > 0:
            from agentcap.agents.reference import kl_reference

            reference = kl_reference(agent)
        self.reference = reference
        self.tick = 0  # seeds the minibatch order, as the schedule tick does

    @classmethod
    def of_module(cls, module: Any, stage_index: int, precision: str = "32") -> UpdateHarness:
        """A built ``GRPOModule``'s own ``update`` for GRPO stage ``stage_index``: the stage begun as a
        Trainer begins it (trainable agent, AdamW, lr schedule, KL reference), backward plain."""
        stage = module.schedule.stages[stage_index]
        if stage.kind != "grpo":
            raise ValueError(f"stage {stage_index} ({stage.name!r}) is a {stage.kind} stage, not grpo")
        module.manual_backward = _plain_backward  # what Lightning's precision plugin does, without a Trainer
        module._begin_stage(stage_index)
        harness = cls.__new__(cls)
        harness.agent, harness.settings, harness.precision = module.agents[stage.agent], module.update_settings, precision
        harness.optimizer, harness.reference, harness._module = module._optimizer, module._reference, module
        harness.tick = module.tick
        return harness

    def update(self, spans: Sequence[Any], keys: Sequence[tuple[int, int]] | None = None) -> dict[str, float]:
        """One rollout batch's update (``ppo_epochs`` × minibatches, each one optimiser step); returns
        the figures training logs under ``loss/…`` (loss, pg_loss, kl, clipfrac, ratio, entropy, grad_norm…).
        ``keys``: each span's (trajectory, action) position; by default span i is trajectory i."""
        keys = [(i, 0) for i in range(len(spans))] if keys is None else list(keys)
        with autocast(self.precision, self.device):
            if self._module is not None:
                stats = self._module.update(self.agent, spans, keys)
                self._module.tick += 1
            else:
                stats = update(self.agent, spans, keys, self.settings, self.optimizer, tick=self.tick,
                               device=self.device, reference=self.reference, backward=_plain_backward)
        self.tick += 1
        return stats

    @property
    def device(self) -> torch.device:
        return self.agent.family.device


def _plain_backward(loss: torch.Tensor) -> None:
    loss.backward()


@dataclass
class Row(Generation):
    """One training row outside a rollout (``rollout.driver.Span``'s fields that the update reads)."""

    observation: dict[str, Any] = field(default_factory=dict)
    utility: float | None = None
    kind: str = "completion"
    group: int = 0
    advantage: float = 0.0
    pieces: list[int] | None = None  # per-piece credit, as on a Span
    piece_utilities: list[float] | None = None
    token_advantages: list[float] | None = None


def rows(observations: Sequence[dict[str, Any]], generations: Sequence[Generation],
         utilities: Sequence[float] | None = None, group_size: int = 1, eps_norm: float = 1e-6,
         std: AdvantageStd = "population") -> list[Row]:
    """Rows for :meth:`UpdateHarness.update`: row i is generation i on observation i, in group
    i // ``group_size``; with ``utilities``, advantages as ``grpo_step`` computes them."""
    out = [Row(completion_ids=g.completion_ids, sampler_logprobs=g.sampler_logprobs, text=g.text,
               old_logprobs=g.old_logprobs, observation=o, group=i // group_size)
           for i, (o, g) in enumerate(zip(observations, generations, strict=True))]
    if utilities is not None:
        for row, utility in zip(out, utilities, strict=True):
            row.utility = float(utility)
        set_advantages(out, eps_norm, std)
    return out


class IdsTokenizer:
    """A tokenizer for random-weight models in the benchmarks: a prompt's text is its token ids
    ("12 7 93"), read back exactly (the chat roles around them carry no digits)."""

    chat_template = None

    def __init__(self, pad_token_id: int = 0, eos_token_id: int = 2):
        self.pad_token_id, self.eos_token_id, self.padding_side = pad_token_id, eos_token_id, "left"

    def __call__(self, texts: Sequence[str], return_tensors: str = "pt", padding: bool = True, **_: Any):
        ids = [[int(t) for t in re.findall(r"\d+", text)] for text in texts]
        width = max(len(r) for r in ids)
        pad = [width - len(r) for r in ids]
        return {"input_ids": torch.tensor([[self.pad_token_id] * n + r for n, r in zip(pad, ids)]),
                "attention_mask": torch.tensor([[0] * n + [1] * len(r) for n, r in zip(pad, ids)])}

    def batch_decode(self, ids: Any, **_: Any) -> list[str]:
        return [" ".join(str(int(t)) for t in row) for row in ids]

    def decode(self, ids: Any, **_: Any) -> str:
        return " ".join(str(int(t)) for t in ids)

    @staticmethod
    def observation(ids: Sequence[int], agent: str = "policy") -> dict[str, Any]:
        """An observation whose prompt is exactly ``ids``."""
        return {"agent": agent, "messages": [{"role": "user", "content": " ".join(str(int(i)) for i in ids)}]}


# --- FSDP2, as GRPOModule.configure_model shards under grpo_fsdp -----------------------------------
@contextlib.contextmanager
def process_group(device: torch.device | str, world_size: int = 1, rank: int = 0):
    """A process group (NCCL on CUDA, gloo on the CPU) for :func:`shard`, gone again on exit."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if torch.device(device).type == "cuda" else "gloo", rank=rank,
                            world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard(agent: Agent, precision: str = "bf16-mixed", device: torch.device | str = "cpu") -> None:
    """Shard ``agent`` with FSDP2 over the process group's ranks, exactly as ``GRPOModule.configure_model``
    does under ``grpo_fsdp`` (``parallel.sharding.shard_agents``; bf16 all-gathers and compute under
    ``bf16-mixed``, fp32 masters)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from agentcap.parallel.sharding import mixed_precision, shard_agents

    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    shard_agents({agent.name: agent}, mesh, (), mixed_precision(precision))
