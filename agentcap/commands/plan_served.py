"""Served engines inside ``agentcap plan``: which rollout GPUs each ``vllm serve`` process goes to.

An agent with ``backend: served`` samples through ``vllm serve`` processes of their own
(``agentcap.agents.backends.served``), which hold nothing on the trainer GPUs: the plan counts
them on the rollout GPUs instead (``--rollout-gpus``: GPUs apart from the trainers', on the
trainer's nodes or others). Each server spans ``vllm.tensor_parallel_size`` GPUs and reserves
``gpu_memory_utilization`` of each (its weights split over them, the KV cache in the rest, as an
in-process engine: ``plan_engines``). Servers per agent: ``len(vllm.served.urls)``, or
``served.start`` per rank when agentcap starts them (every rank its own). Roles that
``share_base_with`` a served role ride on its servers (an adapter each). GPUs are handed out in the
config's order of agents, server after server; a plan with served agents and no rollout GPUs, or too
few, is refused in one line.

``--serve-rollouts`` plans a recipe written for in-process engines (``backend: vllm``, as
``configs/acecap.yaml``) with those engines moved to servers of their own (:func:`as_served`), the
same change a fit makes with ``--model.agents.<role>.backend served`` and ``vllm.served``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentcap.commands.plan_engines import DTYPE_BYTES, ENGINE_DEFAULTS, GIB
from agentcap.core.settings import ConfigError


@dataclass(frozen=True)
class ServedEngine:
    """The servers of one served agent (a shared base's owner with the roles on it)."""

    roles: tuple[str, ...]
    servers: int
    tp: int  # GPUs per server
    dtype: str
    weights: float  # bytes per GPU
    reserve: float  # bytes per GPU: gpu_memory_utilization × device memory
    gpus: tuple[int, ...] = ()  # rollout GPU indices, ``tp`` per server, in server order

    @property
    def need(self) -> int:
        return self.servers * self.tp


def served_riders(agents: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Served roles that ``share_base_with`` another served role: they sample on its servers."""
    served = {role for role, cfg in agents.items() if cfg.get("backend", "hf") == "served"}
    return {role: cfg["share_base_with"] for role, cfg in agents.items()
            if role in served and cfg.get("share_base_with") in served}


def served_specs(agents: dict[str, dict[str, Any]], params: dict[str, int], device: float,
                 world: int) -> list[ServedEngine]:
    """The servers of every served agent (none for one that rides on another's); refuses weights that
    leave a server no KV cache."""
    riders = served_riders(agents)
    specs = []
    for role, cfg in agents.items():
        if cfg.get("backend", "hf") != "served" or role in riders:
            continue
        options = {**ENGINE_DEFAULTS, **{k: v for k, v in (cfg.get("vllm") or {}).items() if k != "served"}}
        served = (cfg.get("vllm") or {}).get("served") or {}
        servers = len(served.get("urls") or []) or int(served.get("start") or 0) * world
        if servers == 0:
            raise ConfigError(f"agents.{role}.vllm.served: give urls (running `vllm serve` processes) or start: N")
        dtype = cfg.get("dtype", "float32") if options["dtype"] == "auto" else options["dtype"]
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"agents.{role}.vllm.dtype must be one of {sorted(DTYPE_BYTES)} or auto, got {dtype!r}")
        tp = int(options["tensor_parallel_size"])
        weights = params[role] * DTYPE_BYTES[dtype] / tp
        share = float(options["gpu_memory_utilization"])
        if weights >= share * device:
            raise ConfigError(
                f"agents.{role}.vllm.gpu_memory_utilization {share:g} reserves {share * device / GIB:.1f} GiB of a "
                f"rollout GPU's {device / GIB:g}, not more than a server's {dtype} weights per GPU "
                f"({weights / GIB:.1f} GiB, tensor_parallel_size {tp}): no room for a KV cache"
            )
        roles = (role, *[r for r, owner in riders.items() if owner == role])
        specs.append(ServedEngine(roles, servers, tp, dtype, weights, share * device))
    return specs


def as_served(config: dict[str, Any]) -> list[str]:
    """Every ``backend: vllm`` agent of ``config`` as ``backend: served`` (in place), one server per
    trainer rank (``served.start: 1``, each rank drives its own) unless its ``vllm.served`` names
    servers already; returns the roles changed. Its other engine options (dtype,
    ``gpu_memory_utilization``, ``tensor_parallel_size``) are kept, now for a rollout GPU."""
    changed = []
    for role, cfg in ((config.get("model") or {}).get("agents") or {}).items():
        if cfg.get("backend", "hf") != "vllm":
            continue
        options = cfg.setdefault("vllm", {}) or {}
        served = options.get("served") or {}
        if not (served.get("urls") or served.get("start")):
            options["served"] = {**served, "start": 1}
        cfg.update(backend="served", vllm=options)
        changed.append(role)
    return changed


def place(specs: list[ServedEngine], rollout_gpus: int) -> list[ServedEngine]:
    """Each served agent's servers on rollout GPUs 0, 1, … in order; refuses when they are too few."""
    if not specs:
        return []
    need = sum(s.need for s in specs)
    named = ", ".join(f"agents.{s.roles[0]}: {s.servers} server(s) × {s.tp} GPU(s)" for s in specs)
    if rollout_gpus <= 0:
        raise ConfigError(f"served engines need rollout GPUs of their own ({named}), and none are given: "
                          f"--rollout-gpus {need} (they are never placed on the trainer GPUs)")
    if need > rollout_gpus:
        raise ConfigError(f"served engines need {need} rollout GPUs ({named}), --rollout-gpus gives {rollout_gpus}")
    placed, start = [], 0
    for spec in specs:
        placed.append(ServedEngine(**{**vars(spec), "gpus": tuple(range(start, start + spec.need))}))
        start += spec.need
    return placed


def gpu_ranges(engine: ServedEngine) -> str:
    """``0–1, 2–3`` (one range per server) or ``0, 1`` at one GPU per server."""
    cut = [engine.gpus[i : i + engine.tp] for i in range(0, len(engine.gpus), engine.tp)]
    return ", ".join(str(g[0]) if len(g) == 1 else f"{g[0]}–{g[-1]}" for g in cut)
