"""The prepared check for a lent GPU (one H200): agentcap's own code paths at real dimensions, in one go.

    bash tools/gpu_check.sh              # on the GPU machine (installs agentcap, then runs this)
    python tools/gpu_check.py --smoke    # every part at tiny size on the CPU (gloo), in seconds

Parts, each printed as a row of one table and written to ``<out>/gpu_check.json``:

1. ``grpo``: agentcap's own GRPO step, sharded and bf16-mixed, on a model of real dimensions
   (Llama-3.2-1B's published config, random weights built on the GPU, fp32 masters and gradient
   checkpointing as in the recipes). The model is sharded the way ``GRPOModule.configure_model``
   does under ``grpo_fsdp`` (``agentcap.training.harness.shard`` → ``parallel.sharding.shard_agents``,
   FSDP2 ``fully_shard`` with bf16 compute, one process), and the update is the one ``agentcap fit``
   runs: ``GRPOModule.update``'s ``agentcap.training.update`` through ``agentcap.training.harness``
   (under bf16 autocast, as Lightning's ``bf16-mixed`` runs a training step): one minibatch of every
   row, micro-batches of ``micro`` rows under the global token normaliser, ``clipped_objective`` with
   entropy, backward, then ``training.optim.optimizer_step`` (gradient checks, clipping, AdamW,
   weight norm). Before it: HF ``generate`` of B prompts × G samples (exactly ``--new-tokens``
   each) and the old log-probs (``Agent.completion_logprobs``, no grad, as a sharded agent's rollout
   scores them); advantages from random rewards by ``set_advantages`` (what ``grpo_step`` calls).
   One untimed step first (kernels chosen, AdamW state allocated); the second is timed. Figures:
   generate tokens/s (new tokens), update tokens/s (prompt + completion), and the update's MFU:
   6 · N · tokens / seconds / peak (model FLOPs: checkpointing's recomputation not counted),
   N every parameter, peak 989 TFLOP/s (an H200's dense bf16 by
   NVIDIA's datasheet; ``--peak-tflops`` for another chip; about 790 was measured on random data).
2. ``prefix``: the judges' prefix reader (``agentcap.judges.prefix.PrefixReader``) on cloze prompts
   that share a template and, per caption, the caption: the time for the batch against reading every
   prompt whole (one padded forward per batch), and the largest gap between their letter logits.
3. ``vllm``: if ``import vllm`` works, one engine (bf16, the same config saved as a folder): generate
   tokens/s, then sleep level 1 and wake-up times with the device memory each frees; else
   "vllm: not installed".
4. ``async``: rollouts ahead of the update (``model.max_staleness`` K = 1, ``agentcap.rollout.pipeline``)
   against the serial step (K = 0) on the same model, unsharded, bf16 autocast: each step takes its
   rollouts through the pipeline (K = 1: the HF sampler copy in the rollout thread, one step behind),
   then the update ``agentcap fit`` runs (with K = 1 its truncated importance weights). K = 0 and
   K = 1 alternate (two pairs, each one warm-up step and two timed steps); figures: median step per K
   and the per-pair ratio K = 1 / K = 0. On one GPU the two threads share the device, so the gain is
   what the overlap of one thread's kernel launches and host work with the other's kernels gives.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

# Llama-3.2-1B's published dimensions (1.24 B parameters, tied embeddings)
REAL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
            max_position_embeddings=4096, rope_theta=500000.0)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, vocab_size=512, tie_word_embeddings=True,
            max_position_embeddings=512)  # head_dim 32: the smallest vLLM's CPU attention takes
# sizes of each part: (prompts, G, prompt tokens, new tokens, micro-batch rows) and the cloze batch
SIZES = {
    "real": dict(prompts=16, group=8, prompt_tokens=256, new_tokens=256, micro=16,
                 captions=8, questions=32, template=96, caption=384, question=48, judge_batch=32),
    "smoke": dict(prompts=2, group=2, prompt_tokens=8, new_tokens=4, micro=2,
                  captions=2, questions=3, template=6, caption=10, question=5, judge_batch=4),
}
PEAK_TFLOPS = 989.0  # H200 SXM, dense bf16 (NVIDIA datasheet)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn):
    """(result, seconds) of ``fn()``, the device drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def llama(dims: dict, device: torch.device, dtype: torch.dtype = torch.float32):
    """A Llama of ``dims`` with random weights, built directly on ``device``."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**dims, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    return model.eval()


def grpo_step(dims: dict, size: dict, device: torch.device, peak_tflops: float) -> dict:
    """agentcap's own sharded bf16-mixed GRPO step (see module doc), on a one-process group."""
    from agentcap.training.harness import process_group

    with process_group(device):
        return _grpo_step(dims, size, device, peak_tflops)


def _grpo_step(dims: dict, size: dict, device: torch.device, peak_tflops: float) -> dict:
    from agentcap.agents.agent import Agent
    from agentcap.agents.checkpointing import enable_gradient_checkpointing
    from agentcap.agents.generation import Generation
    from agentcap.training.harness import IdsTokenizer, UpdateHarness, autocast, rows, shard
    from agentcap.training.update import UpdateSettings

    model = llama(dims, device)
    params = sum(p.numel() for p in model.parameters())
    enable_gradient_checkpointing(model)  # as the recipes (and before sharding, as build_agent does)
    agent = Agent("policy", model, IdsTokenizer(pad_token_id=0, eos_token_id=2))
    shard(agent, "bf16-mixed", device)  # GRPOModule.configure_model under grpo_fsdp
    n, p, t = size["prompts"] * size["group"], size["prompt_tokens"], size["new_tokens"]
    # GRPOModule.update with one minibatch of every row, micro-batches of size["micro"], lr 1e-6, β = 0
    harness = UpdateHarness(agent, UpdateSettings(minibatch_size=n, micro_batch_size=size["micro"]), lr=1e-6,
                            precision="bf16-mixed")
    prompts = torch.randint(3, dims["vocab_size"], (size["prompts"], p), device=device)
    prompt = prompts.repeat_interleave(size["group"], dim=0)  # [B·G, P], an item's G rows together
    inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    observations = [IdsTokenizer.observation(row.tolist()) for row in prompt]
    utilities = torch.rand(n, generator=torch.Generator().manual_seed(0)).tolist()  # a reward per row

    def rollout():
        with torch.no_grad(), autocast("bf16-mixed", device):
            out = agent.model.generate(**inputs, do_sample=True, max_new_tokens=t, min_new_tokens=t, pad_token_id=0)
        return out[:, p:]  # [B·G, T]

    def old_logprobs(completion, mask):
        # a sharded agent's old log-probs are scored with the rollout (GRPOModule._rollout), not lazily
        with torch.no_grad(), autocast("bf16-mixed", device):
            return agent.completion_logprobs(inputs, completion, mask)

    def step():
        completion, gen_s = timed(device, rollout)
        mask = torch.ones_like(completion)
        old, old_s = timed(device, lambda: old_logprobs(completion, mask))
        batch = rows(observations, [Generation(completion_ids=c, old_logprobs=o) for c, o in zip(completion, old)],
                     utilities, group_size=size["group"])
        stats, update_s = timed(device, lambda: harness.update(batch))
        return gen_s, old_s, update_s, stats["loss"], stats["grad_norm"]

    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    gen_s, old_s, update_s, loss, norm = step()
    tokens = n * (p + t)
    flops = 6 * params * tokens
    result = {
        "step": "agentcap (GRPOModule.update: agentcap.training.update via training.harness; FSDP2, bf16-mixed)",
        "params": params, "rows": n, "prompt_tokens": p, "new_tokens": t, "micro_batch": size["micro"],
        "generate_s": gen_s, "generate_tokens_per_s": n * t / gen_s,
        "old_logprobs_s": old_s, "update_s": update_s, "update_tokens_per_s": tokens / update_s,
        "update_tflops": flops / update_s / 1e12, "mfu": flops / update_s / (peak_tflops * 1e12),
        "peak_tflops": peak_tflops, "loss": loss, "grad_norm": norm,
        "finite": math.isfinite(loss) and math.isfinite(norm),
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def cloze_prompts(size: dict, vocab: int) -> list[list[int]]:
    """Prompts as a judge builds them: one template, then a caption, then one question; every
    caption's questions share it (token ids drawn at random, fixed seed)."""
    g = torch.Generator().manual_seed(1)

    def draw(n):
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    template = draw(size["template"])
    prompts = []
    for _ in range(size["captions"]):
        caption = draw(size["caption"])
        prompts += [template + caption + draw(size["question"]) for _ in range(size["questions"])]
    return prompts


def prefix_reader(dims: dict, size: dict, device: torch.device) -> dict:
    """The prefix reader against whole prompts, on a bf16 judge of the same dimensions."""
    from agentcap.judges.prefix import PrefixReader

    model = llama(dims, device, torch.bfloat16)
    prompts = cloze_prompts(size, dims["vocab_size"])
    letters = list(range(3, 8))  # five answer letters
    reader = PrefixReader(model, pad_id=0, batch_size=size["judge_batch"])
    wanted = torch.tensor(letters, device=device)

    @torch.inference_mode()
    def whole():
        out = []
        for start in range(0, len(prompts), size["judge_batch"]):
            chunk = prompts[start : start + size["judge_batch"]]
            width = max(len(r) for r in chunk)
            ids = torch.tensor([r + [0] * (width - len(r)) for r in chunk], device=device)
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in chunk], device=device)
            logits = model(input_ids=ids, attention_mask=mask).logits
            last = mask.sum(dim=1) - 1
            out.append(logits[torch.arange(len(chunk), device=device), last][:, wanted].float().cpu())
        return torch.cat(out)

    whole()  # warm-up, both
    reader.last_logits(prompts, letters)
    plain, plain_s = timed(device, whole)
    shared, shared_s = timed(device, lambda: reader.last_logits(prompts, letters))
    agree = (plain.argmax(dim=1) == shared.argmax(dim=1)).float().mean().item()
    tokens = sum(len(r) for r in prompts)
    del model
    return {"prompts": len(prompts), "captions": size["captions"], "prompt_tokens": tokens,
            "whole_s": plain_s, "prefix_s": shared_s, "speedup": plain_s / shared_s,
            "max_abs_logit_gap": (plain - shared).abs().max().item(), "same_answer": agree}


def vllm_engine(dims: dict, size: dict, device: torch.device) -> dict:
    """One vLLM engine of the same config: generate tokens/s, sleep level 1 and wake-up."""
    try:
        import vllm
    except Exception as error:  # noqa: BLE001 - any import failure means: not usable here
        return {"status": f"vllm: not installed ({type(error).__name__})"}
    from vllm import LLM, SamplingParams

    folder = Path(tempfile.mkdtemp(prefix="gpu_check_llama_"))
    llama(dims, torch.device("cpu"), torch.bfloat16).save_pretrained(folder)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sleeps = device.type == "cuda"  # sleep mode is a CUDA feature
    llm = LLM(model=str(folder), skip_tokenizer_init=True, dtype="bfloat16", gpu_memory_utilization=0.3,
              enable_sleep_mode=sleeps, max_model_len=size["prompt_tokens"] + size["new_tokens"] + 8, seed=0)
    rows, t = size["prompts"] * size["group"], size["new_tokens"]
    g = torch.Generator().manual_seed(2)
    requests = [{"prompt_token_ids": torch.randint(3, dims["vocab_size"], (size["prompt_tokens"],),
                                                   generator=g).tolist()} for _ in range(rows)]
    params = SamplingParams(max_tokens=t, min_tokens=t, temperature=1.0, seed=0, detokenize=False)
    llm.generate(requests[:2], params, use_tqdm=False)  # warm-up
    outs, gen_s = timed(device, lambda: llm.generate(requests, params, use_tqdm=False))
    new = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {"status": f"vllm {vllm.__version__}", "generate_s": gen_s, "generate_tokens_per_s": new / gen_s}
    if sleeps:
        free = lambda: torch.cuda.mem_get_info(device)[0] / 2**30  # noqa: E731
        before = free()
        _, result["sleep_s"] = timed(device, lambda: llm.sleep(level=1))
        result["sleep_frees_gib"] = free() - before
        _, result["wake_s"] = timed(device, llm.wake_up)
    return result


def async_steps(dims: dict, size: dict, device: torch.device, pairs: int = 2) -> dict:
    """K = 1 (rollouts ahead) against K = 0, alternating, on one model (see module doc)."""
    import statistics

    from agentcap.agents.agent import Agent
    from agentcap.algorithms.offpolicy import effective_tis_cap
    from agentcap.rollout.pipeline import RolloutPipeline
    from agentcap.training.harness import IdsTokenizer, UpdateHarness, autocast, rows
    from agentcap.training.update import UpdateSettings

    model = llama(dims, device)
    t, n = size["new_tokens"], size["prompts"] * size["group"]
    model.generation_config.min_new_tokens = t  # every step samples exactly t new tokens
    agent = Agent("policy", model, IdsTokenizer(pad_token_id=0, eos_token_id=2), max_new_tokens=t, lr=1e-6)
    agent.set_trainable(True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, dims["vocab_size"], (size["prompt_tokens"],), generator=g).tolist()
               for _ in range(size["prompts"])]
    observations = [IdsTokenizer.observation(p) for p in prompts for _ in range(size["group"])]
    utilities = torch.rand(n, generator=torch.Generator().manual_seed(0)).tolist()

    def request(step: int):
        seeds = [1000 * step + i for i in range(n)]

        def run(stand_ins):
            with torch.no_grad(), autocast("bf16-mixed", device):
                return (stand_ins or {}).get("policy", agent).generate(observations, seeds=seeds, old_logprobs=False)
        return run

    def measure(k: int, steps: int = 3) -> list[float]:
        harness = UpdateHarness(agent, UpdateSettings(minibatch_size=n, micro_batch_size=size["micro"],
                                                      tis_cap=effective_tis_cap(None, k)), lr=1e-6,
                                precision="bf16-mixed")
        pipeline = RolloutPipeline(k)
        pipeline.begin(0, agent)
        times = []
        for step in range(steps):
            synchronize(device)
            start = time.perf_counter()
            generations, _ = pipeline.take(step, steps - 1, agent, request)
            harness.update(rows(observations, generations, utilities, group_size=size["group"]))
            synchronize(device)
            if step:  # the first step warms up (and with K = 1 has nothing sampled ahead)
                times.append(time.perf_counter() - start)
        pipeline.close()
        return times

    k0, k1, ratios = [], [], []
    for _ in range(pairs):
        a, b = measure(0), measure(1)
        k0 += a
        k1 += b
        ratios.append(statistics.median(b) / statistics.median(a))
    return {"pairs": pairs, "rows": n, "new_tokens": t, "k0_step_s": statistics.median(k0),
            "k1_step_s": statistics.median(k1), "k1_over_k0": ratios, "sampler": "HF generate on the sampler copy"}


def table(results: dict) -> str:
    """The figures, one row per part."""
    lines = ["| part | figures |", "|---|---|"]
    g = results.get("grpo")
    if g:
        lines.append(f"| agentcap's grpo step, FSDP2 bf16-mixed ({g['params'] / 1e9:.2f} B params, {g['rows']} rows × ({g['prompt_tokens']} + "
                     f"{g['new_tokens']}) tokens) | generate {g['generate_tokens_per_s']:,.0f} new tok/s "
                     f"({g['generate_s']:.2f} s); old log-probs {g['old_logprobs_s']:.2f} s; update "
                     f"{g['update_tokens_per_s']:,.0f} tok/s ({g['update_s']:.2f} s), "
                     f"{g['update_tflops']:.1f} TFLOP/s, "
                     f"MFU {g['mfu']:.1%} of {g['peak_tflops']:g}; loss {g['loss']:.4f}, grad norm {g['grad_norm']:.3f}"
                     + (f"; peak {g['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in g else "") + " |")
    r = results.get("prefix")
    if r:
        lines.append(f"| prefix reader ({r['prompts']} cloze prompts, {r['captions']} captions, {r['prompt_tokens']:,} "
                     f"tokens) | whole prompts {r['whole_s'] * 1e3:.1f} ms, prefix reader {r['prefix_s'] * 1e3:.1f} ms "
                     f"(× {r['speedup']:.2f}); max letter-logit gap {r['max_abs_logit_gap']:.3g}, same answer "
                     f"{r['same_answer']:.0%} |")
    v = results.get("vllm")
    if v:
        figures = v["status"]
        if "generate_tokens_per_s" in v:
            figures += f": generate {v['generate_tokens_per_s']:,.0f} new tok/s ({v['generate_s']:.2f} s)"
        if "sleep_s" in v:
            figures += (f"; sleep L1 {v['sleep_s']:.2f} s frees {v['sleep_frees_gib']:.1f} GiB; "
                        f"wake {v['wake_s']:.2f} s")
        lines.append(f"| vllm engine | {figures} |")
    a = results.get("async")
    if a:
        lines.append(f"| rollouts ahead, K = 1 vs K = 0 ({a['sampler']}, {a['rows']} rows × {a['new_tokens']} new tokens, "
                     f"{a['pairs']} alternating pairs) | median step K = 0 {a['k0_step_s']:.2f} s, K = 1 "
                     f"{a['k1_step_s']:.2f} s; K = 1 / K = 0 per pair "
                     + ", ".join(f"{r:.2f}" for r in a["k1_over_k0"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="every part at tiny size on the CPU")
    parser.add_argument("--out", default=os.environ.get("OUT", "runs/gpu_check"), help="folder for gpu_check.json")
    parser.add_argument("--parts", default="grpo,prefix,vllm,async", help="comma-separated subset to run")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS, help="the chip's dense bf16 peak")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --smoke on a CPU)", file=sys.stderr)
        return 2
    dims, size = (TINY, SIZES["smoke"]) if args.smoke else (REAL, SIZES["real"])
    results: dict = {"torch": torch.__version__, "python": platform.python_version(),
                     "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke)"}
    print(f"gpu_check: {results['device']}, torch {results['torch']}, python {results['python']}", flush=True)
    print("gpu_check: the grpo part times agentcap's own step (GRPOModule.update via agentcap.training.harness; "
          "FSDP2, bf16-mixed)", flush=True)
    parts = {"grpo": lambda: grpo_step(dims, size, device, args.peak_tflops),
             "prefix": lambda: prefix_reader(dims, size, device),
             "vllm": lambda: vllm_engine(dims, size, device),
             "async": lambda: async_steps(dims, size, device, pairs=1 if args.smoke else 2)}
    failed = []
    for name in args.parts.split(","):
        start = time.perf_counter()
        try:
            results[name] = parts[name]()
        except Exception as error:  # noqa: BLE001 - report every part, then fail
            failed.append(name)
            results[name] = None
            results[f"{name}_error"] = f"{type(error).__name__}: {error}"
            print(f"gpu_check: {name} failed: {results[f'{name}_error']}", file=sys.stderr, flush=True)
        print(f"gpu_check: {name} done in {time.perf_counter() - start:.1f} s", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    if results.get("grpo") and not results["grpo"]["finite"]:
        failed.append("grpo (non-finite loss)")
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
