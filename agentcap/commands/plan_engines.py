"""The vLLM engines inside ``agentcap plan``: what each holds awake and asleep, on the device and the host.

An agent with ``backend: vllm`` owns one engine per rank, colocated with the learner and built at
its first rollout (``agentcap.agents.backends.vllm``); from then on it lives until the run ends. The
plan follows vLLM's memory model (docs.vllm.ai: engine arguments, "Sleep Mode"):

- awake, an engine reserves ``gpu_memory_utilization`` × device memory *in all* (a per-instance
  limit that holds its weights, the profiled activation peak and the KV cache), not on top of its
  weights. Its weights take the engine's dtype (``auto``: the agent's, as the backend passes it),
  split over ``tensor_parallel_size``; the KV cache gets at most the rest. Weights larger than the
  reservation leave no KV cache: vLLM refuses to start, and so does the plan.
- sleep level 1 offloads the weights to pinned host memory and discards the KV cache; level 2
  discards both (the weights come back by a sync from the learner). Either frees the reservation
  but what lies outside vLLM's sleep pool: CUDA-graph pools and persistent buffers (the CUDA context
  is the learner's: one process). That remainder is taken as 2 GiB (``sleeping_gib``): vLLM's own
  sleep test bounds a 1B model's at 2 GiB (V0), and tolerates up to 7 GiB in V1 for a known
  logits-buffer leak (``--sleeping-engine 7`` plans for that).

Which engines sleep, per stage: the module's stage-level policy (``agentcap.training.engines``,
mirrored here without importing the training stack; tests/test_plan.py checks the two agree on the
recipes). The engines of the roles that act in a stage are awake for all of it; when the stage
begins, every other awake engine goes to sleep: level 1 when a later stage uses it before its agent
trains again (an adapter engine: always level 1, its base never changes), else level 2 (the agent
trains now or before its next use, so its weights are re-synced anyway, or it is never used
again). An engine already asleep keeps its level; one without ``enable_sleep_mode`` never sleeps.
Roles that share a base and sample through vLLM (``share_base_with`` a ``backend: vllm`` role) count
one engine, the owner's: the base once, an adapter per role; it is awake while any of its roles acts.
A stage's ``harvest`` runs first, with the roles it plays awake: the device counts the larger of
that phase and the stage's own. Which roles act is read from the config alone: none in an ``sft``
stage; in a rollout stage every agent, unless the environment ``mode`` (stage override, else
``env.kwargs``) names one role, which then acts alone (ACE-Cap's ``captioner`` and ``instruct``
modes); a GRPO stage's own agent always.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentcap.core.settings import ConfigError

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: ``agentcap.agents.backends.base.VLLMOptions`` defaults (restated: that module imports torch)
ENGINE_DEFAULTS = {"gpu_memory_utilization": 0.3, "tensor_parallel_size": 1, "enable_sleep_mode": False,
                   "dtype": "auto"}
SLEEPING_GIB = 2.0
AWAKE = "awake"


@dataclass(frozen=True)
class Engine:
    """One agent's engine on one rank (bytes)."""

    role: str
    dtype: str
    weights: float  # on the device awake; in host memory at sleep level 1
    reserve: float  # gpu_memory_utilization × device memory: everything the engine takes awake
    sleeps: bool  # enable_sleep_mode
    adapter: bool  # a LoRA agent's engine: its base never changes, it sleeps at level 1 at most
    roles: tuple[str, ...] = ()  # every role sampling through it: a shared base's owner and the roles sharing it

    @property
    def serves(self) -> set[str]:
        return set(self.roles or (self.role,))

    @property
    def kv_cache(self) -> float:
        """The most the KV cache can get (vLLM also takes its profiled activation peak out of it)."""
        return self.reserve - self.weights


def riders(agents: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Roles that sample through another role's engine: ``share_base_with`` a ``backend: vllm`` role,
    with ``backend: vllm`` themselves (one engine holds the base once, an adapter per role)."""
    vllm = {role for role, cfg in agents.items() if cfg.get("backend", "hf") == "vllm"}
    return {role: cfg["share_base_with"] for role, cfg in agents.items()
            if role in vllm and cfg.get("share_base_with") in vllm}


def engine_of(role: str | None, engines: dict[str, Engine]) -> str | None:
    """The engine ``role`` samples through (its own, or its shared base's), None for an HF agent."""
    return next((name for name, engine in engines.items() if role in engine.serves), None)


def engine_specs(agents: dict[str, dict[str, Any]], params: dict[str, int], device: float) -> dict[str, Engine]:
    """The engine of every ``backend: vllm`` agent, one for a shared base and the roles on it; refuses
    one whose weights leave no KV cache."""
    engines = {}
    shared = riders(agents)
    for role, cfg in agents.items():
        if cfg.get("backend", "hf") != "vllm" or role in shared:
            continue
        options = {**ENGINE_DEFAULTS, **(cfg.get("vllm") or {})}
        dtype = cfg.get("dtype", "float32") if options["dtype"] == "auto" else options["dtype"]
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"agents.{role}.vllm.dtype must be one of {sorted(DTYPE_BYTES)} or auto, got {dtype!r}")
        weights = params[role] * DTYPE_BYTES[dtype] / int(options["tensor_parallel_size"])
        share = float(options["gpu_memory_utilization"])
        reserve = share * device
        if weights >= reserve:
            raise ConfigError(
                f"agents.{role}.vllm.gpu_memory_utilization {share:g} reserves {reserve / GIB:.1f} GiB of "
                f"{device / GIB:g} GiB, not more than the engine's {dtype} weights ({weights / GIB:.1f} GiB): "
                "no room for a KV cache; raise it or set vllm.dtype: bfloat16"
            )
        engines[role] = Engine(role, dtype, weights, reserve, bool(options["enable_sleep_mode"]), bool(cfg.get("peft")),
                               (role, *[r for r, owner in shared.items() if owner == role]))
    return engines


def playing(mode: Any, roles: list[str]) -> set[str]:
    """The roles an episode of ``mode`` involves: the one it names, else every role."""
    return {mode} if mode in roles else set(roles)


def acting_roles(stage: dict[str, Any], roles: list[str], env_kwargs: dict[str, Any]) -> set[str]:
    """The roles that generate in ``stage`` itself (its harvest apart: :func:`harvest_roles`)."""
    if stage.get("kind") == "sft":
        return set()
    acting = playing((stage.get("env") or {}).get("mode", env_kwargs.get("mode")), roles)
    if stage.get("kind") == "grpo" and stage.get("agent") in roles:
        acting.add(stage["agent"])
    return acting


def harvest_roles(stage: dict[str, Any], roles: list[str], env_kwargs: dict[str, Any]) -> set[str]:
    """The roles a stage's harvest rollout plays (none without one)."""
    harvest = stage.get("harvest")
    return set() if harvest is None else playing(harvest.get("mode", env_kwargs.get("mode")), roles)


def sleep_level(stages: list[dict[str, Any]], uses: list[set[str]], index: int, engine: Engine) -> int:
    """The level an engine unused in stage ``index`` goes to sleep at (see the module docstring)."""
    if engine.adapter:
        return 1
    if stages[index].get("agent") == engine.role and stages[index].get("kind") != "evaluate":
        return 2  # trains now: re-synced before its next use
    for later, used in zip(stages[index + 1 :], uses[index + 1 :]):
        if later.get("agent") == engine.role and later.get("kind") != "evaluate":
            return 2  # trains before its next use: re-synced anyway
        if engine.role in used:
            return 1
    return 2  # never used again


def engine_states(stages: list[dict[str, Any]], engines: dict[str, Engine], roles: list[str],
                  env_kwargs: dict[str, Any]) -> list[tuple[dict[str, str | int], set[str]]]:
    """Per stage: each engine built so far, ``awake`` or its sleep level (1 or 2), and the engines
    awake during the stage's harvest (empty without one)."""
    acting = [acting_roles(stage, roles, env_kwargs) for stage in stages]
    # by engine: one on a shared base acts when any of its roles does
    uses = [{name for name, engine in engines.items() if engine.serves & used} | used for used in acting]
    state: dict[str, str | int] = {}
    out = []
    for index, stage in enumerate(stages):
        played = harvest_roles(stage, roles, env_kwargs)
        harvest = {name for name, engine in engines.items() if engine.serves & played}
        for role in harvest | (uses[index] & set(engines)):
            state[role] = AWAKE  # built at its first generate, woken before one
        harvest_awake = {r for r, s in state.items() if s == AWAKE} if harvest else set()
        for role, now in state.items():
            if role not in uses[index] and now == AWAKE and engines[role].sleeps:
                state[role] = sleep_level(stages, uses, index, engines[role])
        out.append(({r: state[r] for r in engines if r in state}, harvest_awake))  # in the config's order
    return out


def device_bytes(engines: dict[str, Engine], state: dict[str, str | int], harvest_awake: set[str],
                 sleeping_gib: float) -> float:
    """What the engines hold on one device: awake ones their reservation, sleeping ones the remainder;
    the larger of the harvest (``harvest_awake`` awake) and the stage itself."""
    def total(awake: set[str]) -> float:
        return sum(engines[r].reserve if r in awake else sleeping_gib * GIB for r in state)

    return max(total({r for r, s in state.items() if s == AWAKE}), total(harvest_awake))


def host_copies(engines: dict[str, Engine], state: dict[str, str | int]) -> float:
    """Host memory of the level-1 sleepers' weights (pinned); level 2 keeps none."""
    return sum(engines[r].weights for r, s in state.items() if s == 1)


def describe(state: dict[str, str | int]) -> tuple[str, str]:
    """(awake roles, sleeping roles with their level) for a table cell."""
    awake = ", ".join(r for r, s in state.items() if s == AWAKE) or "-"
    asleep = ", ".join(f"{r} (L{s})" for r, s in state.items() if s != AWAKE) or "-"
    return awake, asleep
