"""``agentcap plan``: memory per rank for every stage, from ``config.json`` files alone.

Nothing is loaded: parameter counts come from each model folder's ``config.json`` (decoder LMs,
plus the vision / audio towers of Qwen2.5-Omni, Qwen2.5/3-VL and Gemma 3), so a run can be sized
before its weights are on disk. Per stage and rank the plan adds:

- parameters of the trainable agent (its ``dtype``; LoRA: the frozen base plus fp32 adapters),
- gradients and AdamW state (two moments), in the dtype of what trains,
- frozen agents (a base shared with ``share_base_with`` counted once),
- judges named in the environment's kwargs (``examiner``, ``temporal_examiner``, ``scorer``) as a
  model folder; a served judge (``{url, model}``) holds nothing in the ranks and counts 0,
- training activations of one micro-batch (prompt + ``max_new_tokens`` tokens; per layer about
  34 · tokens · hidden bytes at 16-bit, one layer's worth with gradient checkpointing) plus the
  completion logits in fp32, or the KV cache of the rollout's HF ``generate`` (agents without an
  engine), whichever is larger,
- the vLLM engines of ``backend: vllm`` agents, awake or asleep by stage (``plan_engines``); those
  of ``backend: served`` agents hold nothing here: they are placed on the rollout GPUs
  (``--rollout-gpus``, ``plan_served``), and their agents have no KV cache on the trainer GPUs,
- rollouts ahead of the update (``max_staleness`` K ≥ 1, GRPO stages): K snapshots of what trains
  (a full fine-tune's weights; a LoRA adapter's, or none on the device for an engine, which keeps
  its adapter snapshots in host memory), and for an HF agent its sampler copy, whose generate
  then runs beside the update: its KV cache adds to the activations instead of taking their max,
- under ``grpo_fsdp`` every agent and local examiner (not the coherence scorer) is divided by the
  world size, plus two gathered blocks in flight (bf16 under ``bf16-mixed``: FSDP2's
  mixed-precision policy, ``agentcap.parallel.sharding``).

Host memory per rank: the sleeping engines' level-1 weight copies, plus 1/N of every model in its
dtype while it loads shard by shard; per node, that × the ranks of a node. A stage that overflows
the device or the host is refused in one line naming it (exit 2).

A local judge folder named by several judges (examiner and temporal examiner) is loaded once
(``agentcap.judges.pool``), in its checkpoint's dtype (taken as bf16 here).
Estimates are lower bounds: allocator fragmentation and CUDA context (~1–2 GiB) come on top.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from agentcap.agents.hub import MissingWeightsError, is_hub_id, resolve_model
from agentcap.commands.plan_engines import (
    SLEEPING_GIB, Engine, acting_roles, describe, device_bytes, engine_of, engine_specs, engine_states, host_copies,
)
from agentcap.commands.plan_served import ServedEngine, as_served, gpu_ranges, place, served_specs
from agentcap.resume.configs import read_config

GIB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
JUDGE_KEYS = ("examiner", "temporal_examiner", "scorer")
SHARDED = ("grpo_fsdp", "fsdp")
HOST_GIB = 1862.0  # a DGX H200 node's 2 TB of system memory


@dataclass
class ModelSize:
    """What the plan needs to know of one model."""

    params: int  # every parameter
    block: int  # the largest transformer block (an FSDP unit)
    hidden: int
    layers: int
    kv_width: int  # key/value heads × head dim
    vocab: int
    linears: dict[str, tuple[int, int]]  # per text layer: module name → (in, out), for LoRA


def text_size(c: dict[str, Any]) -> ModelSize:
    """A decoder LM (Qwen2/3, Llama, Gemma, GPT-2 field names)."""
    h = c.get("hidden_size") or c["n_embd"]
    layers = c.get("num_hidden_layers") or c["n_layer"]
    heads = c.get("num_attention_heads") or c["n_head"]
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    inter = c.get("intermediate_size") or c.get("n_inner") or 4 * h
    vocab = c["vocab_size"]
    kind = c.get("model_type", "")
    if kind == "gpt2":
        linears = {"c_attn": (h, 3 * h), "c_proj": (h, h), "c_fc": (h, inter), "mlp.c_proj": (inter, h)}
        block = 4 * h * h + 2 * h * inter + 9 * h + inter
        embed = vocab * h + c.get("n_positions", 1024) * h + h  # + the final norm's bias
        tied = c.get("tie_word_embeddings", True)
    else:
        linears = {
            "q_proj": (h, heads * hd), "k_proj": (h, kv * hd), "v_proj": (h, kv * hd), "o_proj": (heads * hd, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h),
        }
        block = sum(i * o for i, o in linears.values()) + 2 * h
        if kind.startswith("qwen2"):
            block += (heads + 2 * kv) * hd  # q, k, v biases
        if kind.startswith(("qwen3", "gemma3")):
            block += 2 * hd  # q / k norms
        embed = vocab * h
        tied = c.get("tie_word_embeddings", False)
    params = embed + layers * block + h + (0 if tied else vocab * h)
    return ModelSize(params, block, h, layers, kv * hd, vocab, linears)


def vision_params(v: dict[str, Any]) -> int:
    """A ViT tower: Qwen2.5-VL / Qwen3-VL (patch merger) or SigLIP (Gemma 3)."""
    e = v.get("hidden_size") or v.get("embed_dim")
    depth = v.get("depth") or v["num_hidden_layers"]
    inter = v.get("intermediate_size") or 4 * e
    gated = v.get("hidden_act") in ("silu", "swish")
    block = 4 * e * e + 4 * e + (3 if gated else 2) * e * inter + 4 * e
    patch = v.get("in_chans", v.get("num_channels", 3)) * v.get("temporal_patch_size", 1) * v.get("patch_size", 14) ** 2 * e
    merge = v.get("spatial_merge_size")
    out = v.get("out_hidden_size") or v.get("out_hidden")
    head = (e * merge * merge) ** 2 + e * merge * merge * out if merge and out else 0
    return depth * block + patch + head


def audio_params(a: dict[str, Any]) -> int:
    """A Whisper-style encoder (Qwen2-Audio, Qwen2.5-Omni)."""
    d, layers, ffn = a["d_model"], a["encoder_layers"], a["encoder_ffn_dim"]
    block = 4 * d * d + 2 * d * ffn + 9 * d + ffn
    convs = a.get("num_mel_bins", 128) * d * 3 + d * d * 3
    return layers * block + convs + d * a.get("output_dim", d)


def model_size(folder: str, where: str) -> ModelSize:
    """Read ``<folder>/config.json``; an Omni checkpoint counts its thinker only (what agentcap loads)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{where}: {path} not found; `agentcap plan` reads only config.json files "
            "(point --root at a folder holding <model path>/config.json stand-ins)"
        )
    with open(path, encoding="utf-8") as handle:
        c = json.load(handle)
    c = c.get("thinker_config", c)
    size = text_size(c.get("text_config", c))
    extra = (vision_params(c["vision_config"]) if "vision_config" in c else 0) + (
        audio_params(c["audio_config"]) if "audio_config" in c else 0
    )
    size.params += extra
    return size


def model_folder(root: str, model: str, where: str) -> str:
    """``<root>/<model>`` when it holds a config.json stand-in, else a Hub id's folder in the HF cache
    (only its ``config.json`` is fetched; offline, a missing one raises naming the id and the cache)."""
    local = os.path.join(root, model)
    if os.path.isfile(os.path.join(local, "config.json")) or not is_hub_id(model):
        return local
    return resolve_model(model, where, file="config.json")


def lora_params(size: ModelSize, peft: dict[str, Any]) -> int:
    """Adapter parameters: r × (in + out) for every targeted linear of every text layer."""
    r = int(peft.get("r", peft.get("rank", 8)))
    targets = peft.get("target_modules", "all-linear")
    names = size.linears if targets == "all-linear" else {n: s for n, s in size.linears.items() if n in targets or n.split(".")[-1] in targets}
    return size.layers * sum(r * (i + o) for i, o in names.values())


def plan(config: dict[str, Any], root: str = ".", device_gib: float = 141.0, prompt_tokens: int = 1024,
         world: int | None = None, ranks_per_node: int | None = None, host_gib: float = HOST_GIB,
         sleeping_gib: float = SLEEPING_GIB, rollout_gpus: int = 0) -> list[dict[str, Any]]:
    """One row per stage: every term in bytes for one rank (all ranks are alike), its engines and the
    host memory of its node; served engines on ``rollout_gpus`` GPUs of their own (``plan_served``)."""
    trainer, model = config.get("trainer", {}) or {}, config.get("model", {}) or {}
    strategy = str(trainer.get("strategy", "auto"))
    devices = trainer.get("devices", 1)
    devices = 1 if devices in ("auto", None) else (len(devices) if isinstance(devices, list) else int(devices))
    world = world or devices * int(trainer.get("num_nodes", 1))
    per_node = min(ranks_per_node or devices, world)  # Lightning's devices are per node
    shard = world if strategy in SHARDED else 1
    half = "16" in str(trainer.get("precision", "32"))
    act_bytes = 2 if half else 4
    agents = model.get("agents", {}) or {}
    sizes, owners = {}, {}
    for role, cfg in agents.items():
        if not cfg.get("model"):
            raise ValueError(f"agents.{role}: `agentcap plan` needs a model folder (got toy / tiny)")
        sizes[role] = model_size(model_folder(root, cfg["model"], f"agents.{role}.model"), f"agents.{role}.model")
        owners[role] = cfg.get("share_base_with") or role
    judges: dict[str, ModelSize] = {}
    replicated: set[str] = set()  # the coherence scorer is not sharded
    for key in JUDGE_KEYS:
        value = ((model.get("env") or {}).get("kwargs") or {}).get(key)
        try:  # a judge that is neither a stand-in nor a cached id is served or a rule: not counted
            folder = model_folder(root, value, f"model.env.kwargs.{key}") if isinstance(value, str) else None
        except MissingWeightsError:
            folder = None
        if folder and value not in judges and os.path.isfile(os.path.join(folder, "config.json")):
            judges[value] = model_size(folder, f"model.env.kwargs.{key}")
            if key == "scorer":
                replicated.add(value)
    # bf16; examiners are sharded with the agents
    judge_bytes = sum(s.params * 2 / (1 if name in replicated else shard) for name, s in judges.items())
    mixed = str(trainer.get("precision")) == "bf16-mixed"  # FSDP2 gathers blocks in bf16
    env_kwargs = (model.get("env") or {}).get("kwargs") or {}
    stages = model.get("stages", [])
    engines = engine_specs(agents, {r: s.params for r, s in sizes.items()}, device_gib * GIB)
    states = engine_states(stages, engines, list(agents), env_kwargs)
    served = place(served_specs(agents, {r: s.params for r, s in sizes.items()}, device_gib * GIB, world), rollout_gpus)
    remote = {r for r, cfg in agents.items() if cfg.get("backend", "hf") == "served"}  # sample off these GPUs
    # host memory while loading shard by shard: 1/N of every model (a shared base once) in its dtype
    bases = {owners[r]: sizes[r].params * BYTES[agents[r].get("dtype", "float32")] for r in sizes}
    loading = sum(bases.values()) / shard + judge_bytes

    rows = []
    for stage, (state, harvest_awake) in zip(stages, states):
        role = stage.get("agent")
        cfg = agents.get(role, {}) if role else {}
        train = stage.get("kind") in ("sft", "grpo")
        dtype = lambda r: BYTES[agents[r].get("dtype", "float32")]  # noqa: E731
        params = grads = optim = frozen = 0.0
        counted: set[str] = set()  # a base shared by several roles is held once
        for r, size in sizes.items():
            peft = agents[r].get("peft")
            adapters = 4 * lora_params(size, peft) if peft else 0  # adapters stay fp32
            training = train and r == role
            if training:
                # gradients and AdamW's two moments take the trained parameters' dtype (adapters: fp32)
                width = 4 if peft else dtype(r)
                trainable = adapters // 4 if peft else size.params
                grads, optim = width * trainable, 2 * width * trainable
            mine = train and owners[r] == owners.get(role)
            if owners[r] not in counted:
                counted.add(owners[r])
                if mine:
                    params += size.params * dtype(r)
                else:
                    frozen += size.params * dtype(r)
            if training:
                params += adapters
            else:
                frozen += adapters
        params, grads, optim, frozen = (x / shard for x in (params, grads, optim, frozen))
        blocks = [s.block * (2 if mixed else dtype(r)) for r, s in sizes.items()]
        blocks += [s.block * 2 for s in judges.values()]  # judges hold bf16
        gathered = 2 * max(blocks, default=0) if shard > 1 else 0
        activations = 0.0
        if train:
            size = sizes[role]
            rows_per_rank = model.get("micro_batch_size") or math.ceil(
                (model.get("sft_batch_size", 16) if stage["kind"] == "sft" else model.get("minibatch_size", 16)) / world
            )
            completion = cfg.get("max_new_tokens", 64)
            tokens = rows_per_rank * (prompt_tokens + completion)
            per_layer = 34 * tokens * size.hidden * act_bytes / 2
            layers = 1 if cfg.get("gradient_checkpointing") else size.layers
            checkpoints = size.layers * tokens * size.hidden * act_bytes if cfg.get("gradient_checkpointing") else 0
            logits = 3 * rows_per_rank * completion * size.vocab * 4  # logits, log-softmax, probabilities (fp32)
            activations = per_layer * layers + checkpoints + logits
        ahead, overlap = 0.0, False  # max_staleness ≥ 1 (agentcap.rollout.pipeline)
        staleness = int(model.get("max_staleness", 0) or 0)
        if staleness and stage.get("kind") == "grpo":
            peft = agents[role].get("peft")
            adapter = 4 * lora_params(sizes[role], peft) if peft else 0
            snapshot = adapter if peft else sizes[role].params * dtype(role)
            if engine_of(role, engines) is not None or role in remote:  # the engine is the sampler; an adapter's snapshots, and
                ahead = staleness * (0 if peft or shard > 1 else snapshot)  # sharded weights gathered whole, wait on the host
            else:  # a deep copy of the agent (base and adapter) samples beside the update
                ahead, overlap = sizes[role].params * dtype(role) + adapter + staleness * snapshot, True
        kv = 0.0  # the rollout: the KV cache of one generate call of each acting HF agent (engines hold their own)
        batch = model.get("generation_batch_size", 64)
        for r in {r for r in acting_roles(stage, list(agents), env_kwargs) if engine_of(r, engines) is None} - remote:
            length = prompt_tokens + agents[r].get("max_new_tokens", 64)
            kv = max(kv, 2 * sizes[r].layers * sizes[r].kv_width * batch * length * act_bytes)
        on_device = device_bytes(engines, state, harvest_awake, sleeping_gib)
        working = activations + kv if overlap else max(activations, kv)
        total = params + grads + optim + frozen + judge_bytes + gathered + working + on_device + ahead
        terms = {"parameters": params, "gradients": grads, "optimiser": optim, "frozen agents": frozen,
                 "judge": judge_bytes, "gathered blocks": gathered, "activations": activations, "kv cache": kv,
                 "engines": on_device, "rollouts ahead": ahead}
        copies = host_copies(engines, state)
        host = copies + loading
        rows.append({"stage": stage.get("name"), "kind": stage.get("kind"), "agent": role or "-", "ranks": world,
                     "sharded": shard > 1, **terms, "total": total, "device": device_gib * GIB,
                     "largest": max(terms, key=terms.get), "states": state, "harvest awake": harvest_awake,
                     "specs": engines, "served": served, "rollout gpus": rollout_gpus,
                     "engine copies": copies, "loading": loading, "host": host, "ranks per node": per_node,
                     "host per node": host * per_node, "host memory": host_gib * GIB})
    return rows


COLUMNS = ("parameters", "gradients", "optimiser", "frozen agents", "judge", "gathered blocks", "activations",
           "kv cache", "engines", "rollouts ahead", "total")


def markdown(head: list[str], body: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in cells) + " |" for cells in body])


def gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    """Device memory per rank in GiB, one row per stage; the verdict names the largest term when it does not fit."""
    body = []
    for row in rows:
        verdict = "yes" if row["total"] <= row["device"] else f"NO: largest term {row['largest']}"
        ranks = f"0–{row['ranks'] - 1}" if row["ranks"] > 1 else "0"
        body.append([row["stage"], row["agent"], ranks, *(gib(row[c]) for c in COLUMNS), verdict])
    return markdown(["stage", "agent", "ranks", *COLUMNS, "fits"], body)


def engine_table(engines: dict[str, Engine], sleeping_gib: float) -> str:
    """Each vLLM engine per rank (GiB): awake, and what a sleep level frees on the device and costs on the host."""
    body = [[" + ".join(e.roles) if len(e.roles) > 1 else e.role, e.dtype, gib(e.weights), gib(e.kv_cache), gib(e.reserve), gib(e.reserve - sleeping_gib * GIB),
             gib(e.weights), "0.0" if e.sleeps else "no sleep mode"] for e in engines.values()]
    return markdown(["engine", "dtype", "weights", "kv cache ≤", "awake", "sleep frees", "host at level 1",
                     "host at level 2"], body)


def served_table(served: list[ServedEngine]) -> str:
    """Each served agent's servers: where they go on the rollout GPUs and what one GPU holds (GiB)."""
    body = [[" + ".join(e.roles), e.servers, e.tp, gpu_ranges(e), e.dtype, gib(e.weights), gib(e.reserve - e.weights),
             gib(e.reserve)] for e in served]
    return markdown(["served engine", "servers", "GPUs each", "rollout GPUs (per server)", "dtype", "weights / GPU",
                     "kv cache ≤ / GPU", "reserved / GPU"], body)


def host_table(rows: list[dict[str, Any]]) -> str:
    """Per stage: which engines are awake or asleep, and the host memory of a rank and of its node (GiB)."""
    body = []
    for row in rows:
        awake, asleep = describe(row["states"])
        fits = "yes" if row["host per node"] <= row["host memory"] else "NO"
        body.append([row["stage"], awake, asleep, gib(row["engine copies"]), gib(row["loading"]), gib(row["host"]),
                     gib(row["host per node"]), fits])
    return markdown(["stage", "engines awake", "asleep (level)", "level-1 copies", "loading", "host per rank",
                     "host per node", "fits"], body)


def refusal(rows: list[dict[str, Any]]) -> str | None:
    """One line naming the first stage that does not fit and what overflows; None when all fit."""
    for row in rows:
        if row["total"] > row["device"]:
            return (f"stage {row['stage']} does not fit the device: {gib(row['total'])} GiB per rank > "
                    f"{row['device'] / GIB:g} GiB (largest term: {row['largest']}, {gib(row[row['largest']])} GiB)")
        if row["host per node"] > row["host memory"]:
            return (f"stage {row['stage']} does not fit the host: {gib(row['host per node'])} GiB per node > "
                    f"{row['host memory'] / GIB:g} GiB ({row['ranks per node']} ranks × {gib(row['host'])} GiB: "
                    f"level-1 engine copies {gib(row['engine copies'])}, loading {gib(row['loading'])})")
    return None


def report(config_path: str, config: dict[str, Any], rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """What the command prints (docs/memory-plan.md holds it verbatim for the paper recipes)."""
    strategy = (config.get("trainer") or {}).get("strategy", "auto")
    ranks = rows[0]["ranks"] if rows else "?"
    parts = [f"{config_path}: strategy {strategy}, {ranks} ranks, {args.device_memory:g} GiB per device, "
             f"prompts of {args.prompt_tokens} tokens", "", "Device memory per rank (GiB):", "", table(rows)]
    engines = rows[0]["specs"] if rows else {}
    if engines:
        parts += ["", f"vLLM engines per rank (GiB; a sleeping engine keeps {args.sleeping_engine:g} GiB "
                  "on the device):", "", engine_table(engines, args.sleeping_engine)]
    served = rows[0]["served"] if rows else []
    if served:
        used = sum(e.need for e in served)
        parts += ["", f"Served engines on the rollout GPUs ({used} of {rows[0]['rollout gpus']} used, "
                  f"{args.device_memory:g} GiB each; nothing of theirs on the trainer GPUs):", "", served_table(served)]
    if rows:
        parts += ["", f"Engines and host memory per stage (GiB; {rows[0]['ranks per node']} ranks per node, "
                  f"{args.host_memory:g} GiB per node):", "", host_table(rows)]
    return "\n".join(parts)


#: The repository's config.json stand-ins of the paper recipes' models (relative to the repository root).
STAND_INS = "tools/plan_models"


def plan_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agentcap plan", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the fit config (YAML)")
    parser.add_argument("--root", default=".", help="folder that model paths in the config are relative to; "
                        "a Hub id (org/name) not found there is read from the HF cache (config.json only)")
    parser.add_argument("--device-memory", type=float, default=141.0, help="GiB per device (default: H200, 141)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length assumed per row (media included)")
    parser.add_argument("--world", type=int, default=None, help="processes (default: trainer.devices × num_nodes)")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="processes sharing a node's host memory (default: trainer.devices, Lightning's per node)")
    parser.add_argument("--host-memory", type=float, default=HOST_GIB,
                        help=f"GiB of host memory per node (default: {HOST_GIB:g}, a DGX H200's 2 TB)")
    parser.add_argument("--sleeping-engine", type=float, default=SLEEPING_GIB,
                        help=f"GiB a sleeping vLLM engine keeps on the device (default: {SLEEPING_GIB:g})")
    parser.add_argument("--rollout-gpus", type=int, default=0,
                        help="GPUs for served engines (backend: served), apart from the trainer GPUs")
    parser.add_argument("--serve-rollouts", action="store_true",
                        help="plan the backend: vllm agents as backend: served instead (vllm serve processes on "
                        "--rollout-gpus, one per trainer rank unless vllm.served names servers)")
    parser.add_argument("--dtype", choices=sorted(BYTES), default=None, help="override every agent's dtype")
    args = parser.parse_args(argv)
    config = read_config(args.config, "agentcap plan")
    if args.dtype:
        for cfg in ((config.get("model") or {}).get("agents") or {}).values():
            cfg["dtype"] = args.dtype
    if args.serve_rollouts and not as_served(config):
        print(f"agentcap plan: {args.config}: --serve-rollouts: no agent has backend: vllm", file=sys.stderr)
        return 2
    try:
        rows = plan(config, args.root, args.device_memory, args.prompt_tokens, args.world, args.ranks_per_node,
                    args.host_memory, args.sleeping_engine, args.rollout_gpus)
    except (FileNotFoundError, ValueError, KeyError) as err:  # ConfigError is a ValueError
        print(f"agentcap plan: {args.config}: {err}", file=sys.stderr)
        if isinstance(err, FileNotFoundError) and args.root == "." and os.path.isdir(STAND_INS):
            print(f"agentcap plan: the paper models' config.json stand-ins ship in {STAND_INS}: "
                  f"agentcap plan --config {args.config} --root {STAND_INS}", file=sys.stderr)
        return 2
    print(report(args.config, config, rows, args))
    verdict = refusal(rows)
    if verdict:
        print(f"agentcap plan: {args.config}: {verdict}", file=sys.stderr)
        return 2
    return 0
