"""One loaded copy of each judge per process, shared by every environment that names it.

Every rollout driver scores with an environment of its own: one per split (train, val, test) and
per stage whose environment settings differ (AudioMap's reward curriculum). Each would otherwise
load its own copy of the same 27B examiner. Judges are frozen and keep no per-episode state, so
one copy serves them all: :func:`load_once` builds a judge the first time its key is asked for.

Under ``grpo_fsdp`` the module calls :func:`shard_judges` while it shards its agents. From then on
every local LLM judge's model (:func:`causal_lm`) is sharded with FSDP2 over the same processes,
whether it was loaded before or loads later; a later one is built on the meta device and reads
only its own shards from its folder (:mod:`agentcap.parallel.loading`), so no process holds a whole
copy. Rule and served judges have no model here, and the small coherence scorer stays replicated.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from agentcap.agents.pretrained import load_causal_lm
from agentcap.parallel import loading
from agentcap.parallel.distributed import world
from agentcap.parallel.sharding import is_sharded, shard_judge

_LOADED: dict[str, Any] = {}
_MODELS: list[Any] = []  # the model of every judge that may be sharded
_MESH: Any = None


def judge_key(kind: str, spec: Any, **settings: Any) -> str:
    """A key naming one loaded judge: its kind, its spec and settings, and for a local folder the
    modification times of its files (a folder rewritten in place is a different judge)."""
    stamp = None
    if isinstance(spec, (str, os.PathLike)) and os.path.isdir(spec):
        stamp = sorted((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in os.scandir(spec) if f.is_file())
        spec = os.path.realpath(spec)
    return json.dumps([kind, spec, settings, stamp], sort_keys=True, default=str)


def load_once(key: str, build: Callable[[str], Any], device: str, model_of: Callable[[Any], Any] | None = None) -> Any:
    """What ``build(device)`` returns, built on first use of ``key``.

    ``model_of`` names the ``nn.Module`` inside a value that may be sharded (an LLM judge's model);
    under sharding such a value is built with ``build("meta")`` (its parameters on the meta device,
    its weights recorded with ``loading.defer``), then sharded, filled and moved to ``device``."""
    if key not in _LOADED:
        value = build("meta" if _MESH is not None and model_of is not None else device)
        _LOADED[key] = value
        if model_of is not None:
            _MODELS.append(model_of(value))
            if _MESH is not None:
                _shard(_MODELS[-1], device)
    return _LOADED[key]


def causal_lm(path: str, device: str):
    """(model, tokenizer) of a local judge folder, loaded once per process and device: the cloze
    examiner, its other readout and the temporal examiner share one copy when they name one folder.
    A frozen judge keeps its checkpoint's dtype (bf16 for the papers' 27B judges)."""
    def build(where: str):
        return meta_causal_lm(path) if where == "meta" else load_causal_lm(path, device=where, dtype="auto")

    return load_once(judge_key("causal_lm", path, device=device), build, device, model_of=lambda loaded: loaded[0])


def meta_causal_lm(path: str):
    """(model, tokenizer) of a judge folder with the model's parameters on the meta device, in the
    checkpoint's dtype, to be sharded and filled from the folder's safetensors files."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(path)
    with loading.parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(config, "dtype", None) or torch.float32)
    if os.path.isfile(os.path.join(path, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(path)
    full = lambda: load_causal_lm(path, dtype="auto")[0]  # noqa: E731  (a folder the shard reader cannot map)
    loading.defer(model, loading.Pending(str(path), full))
    return model.eval(), AutoTokenizer.from_pretrained(path)


def shard_judges(mesh: Any) -> None:
    """Shard every local LLM judge over ``mesh``, now and as later ones load."""
    global _MESH
    _MESH = mesh
    for model in _MODELS:
        _shard(model, None)  # already on its device


def sharded() -> bool:
    """True once judges are sharded: each judge call is then a collective every process must make."""
    return _MESH is not None


def clear() -> None:
    """Forget every loaded judge and the mesh (tests; a new process group)."""
    global _MESH
    _LOADED.clear()
    _MODELS.clear()
    _MESH = None


def _shard(model: Any, device: str | None) -> None:
    if not is_sharded(model):
        shard_judge(model, _MESH, device)
        if world()[0] == 0:
            name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
            print(f"agentcap: sharded the judge {name} with FSDP2 over {_MESH.size()} processes", file=sys.stderr)
