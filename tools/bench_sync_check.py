"""The sync verification's figures: the probe's engine–learner gap per engine dtype, and its cost.

For each engine dtype, an fp32 learner (SmolLM2-135M-Instruct) and a vLLM engine built from the
same folder; one full weight sync (verified on the probe), timed, then the verification alone,
timed. Prints the gap against the default tolerance of that dtype, and the verification's time as
a ratio to the sync's. Run in the vLLM environment:

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python tools/bench_sync_check.py --model runs/models/smollm2
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="a plain HF folder (default: the re-saved SmolLM2-135M-Instruct, agents.gguf.cached_smollm2)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--smoke", action="store_true", help="float32 only (CI, vLLM env)")
    args = parser.parse_args()
    if args.smoke:
        args.dtypes = ["float32"]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from agentcap.agents.agent import AgentConfig, build_agent

    if args.model is None:
        from agentcap.agents.gguf import cached_smollm2

        args.model = str(cached_smollm2())

    rows = []
    for dtype in args.dtypes:
        config = AgentConfig(model=args.model, backend="vllm", max_new_tokens=4,
                             vllm={"enforce_eager": True, "max_model_len": 256, "dtype": dtype})
        agent = build_agent("policy", config)
        backend = agent.backend
        backend.llm  # build the engine outside the timings
        start = time.perf_counter()
        sent = backend.sync()
        synced = time.perf_counter() - start
        start = time.perf_counter()
        backend.verify()
        checked = time.perf_counter() - start
        probe = backend._probe
        rows.append((dtype, backend.gap, backend.tolerance, len(probe.prompt_ids), len(probe.completion_ids),
                     sent, synced, checked))
        del agent, backend
    print("| engine dtype (learner fp32) | probe max |Δ log p| | default tolerance | gap / tolerance "
          "| probe tokens | sync s (tensors) | verification s | verification / sync |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype, gap, tol, p, c, sent, synced, checked in rows:
        print(f"| {dtype} | {gap:.2e} | {tol:g} | {gap / tol:.3f} | {p} + {c} | {synced:.2f} ({sent}) "
              f"| {checked:.3f} | {checked / synced:.2f} |")


if __name__ == "__main__":
    main()
