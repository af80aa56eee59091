"""Throughput and peak memory of agentcap's GRPO update of one rollout batch (one minibatch: one
optimiser step): full fine-tuning, LoRA, LoRA with gradient checkpointing, next to a plain Hugging
Face forward/backward of the same batch.

    python tools/bench_update.py                    # tiny Qwen2 on CPU
    python tools/bench_update.py --device cuda --preset qwen2.5-1.5b --precision bf16-mixed
    python tools/bench_update.py --smoke            # the smallest setting, one repeat (CI)

Every measurement runs in a fresh process (one per variant and repeat, variants interleaved), so
no variant inherits another's allocations. What is measured:

- time: wall clock of one step after one untimed warm-up step (AdamW state already allocated);
  tokens/s counts every prompt + completion token of the batch.
- memory, CPU: the step's peak resident-set growth. Linux's peak RSS (VmHWM) is reset to the
  current RSS just before the step (``/proc/self/clear_refs``), and glibc returns every freed
  block above 64 KiB to the system (``MALLOC_MMAP_THRESHOLD_``), so the number is the activations,
  gradients and temporaries the step really touched. CUDA: ``torch.cuda.max_memory_allocated``
  over the step minus the allocation before it.
- state: bytes of trainable parameters' gradients plus AdamW state (persistent between steps).

The update is the one ``agentcap fit`` runs: ``GRPOModule.update``'s function
(``agentcap.training.update``, called through ``agentcap.training.harness`` outside a Trainer): the
minibatch order, micro-batches (``--micro-batch``) under the global token normaliser,
``Agent.completion_logprobs`` with entropy → ``clipped_objective`` → backward →
``training.optim.optimizer_step`` (gradient sum over ranks, non-finite checks, clipping, AdamW,
weight norm, sampler sync). The rows carry the rollout's old log-probs, so the ratio is not 1. The
plain HF row is ``model(input_ids, labels).loss`` → backward with every parameter trainable and no
optimiser: the floor a trainer can reach.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

PRESETS = {
    # a tiny Qwen2 that still has real matmuls on a CPU
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=4096),
    # Qwen2.5-1.5B's published dimensions (random weights from the config)
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}
VARIANTS = ("hf_forward_backward", "full", "lora", "lora_checkpointing")


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(variant: str, args) -> dict:
    """One variant in this process: build, warm up, then time and measure one step."""
    import torch
    import transformers

    from agentcap.agents.adapters import LoraSpec, attach_adapter
    from agentcap.agents.agent import Agent
    from agentcap.agents.checkpointing import enable_gradient_checkpointing
    from agentcap.agents.generation import Generation

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = transformers.Qwen2Config(**PRESETS[args.preset], max_position_embeddings=4096)
    model = transformers.Qwen2ForCausalLM(config).to(device).eval()
    adapters = None
    if variant == "lora_checkpointing":
        enable_gradient_checkpointing(model)
    if variant.startswith("lora"):
        adapters = attach_adapter(model, "policy", LoraSpec(r=args.rank, alpha=2 * args.rank))
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16-mixed"
                else contextlib.nullcontext())
    b, p, t = args.batch, args.prompt, args.completion
    prompt = torch.randint(0, config.vocab_size, (b, p), device=device)
    completion = torch.randint(0, config.vocab_size, (b, t), device=device)
    mask = torch.ones(b, t, dtype=torch.long, device=device)
    inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}

    if variant == "hf_forward_backward":
        ids = torch.cat([prompt, completion], 1)
        model.requires_grad_(True)

        def step():
            with autocast:
                loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
            loss.backward()
            model.zero_grad(set_to_none=True)

        trainable = []
    else:
        # agentcap's own update (training.harness → training.update, what GRPOModule.update runs): one
        # minibatch of the whole batch, the global token normaliser, optim.optimizer_step (clipping, checks, AdamW)
        from agentcap.training.harness import IdsTokenizer, UpdateHarness, rows
        from agentcap.training.update import UpdateSettings

        agent = Agent("policy", model, IdsTokenizer(), adapters=adapters)
        settings = UpdateSettings(minibatch_size=b, micro_batch_size=args.micro_batch)
        harness = UpdateHarness(agent, settings, lr=1e-5, precision=args.precision)
        trainable = agent.trainable_parameters()
        observations = [IdsTokenizer.observation(row.tolist()) for row in prompt]
        with torch.no_grad(), autocast:  # the rollout's old log-probs (a sampler's), so every step is a ratio ≠ 1
            old = agent.completion_logprobs(inputs, completion, mask)
        generations = [Generation(completion_ids=c, old_logprobs=o, sampler_logprobs=o) for c, o in zip(completion, old)]
        batch = rows(observations, generations)
        for row, advantage in zip(batch, torch.linspace(-1, 1, b).tolist()):
            row.advantage = advantage

        def step():
            harness.update(batch)

    step()  # warm-up: kernels chosen, AdamW state allocated
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # VmHWM := current RSS
        before = _rss_bytes("VmRSS")
    start = time.perf_counter()
    step()
    sync()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _rss_bytes("VmHWM")
    state = sum(p.numel() * p.element_size() * 3 for p in trainable)  # grad + exp_avg + exp_avg_sq
    params = sum(p.numel() for p in model.parameters())
    return {
        "variant": variant,
        "seconds": seconds,
        "tokens_per_s": b * (p + t) / seconds,
        "peak_step_bytes": peak - before,
        "state_bytes": state,
        "trainable": sum(p.numel() for p in trainable) if trainable else params,
        "params": params,
        # model FLOPs: 6·N·tokens for a full backward; MFU against the chip's peak when given
        "mfu": (6 * params * b * (p + t) / seconds / args.peak_flops) if args.peak_flops else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["32", "bf16-mixed"], default="32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=None, help="rows per forward/backward (default: all)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peak-flops", type=float, default=None, help="e.g. 790e12 for an H200 in bf16 (dense)")
    parser.add_argument("--smoke", action="store_true", help="tiny preset, batch 2 × (8 + 8) tokens, one repeat, every variant in this process (it runs; its figures compare nothing)")
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # child process mode
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.batch, args.prompt, args.completion, args.rank, args.repeats = "tiny", 2, 8, 8, 4, 1
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return 0
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(args.threads)}
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):  # interleaved: drift in machine load hits every variant alike
        for variant in VARIANTS:
            if args.smoke:  # one process for all: the figures are not comparable, the run is quick
                runs[variant].append(measure(variant, args))
                continue
            out = subprocess.run([sys.executable, __file__, *forwarded, "--one", variant], env=env,
                                 capture_output=True, text=True, check=True)
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = _median(runs["hf_forward_backward"], "tokens_per_s")
    base_mem = _median(runs["hf_forward_backward"], "peak_step_bytes")
    print("GRPO update: agentcap's own (GRPOModule.update → agentcap.training.update, run by training.harness)")
    print(f"preset {args.preset}, {args.device}, precision {args.precision}, batch {args.batch} × "
          f"({args.prompt} prompt + {args.completion} completion) tokens, median of {args.repeats}")
    print(f"| {'variant':20s} | trainable | tokens/s | × HF | step peak MiB | × HF | grad+AdamW MiB |"
          + (" MFU |" if args.peak_flops else ""))
    print("|" + "---|" * (7 + bool(args.peak_flops)))
    for variant in VARIANTS:
        rows = runs[variant]
        tps, mem = _median(rows, "tokens_per_s"), _median(rows, "peak_step_bytes")
        line = (f"| {variant:20s} | {rows[0]['trainable']:,} | {tps:,.0f} | {tps / base:.2f} | "
                f"{mem / 2**20:,.1f} | {mem / base_mem:.2f} | {rows[0]['state_bytes'] / 2**20:,.1f} |")
        if args.peak_flops:
            line += f" {_median(rows, 'mfu'):.1%} |"
        print(line)
    return 0


def _median(rows: list[dict], key: str) -> float:
    values = sorted(r[key] for r in rows)
    return values[len(values) // 2]


if __name__ == "__main__":
    raise SystemExit(main())
