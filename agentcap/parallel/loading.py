"""Sharded models load shard by shard: built on the meta device, sharded, then filled.

Without this, every process of a ``grpo_fsdp`` run would load every agent's full weights before
sharding them (about 90 GB of host memory per process for ACE-Cap's three 7–8B models). Instead:

1. The CLI calls :func:`load_by_shard` before the module is built, when the strategy is
   ``grpo_fsdp`` (the module's ``__init__`` runs before any process group or mesh exists, so it
   cannot ask the strategy). ``build_agent`` then builds each model inside
   :func:`parameters_on_meta` and records where its weights come from (:func:`defer`):

   - a model folder with safetensors files: every process builds on meta; each later reads only
     the rows of its own shards (positioned reads, no memory map: :class:`_Reader`);
   - a model with no folder (a tiny or toy model from a config with a seeded init): rank 0 builds
     it as before, every other process on meta; rank 0's weights are then scattered tensor by
     tensor (``set_model_state_dict(..., broadcast_from_rank0=True)``), so other ranks never
     hold a whole copy. Other ranks' random generator is therefore not advanced by the init: nothing
     after the build draws from it (sampling seeds follow trajectories, ``agents.sampling``).

   Only parameters go to meta: buffers are small and computed at init (rotary ``inv_freq``,
   non-persistent ones included), so they stay real and are put back after materialising. A LoRA
   adapter attached to a meta model keeps its init values (:func:`keeping_values`).
2. ``shard_agents`` / ``shard_judge`` (``parallel.sharding``) ``fully_shard`` the meta model and
   call :func:`materialise`: ``to_empty`` on the mesh's device, then every shard is filled.

Weights come out bit-identical to a full load (the folder's values cast to the agent's dtype, or
rank 0's init). A folder whose names the reader cannot map (no safetensors, renamed keys) is
loaded in full by today's loader and sliced: correct, with today's memory. Without
:func:`load_by_shard` (the Python API), models load fully and ``shard_agents`` broadcasts rank
0's weights, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

_BY_SHARD = False  # this process's models will be sharded: build them on meta (set by the CLI)


def load_by_shard(on: bool = True) -> None:
    """Models built from now on will be sharded (``grpo_fsdp``): build them on meta, load by shard."""
    global _BY_SHARD
    _BY_SHARD = on


def loads_by_shard() -> bool:
    return _BY_SHARD


def launch_rank() -> int:
    """This process's global rank, also before the process group exists: from the group, else from
    the launcher's environment (torchrun's ``RANK``; Lightning's ``NODE_RANK`` / ``LOCAL_RANK``;
    SLURM). A process with none of them set is the launching process, rank 0. Only "is it 0" matters
    here: rank 0 builds the weights that are scattered."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    ranks = [os.environ.get(key) for key in ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK")]
    return next((int(r) for r in ranks if r not in (None, "", "0")), 0)


@dataclass
class Pending:
    """Where a model built on meta takes its weights from.

    folder: a model folder (its safetensors files); None: rank 0's own weights, scattered.
    full: today's full load, for a folder whose tensors the shard reader cannot name.
    kept: values made at build time that no file holds (a LoRA adapter's init), by state-dict name.
    after: what to run on every process once the weights are in (an adapter's base fingerprint).
    """

    folder: str | None
    full: Callable[[], nn.Module] | None = None
    kept: dict[str, torch.Tensor] = field(default_factory=dict)
    after: list[Callable[[], None]] = field(default_factory=list)


def builds_on_meta(folder: str | None) -> bool:
    """Whether a model about to be built goes on meta: under :func:`load_by_shard`, a folder's model
    on every process, a model with no folder on every process but rank 0."""
    return _BY_SHARD and (folder is not None or launch_rank() != 0)


def defer(model: nn.Module, pending: Pending) -> None:
    """Record where ``model``'s weights come from; :func:`materialise` reads it after sharding."""
    model._agentcap_pending = pending


def pending(model: nn.Module) -> Pending | None:
    return getattr(model, "_agentcap_pending", None)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside goes to the meta device (no memory); buffers stay real.

    Wraps ``nn.Module.register_parameter``, through which every ``module.x = nn.Parameter(...)``
    passes; a parameter's storage is allocated by its constructor but never written (so never
    resident) before it is replaced."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


@contextlib.contextmanager
def keeping_values(model: nn.Module) -> Iterator[None]:
    """Parameters registered inside (an adapter attached to a meta model) keep their init values in
    ``model``'s :class:`Pending`: peft moves a new adapter to its base layer's device, here meta."""
    made: list[tuple[nn.Module, str, torch.Tensor]] = []
    register = nn.Module.register_parameter

    def recording(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            made.append((module, name, param.data))  # initialised in place afterwards, then moved

    nn.Module.register_parameter = recording
    try:
        yield
    finally:
        nn.Module.register_parameter = register
    record = pending(model)
    if record is None:
        return
    names = {id(module): prefix for prefix, module in model.named_modules(remove_duplicate=False)}
    for module, name, value in made:
        if id(module) in names and getattr(module, name, None) is not None and getattr(module, name).is_meta:
            record.kept[f"{names[id(module)]}.{name}".lstrip(".")] = value


def materialise(model: nn.Module, mesh, record: Pending, full: dict[str, torch.Tensor] | None = None) -> None:
    """Give a sharded meta ``model`` real storage on ``mesh``'s device and fill every shard.

    ``full``: rank 0's whole state dict taken before sharding (the scattered case; None elsewhere)."""
    device = _mesh_device(mesh)
    real = {name: b for name, b in model.named_buffers() if not b.is_meta}  # computed at init: put back
    if any(p.is_meta for p in model.parameters()) or any(b.is_meta for b in model.buffers()):
        model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in real:
                buffer.copy_(real[name])
        if record.folder is None:
            _scatter_from_rank0(model, full)
        else:
            _read_shards(model, record)
    for then in record.after:
        then()


def _mesh_device(mesh) -> torch.device:
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())


def _scatter_from_rank0(model: nn.Module, full: dict[str, torch.Tensor] | None) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if dist.get_rank() == 0 and full is None:
        raise RuntimeError("rank 0 built its model on the meta device: it must hold the weights it scatters "
                           "(agentcap.parallel.loading.launch_rank read a non-zero rank from the environment)")
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full if full is not None else {}, options=options)


def _read_shards(model: nn.Module, record: Pending) -> None:
    """Each parameter's local rows from the folder's safetensors files (or from ``kept``)."""
    reader = _Reader(record.folder)
    try:
        names = dict(model.named_parameters())
        missing = [n for n in names if n not in record.kept and reader.key(n) is None]
        whole = record.full() if missing else None  # the folder's names differ: today's load, sliced
        source = dict(whole.state_dict()) if whole is not None else {}
        for name, param in names.items():
            local, rows = _local_rows(param)
            if local.numel() == 0:
                continue
            plain = name.replace(".base_layer.", ".")  # the name without peft's LoRA wrapper
            if name in record.kept:
                value = record.kept[name][rows]
            elif plain in source:
                value = source[plain][rows]
            elif reader.key(name) is not None:
                value = reader.rows(reader.key(name), rows)
            else:
                raise ValueError(f"{record.folder}: no weights for {name!r} in its files or its full load")
            local.copy_(value.to(local.dtype))
        for name, buffer in model.named_buffers():  # a persistent buffer the file holds (rare in LMs)
            if name in source:
                buffer.copy_(source[name])
            elif reader.key(name) is not None:
                buffer.copy_(reader.rows(reader.key(name), slice(None)).to(buffer.dtype))
    finally:
        reader.close()


def _local_rows(param: torch.Tensor) -> tuple[torch.Tensor, slice]:
    """A parameter's local tensor and the rows of the full tensor it holds: FSDP2 shards dim 0 as
    ``torch.chunk`` does (ceil(n / N) rows per rank, the last ranks possibly fewer or none)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(param, DTensor):
        return param.data, slice(None)
    local = param.to_local()
    if all(isinstance(p, Replicate) for p in param.placements):
        return local, slice(None)
    if len(param.placements) != 1 or param.placements[0] != Shard(0):
        raise ValueError(f"loading by shard reads dim-0 shards on a 1-D mesh, got placements {param.placements}")
    mesh = param.device_mesh
    n, world, rank = param.shape[0], mesh.size(), mesh.get_local_rank()
    per = -(-n // world)
    start = min(rank * per, n)
    stop = min(start + per, n)
    if local.shape[0] != stop - start:
        raise ValueError(f"a shard of {stop - start} rows was expected on rank {rank}, the local tensor has {local.shape[0]}")
    return local, slice(start, stop)


#: safetensors' dtype names (the header's ``dtype``) as torch dtypes
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class _Reader:
    """The tensors of a folder's safetensors files by name, read a slice of rows at a time.

    Plain positioned reads, not a memory map: a mapped file's pages would count in the process's
    resident memory, and the point is that each process holds only its rows. The format: an 8-byte
    little-endian header length, a JSON header (``dtype``, ``shape``, ``data_offsets`` per tensor),
    then the data, row-major."""

    def __init__(self, folder: str):
        index = os.path.join(folder, "model.safetensors.index.json")
        single = os.path.join(folder, "model.safetensors")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as handle:
                files = sorted({os.path.join(folder, f) for f in json.load(handle)["weight_map"].values()})
        else:
            files = [single] if os.path.isfile(single) else []  # e.g. pytorch_model.bin: the full load serves
        self.entries: dict[str, tuple[str, int, dict[str, Any]]] = {}
        for path in files:
            with open(path, "rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                header = json.loads(handle.read(size))
            header.pop("__metadata__", None)
            for key, entry in header.items():
                self.entries[key] = (path, 8 + size, entry)
        self.open: dict[str, Any] = {}

    def key(self, name: str) -> str | None:
        """The file's name for the model's tensor ``name`` (peft's LoRA wraps a layer as ``base_layer``);
        None when absent or of a dtype not read here (then the full load serves)."""
        for key in (name, name.replace(".base_layer.", ".")):
            if key in self.entries and self.entries[key][2]["dtype"] in _DTYPES:
                return key
        return None

    def rows(self, name: str, rows: slice) -> torch.Tensor:
        path, data, entry = self.entries[name]
        dtype, shape = _DTYPES[entry["dtype"]], list(entry["shape"])
        start, stop, _ = rows.indices(shape[0]) if shape else (0, 1, 1)
        row_bytes = (entry["data_offsets"][1] - entry["data_offsets"][0]) // max(shape[0] if shape else 1, 1)
        out = torch.empty((stop - start) * row_bytes, dtype=torch.uint8)
        if path not in self.open:
            self.open[path] = open(path, "rb")  # noqa: SIM115  (closed by close())
        handle = self.open[path]
        handle.seek(data + entry["data_offsets"][0] + start * row_bytes)
        if handle.readinto(out.numpy()) != out.numel():
            raise ValueError(f"{path}: {name} is cut short (the file is truncated)")
        return out.view(dtype).reshape([stop - start, *shape[1:]] if shape else [])

    def close(self) -> None:
        for handle in self.open.values():
            handle.close()
        self.open.clear()
