"""Agents sharded with FSDP2, each on its own, so the trainable agent can change between stages.

Under the ``grpo_fsdp`` strategy (:mod:`agentcap.parallel.strategies`) ``GRPOModule.configure_model`` calls
:func:`shard_agents`: every transformer block of every agent, frozen ones included, becomes its own
``fully_shard`` unit, then the agent's whole model. A process holds 1/N of every agent; each
forward all-gathers one block at a time. What this changes for the algorithm, and where it is
handled:

1. Gradients are reduce-scattered *in backward* and summed (not averaged): the loss is already
   normalised by the global token count, so :func:`needs_gradient_all_reduce` tells the module to
   skip its own all-reduce for a sharded agent.
2. Every forward is a collective, so every process must call a sharded agent equally often:
   ``generate`` keeps stepping until every process is done (``synced_gpus``), and
   :class:`Lockstep` makes the rollout driver call each agent the same number of times per turn
   (a process with nothing to do generates for a stand-in observation and discards it); an empty
   optimiser minibatch backpropagates a stand-in row with zero weight.
3. Checkpoints are sharded (:mod:`agentcap.resume.sharded`): each process writes its own shards of the
   weights, the optimiser state and a KL reference through torch.distributed.checkpoint, which reshards
   them on resume onto any number of processes. A full checkpoint file (gathered, ``full=True``) still loads.

4. Local LLM judges (examiners) are sharded the same way (:func:`shard_judge`, through
   :mod:`agentcap.judges.pool`), and every process must run their passes in step too:
   :func:`announce_pass` and :func:`stand_in_passes`. The small coherence scorer stays replicated.
5. Under ``bf16-mixed``, :func:`mixed_precision` gathers and computes in bf16 over fp32 masters.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from agentcap.parallel import loading
from agentcap.parallel.distributed import world
from agentcap.resume.sharded import Shards


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule) or any(isinstance(m, FSDPModule) for m in module.modules())


def block_classes(model: nn.Module) -> set[str]:
    """Class names of the model's transformer blocks, as HF declares them (``_no_split_modules``)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def mixed_precision(precision: Any):
    """FSDP2's policy for Lightning's ``bf16-mixed``: each block is all-gathered and computed in
    bf16 (half the traffic and the gathered memory of fp32) while the sharded master weights, their
    gradients' reduction and the optimiser stay fp32. None for any other precision."""
    if str(precision) != "bf16-mixed":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_agents(agents: Mapping[str, nn.Module], mesh, mirrored: Iterable[str] = (),
                 mp_policy=None) -> dict[str, nn.Module]:
    """``fully_shard`` every agent's blocks, then its model; the weights are rank 0's, or for an
    agent built on meta (:mod:`agentcap.parallel.loading`) read shard by shard or scattered from rank 0.
    ``mp_policy``: :func:`mixed_precision`'s (None: compute in the parameters' dtype).

    Agents named in ``mirrored`` (full fine-tunes with a KL reference) also get a frozen copy,
    sharded alike and returned by name: an FSDP module cannot be deep-copied once sharded, and a
    copy sharded like the policy takes the policy's weights shard by shard, with no communication
    (:meth:`agentcap.agents.reference.Reference`)."""
    from torch.distributed.fsdp import register_fsdp_forward_method
    from transformers import PreTrainedModel

    mirrors: dict[str, nn.Module] = {}
    for name, agent in agents.items():
        model = agent.model
        if is_sharded(model):
            continue  # configure_model runs again for validate / test after fit
        if loading.pending(model) is None and world()[1] > 1:
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=0)  # one init for all: a shard is a slice of rank 0's tensor
        if name in mirrored:
            mirrors[name] = shard_and_load(copy.deepcopy(model).eval().requires_grad_(False), mesh, mp_policy)
        shard_and_load(model, mesh, mp_policy)
        if not isinstance(model, PreTrainedModel) and hasattr(model, "generate"):
            register_fsdp_forward_method(model, "generate")  # e.g. the toy LM's own generate
    return mirrors


def _shard(model: nn.Module, mesh, mp_policy=None) -> nn.Module:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = mp_policy or MixedPrecisionPolicy()
    blocks = block_classes(model)
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # a sum, not a mean: the loss is already divided by the global token count (gloo has
            # no pre-multiplied sum, so the sum is forced)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def shard_and_load(model: nn.Module, mesh, mp_policy=None) -> nn.Module:
    """:func:`_shard` ``model``; one built on meta is then materialised and its shards filled
    (:func:`agentcap.parallel.loading.materialise`: from its folder, or scattered from rank 0)."""
    record = loading.pending(model)
    # the scattered case: rank 0's whole init, taken before sharding replaces its parameters
    full = model.state_dict() if record is not None and record.folder is None and world()[0] == 0 else None
    _shard(model, mesh, mp_policy)
    if record is not None:
        loading.materialise(model, mesh, record, full)
        del model._agentcap_pending
    return model


def shard_judge(model: nn.Module, mesh, device: str | None = None) -> nn.Module:
    """``fully_shard`` a frozen judge's blocks and model, then move its shards to ``device``.

    Every process loaded the same weights from the same folder (nothing is broadcast), or built the
    judge on meta and reads only its own shards (:mod:`agentcap.parallel.loading`)."""
    model.eval().requires_grad_(False)
    shard_and_load(model, mesh)
    if device is not None:
        model.to(device)
    return model


def model_state(model: nn.Module, full: bool = True) -> dict[str, Any]:
    """``model``'s weights for a checkpoint. Sharded: full tensors on the CPU (a collective), or with
    ``full=False`` each process's own shards (DTensors), for a sharded checkpoint (``resume.sharded``)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=full, cpu_offload=True))


def load_model_state(model: nn.Module, state: dict[str, Any] | Shards) -> None:
    """Inverse of :func:`model_state`: every process reads the full weights and keeps its shard, or
    reads only its own shards from a sharded checkpoint (:class:`Shards`, resharded by DCP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    if isinstance(state, Shards):
        set_model_state_dict(model, state.read(get_model_state_dict(model)))
    elif not is_sharded(model):
        model.load_state_dict(state)
    else:
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def needs_gradient_all_reduce(agent: nn.Module) -> bool:
    """False for a sharded agent: FSDP2 already reduced its gradients in backward."""
    return world()[1] > 1 and not is_sharded(agent.model)


def synced_generation(model: nn.Module) -> bool:
    """``generate`` must keep calling forward until every process is done (each forward is a collective)."""
    return world()[1] > 1 and is_sharded(model)


def full_norm(norm: torch.Tensor) -> float:
    """The gradient norm as a float (a DTensor under sharding)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def optimizer_state(agent: nn.Module, optimizer: torch.optim.Optimizer, full: bool = True) -> dict[str, Any]:
    """The optimiser's state for the checkpoint. Sharded: gathered into full tensors, or with
    ``full=False`` each process's own shards, for a sharded checkpoint."""
    if not is_sharded(agent.model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=full, cpu_offload=True)
    return get_optimizer_state_dict(agent.model, optimizer, options=options)


def load_optimizer_state(agent: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any] | Shards) -> None:
    """Inverse of :func:`optimizer_state`: every process reads the full state and keeps its shard, or
    reads only its own shards from a sharded checkpoint (:class:`Shards`)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    if isinstance(state, Shards):
        # the template is a fresh optimiser's state, materialised by a zero-lr step of zero gradients
        template = get_optimizer_state_dict(agent.model, optimizer)
        set_optimizer_state_dict(agent.model, optimizer, state.read(template))
    elif not is_sharded(agent.model) and not _by_name(state):
        optimizer.load_state_dict(state)
    else:  # full tensors by parameter name (written sharded), kept whole or sharded here
        set_optimizer_state_dict(agent.model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def _by_name(state: dict[str, Any]) -> bool:
    """Whether an optimiser state names its parameters (torch.distributed.checkpoint's form, what a
    sharded agent saves) rather than numbering them (``Optimizer.state_dict``)."""
    return any(isinstance(p, str) for group in state.get("param_groups", []) for p in group.get("params", []))
