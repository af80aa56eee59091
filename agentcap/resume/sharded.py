"""Sharded checkpoints: a folder each rank writes its own shards into, through torch.distributed.checkpoint.

Under ``grpo_fsdp`` a tick checkpoint is a folder, not a file. DCP's ``.metadata`` and one
``__<rank>_0.distcp`` per rank hold the tensors: the module's weights, the active stage's optimiser
state and a sharded KL reference, each rank writing only its own shards, so no process ever holds a
full copy. ``meta.pt`` (rank 0, plain ``torch.save``, Lightning's name for it) holds everything else:
tick, summary, lr schedule, replay, loop counters, and the optimiser's param groups.

Only tensors go through DCP: it would unpickle any other value with ``weights_only=False``, and a
checkpoint must never run code. DCP reshards on load, so a folder written by N processes resumes on
M; :func:`read_full` consolidates one in a single process without a process group (``agentcap export``).
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcap.resume import entries

#: Lightning's name for the non-tensor part of a sharded checkpoint (``lightning.fabric.utilities.load``).
META = "meta.pt"
#: DCP's own index of the shards: every tensor's chunks, and the file, offset and length of each.
INDEX = ".metadata"


@dataclass(frozen=True)
class Shards:
    """A sharded entry of a checkpoint folder, read when its stage begins (the optimiser it fills
    does not exist before). ``skeleton`` is the entry without its tensors, as ``meta.pt`` holds it."""

    folder: str
    entry: str
    skeleton: Any

    def read(self, template: Mapping[str, Any]) -> dict[str, Any]:
        """The entry, its tensors loaded into (and sharded like) ``template``'s: every process reads
        only the chunks of its own shards."""
        import torch.distributed.checkpoint as dcp

        tensors = _tensors(template)
        dcp.load({entries.ENTRY: {self.entry: tensors}}, checkpoint_id=self.folder)
        return _merge(self.skeleton, tensors)


def save(checkpoint: dict[str, Any], folder: Path, rank_zero: bool) -> None:
    """Write ``checkpoint`` as a folder: the tensors of ``state_dict`` and of the module's sharded
    entries through DCP (each rank its shards; DCP returns once every rank's are written), the rest
    in ``meta.pt``, written last, by rank 0."""
    import torch.distributed.checkpoint as dcp

    rest = dict(checkpoint)
    weights, rest["state_dict"] = _tensors(rest["state_dict"]), _skeleton(rest["state_dict"])
    extra = dict(rest.get(entries.ENTRY) or {})
    shards: dict[str, Any] = {}
    for entry in entries.SHARDED:
        if extra.get(entry) is not None:
            shards[entry], extra[entry] = _tensors(extra[entry]), {"sharded": _skeleton(extra[entry])}
    if entries.ENTRY in rest:
        rest[entries.ENTRY] = extra
    dcp.save({"state_dict": weights, entries.ENTRY: shards}, checkpoint_id=str(folder))
    if rank_zero:
        torch.save(rest, folder / META)


def load(folder: Path, module: torch.nn.Module, strict: bool = True) -> dict[str, Any]:
    """Load the module's weights from a checkpoint folder (each process its own shards, resharded
    when the number of processes changed) and return the rest; sharded entries come back as
    :class:`Shards`, read when their stage begins."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    safe_index(folder)  # a doctored index is refused before DCP unpickles it
    rest = torch.load(folder / META, map_location="cpu", weights_only=True)
    tensors = _tensors(get_model_state_dict(module))  # this process's shards, the shapes DCP reads into
    dcp.load({"state_dict": tensors}, checkpoint_id=str(folder))
    # the module's own load_state_dict, as for a file: its hooks (a LoRA agent's adapters-only state) apply
    module.load_state_dict(_merge(rest.pop("state_dict", {}), tensors), strict=strict)
    extra = rest.get(entries.ENTRY) or {}
    real = os.path.realpath(folder)  # `last.ckpt` moves on with the next save; this checkpoint does not
    for entry in entries.SHARDED:
        if isinstance(extra.get(entry), dict) and "sharded" in extra[entry]:
            extra[entry] = Shards(real, entry, extra[entry]["sharded"])
    return rest


def read_full(folder: str | os.PathLike) -> dict[str, Any]:
    """The whole checkpoint as one process holds a ``.ckpt`` file: full tensors, no process group.

    The tensors' shapes and dtypes come from DCP's index; a ``torch.load`` of the file a full-state
    checkpoint would have been gives the same dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(folder)
    rest = torch.load(folder / META, map_location="cpu", weights_only=True)
    index = safe_index(folder)
    tensors: dict[str, Any] = {}
    for key, meta in index.state_dict_metadata.items():
        if isinstance(meta, TensorStorageMetadata):
            _put(tensors, index.planner_data[key], torch.empty(meta.size, dtype=meta.properties.dtype))
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, checkpoint_id=str(folder), no_dist=True)
    rest["state_dict"] = _merge(rest.get("state_dict", {}), tensors.get("state_dict", {}))
    extra = rest.get(entries.ENTRY) or {}
    for entry in entries.SHARDED:
        if isinstance(extra.get(entry), dict) and "sharded" in extra[entry]:
            extra[entry] = _merge(extra[entry]["sharded"], tensors.get(entries.ENTRY, {}).get(entry, {}))
    return rest


def problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a whole sharded checkpoint, or None: ``meta.pt`` loads as tensors and
    containers, DCP's index unpickles to DCP's own classes only, and every shard file it names is
    there and long enough (a missing or truncated ``.distcp`` is caught without reading it)."""
    folder = Path(folder)
    for name in (META, INDEX):
        if not (folder / name).is_file():
            return f"no {name} in the checkpoint folder (a partial write)"
    try:
        rest = torch.load(folder / META, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated zip, garbage bytes, a refused global
        return f"{META}: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not isinstance(rest, dict) or entries.ENTRY not in rest:
        return f"{META} is not an agentcap checkpoint (no 'agentcap')"
    try:
        index = safe_index(folder)
    except Exception as err:
        return f"{INDEX}: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    needed: dict[str, int] = {}
    for info in (index.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        path = folder / name
        if not path.is_file():
            return f"shard {path} is missing"
        if path.stat().st_size < size:
            return f"shard {path} is truncated ({path.stat().st_size} of {size} bytes)"
    return None


class _IndexUnpickler(pickle.Unpickler):
    """DCP reads ``.metadata`` with plain ``pickle``; this lets only DCP's records and torch's
    sizes and dtypes through, so a doctored index is refused before DCP opens it."""

    ALLOWED = {("torch", "Size"), ("collections", "OrderedDict"), ("torch.serialization", "_get_layout"),
               ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}  # the checkpoint_id DCP was given

    def find_class(self, module: str, name: str):
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        value = getattr(torch, name, None) if module == "torch" else None
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return value
        raise pickle.UnpicklingError(f"refused: it calls {module}.{name}")


def safe_index(folder: Path):
    """DCP's ``Metadata`` of ``folder``, unpickled with :class:`_IndexUnpickler`."""
    data = (folder / INDEX).read_bytes()
    return _IndexUnpickler(io.BytesIO(data)).load()


# --- trees: the tensors of a nested dict, and the rest ------------------------------------------
def _tensors(tree: Mapping[str, Any]) -> dict[str, Any]:
    """``tree``'s tensor leaves, nested as in ``tree`` (dicts only; lists hold no tensors here)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, torch.Tensor):
            out[key] = value
        elif isinstance(value, Mapping):
            out[key] = _tensors(value)
    return out


def _skeleton(tree: Mapping[str, Any]) -> dict[str, Any]:
    """``tree`` without its tensor leaves (empty dicts are kept: an optimiser's per-parameter state)."""
    return {k: _skeleton(v) if isinstance(v, Mapping) else v
            for k, v in tree.items() if not isinstance(v, torch.Tensor)}


def _merge(skeleton: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(skeleton)
    for key, value in tensors.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, Mapping) else value
    return out


def _put(tree: dict[str, Any], path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
