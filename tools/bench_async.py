"""GRPO step wall time with rollouts overlapping the update (max_staleness K = 1) against the serial step (K = 0).

Why: with K = 1 the rollouts of step s+1 are sampled in a background thread while step s updates
(``agentcap.rollout.pipeline``), so a step should cost about max(generation, update) instead of their
sum. The settings are ``tools/bench_step.py``'s (SmolLM2-135M-Instruct, float32, G rollouts of each
prompt, exactly ``--new-tokens`` new tokens, a cheap reward, one AdamW step); the K = 1 step samples
with the agent's sampler copy (HF backend) through the real pipeline. The update is the one
``agentcap fit`` runs (``GRPOModule.update``'s ``agentcap.training.update``, through
``agentcap.training.harness``; with K = 1 its truncated importance weights against the sampler). Each measurement is a fresh
process; K = 0 and K = 1 alternate, and the table gives per-pair ratios (min / median), because the
machine is shared and noisy. Placement: ``--threads`` intra-op threads for the whole process (K = 1
runs two Python threads, the learner's and the sampler's, over the same pool); ``--k0-threads`` lets
the serial baseline use every core for its intra-op work.

``--backend vllm`` samples with the agent's vLLM engine instead (CPU build, ``.venv-vllm``; the
learner syncs it every step, verified, as in training), generating exactly ``--new-tokens`` tokens
too (``min_tokens``). The engine runs inside the learner's process, as agentcap builds it: an engine
core in a process of its own cannot take a sync through ``collective_rpc`` on vLLM 0.32's CPU build
(its executor fails to pickle the received tensors: ``cannot pickle memoryview objects``).

    python tools/bench_async.py --pairs 3
    python tools/bench_async.py --pairs 3 --k0-threads 2      # baseline with both cores per op
    python tools/bench_async.py --trl-python .venv-bench/bin/python   # also TRL's synchronous step
    .venv-vllm/bin/python tools/bench_async.py --backend vllm --pairs 3
    python tools/bench_async.py --smoke       # the smallest setting, K = 0 and K = 1 in one process, hf and served (CI)
    python tools/bench_async.py --backend served --pairs 3
    python tools/bench_async.py --backend served --smoke
    .venv-vllm/bin/python tools/bench_async.py --backend served --server vllm --pairs 2 [--lora]

``--backend served`` samples through a server in a process of its own (``backend: served``, full
weights: every sync writes the weights to a folder, the server reloads them and the probe is
checked; with K = 1 each batch's snapshot goes in as a version of its own, ``backends.served_ahead``).
The server is the test suite's fake vLLM (``tests/test_served_backend.py``: vLLM's endpoints over
HTTP, sampling token by token with its own copy of the model, no KV cache), started on loopback by
this script, so the figures measure the placement (the learner's process no longer generates) and
the sync's cost, not vLLM's speed. Its lengths are exactly ``--new-tokens`` unless EOS comes first.
``--server vllm`` starts a real ``vllm serve`` instead (``vllm.served.start``; each measured process
starts its own, about a minute here, outside the timed steps); its lengths stop at EOS too.
``--lora`` trains an adapter (synced as adapter versions) instead of every weight.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import PROMPTS, load, reward  # noqa: E402  (the same model, prompts and reward)


def steps(args) -> dict:
    from agentcap.agents.agent import Agent
    from agentcap.agents.sampling import trajectory_seed
    from agentcap.algorithms.offpolicy import effective_tis_cap
    from agentcap.rollout.pipeline import RolloutPipeline
    from agentcap.training.harness import UpdateHarness, rows
    from agentcap.training.update import UpdateSettings

    sync_folder = None
    if args.lora or args.server == "vllm":
        agent, sync_folder = built(args)
    elif args.backend == "vllm":
        model, tokenizer, folder = load_folder(args)
        agent = Agent("policy", model, tokenizer, max_new_tokens=args.new_tokens, lr=1e-6)
        from agentcap.agents.backends.base import VLLMOptions

        agent.use_backend("vllm", VLLMOptions(enforce_eager=True, max_model_len=512), str(folder))
    else:
        model, tokenizer = load_untied(args) if args.backend == "served" else load(args.seed)
        model.generation_config.min_new_tokens = args.new_tokens  # same lengths every step
        agent = Agent("policy", model, tokenizer, max_new_tokens=args.new_tokens, lr=1e-6)
    if args.backend == "served" and sync_folder is None:
        from agentcap.agents.backends.base import VLLMOptions

        url, sync_folder = args.served_url, tempfile.mkdtemp(prefix="bench-async-sync-")
        agent.use_backend("served", VLLMOptions(served={"urls": [url], "model": "base", "folder": sync_folder}), None)
    # the update agentcap fit runs (GRPOModule.update's, through training.harness): one minibatch, token mean,
    # TIS against the sampler's log-probs with K = 1, optimizer_step (which also syncs a vLLM engine)
    n = args.prompts * args.group
    harness = UpdateHarness(agent, UpdateSettings(minibatch_size=n, seed=args.seed,
                                                  tis_cap=effective_tis_cap(None, args.k)), lr=1e-6)
    prompts = [{"agent": "policy", "messages": [{"role": "user", "content": p}]} for p in PROMPTS[: args.prompts]]
    observations = [o for o in prompts for _ in range(args.group)]
    pipeline = RolloutPipeline(args.k)
    pipeline.begin(0, agent)

    def request(step: int):
        seeds = [trajectory_seed(args.seed + step, t, 0) for t in range(len(observations))]
        return lambda stand_ins: (stand_ins or {}).get("policy", agent).generate(observations, seeds=seeds,
                                                                                 old_logprobs=False)

    times, waits, updates = [], [], []
    total = args.steps + 1
    for step in range(total):
        start = time.perf_counter()
        gens, _ = pipeline.take(step, total - 1, agent, request)
        waited = time.perf_counter() - start
        batch = rows(observations, gens, reward([g.text for g in gens]), group_size=args.group)  # + advantages
        t0 = time.perf_counter()
        harness.update(batch)
        if step:  # the first step warms up (and, with K = 1, has nothing sampled ahead)
            times.append(time.perf_counter() - start)
            waits.append(waited)
            updates.append(time.perf_counter() - t0)
    pipeline.close()
    if args.server == "vllm":
        agent.backend.close()  # stops the server agentcap started
    if sync_folder:
        shutil.rmtree(sync_folder, ignore_errors=True)  # the last version's weights
    return {"times": times, "waits": waits, "updates": updates}


def built(args):
    """The agent as ``agentcap fit`` builds it (``build_agent``) from SmolLM2's folder: a LoRA adapter
    with ``--lora``, sampling with ``--backend`` (``served`` with ``--server vllm``: a real ``vllm
    serve`` that agentcap starts on loopback, eager, float32). Returns it and the served sync folder."""
    from agentcap.agents.adapters import LoraSpec
    from agentcap.agents.agent import AgentConfig, build_agent
    from agentcap.agents.gguf import cached_smollm2

    torch.manual_seed(args.seed)
    vllm, folder = {"enforce_eager": True, "max_model_len": 512}, None
    if args.backend == "vllm":
        load_folder(args)  # exactly --new-tokens tokens per sample
    if args.backend == "served":
        folder = tempfile.mkdtemp(prefix="bench-async-sync-")
        vllm.update(dtype="float32", served={"start": 1, "model": "smollm2", "folder": folder, "start_timeout": 1800})
    peft = LoraSpec(r=8, alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]) if args.lora else None
    model = cached_smollm2()
    if args.backend == "served" and not args.lora:  # a served full fine-tune needs an untied output head
        from agentcap.agents.pretrained import untied_copy

        model = untied_copy(model, model.with_name(model.name + "-untied"))
    agent = build_agent("policy", AgentConfig(model=str(model), backend=args.backend, vllm=vllm, peft=peft,
                                              max_new_tokens=args.new_tokens, lr=1e-6))
    if args.backend == "hf":
        agent.model.generation_config.min_new_tokens = args.new_tokens
    return agent, folder


def load_untied(args):
    """``load``'s model with its output head untied from the embedding, for the fake server and its
    learner: a served full fine-tune needs an untied head (``backends.served``)."""
    model, tokenizer = load(args.seed)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    return model, tokenizer


def load_folder(args):
    """SmolLM2-135M-Instruct as a dense HF folder (the engine's) and the learner loaded from it."""
    import vllm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentcap.agents.gguf import cached_smollm2

    folder = cached_smollm2()
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    generate = vllm.LLM.generate  # exactly --new-tokens tokens per sample, as min_new_tokens does for HF

    def fixed_length(self, prompts, params=None, *rest, **options):
        for one in params if isinstance(params, list) else [params]:
            if one is not None and one.prompt_logprobs is None:  # samples; not the sync probe's scoring
                one.min_tokens = one.max_tokens
        return generate(self, prompts, params, *rest, **options)

    vllm.LLM.generate = fixed_length
    return model, tokenizer, folder


def serve(args) -> None:
    """``--serve``: the fake vLLM server holding the benchmark's model, on loopback, until stdin closes;
    its URL is the first line printed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_served_backend import FakeVLLM

    torch.set_num_threads(args.threads)
    model, _ = load_untied(args)
    fake = FakeVLLM(model)
    print(f"URL {fake.url}", flush=True)
    sys.stdin.read()
    fake.close()


@contextlib.contextmanager
def server(args):
    """A ``--serve`` process for ``--backend served`` (its URL in ``args.served_url``); nothing otherwise."""
    if args.backend != "served" or args.served_url or args.server == "vllm":
        yield
        return
    cmd = [sys.executable, __file__, "--serve", "--seed", str(args.seed), "--threads", str(args.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        if not line.startswith("URL "):
            raise SystemExit(f"bench_async: the fake server did not start ({line!r})")
        args.served_url = line.split()[1]
        yield
    finally:
        args.served_url = None
        process.stdin.close()
        process.wait(60)


def worker(args) -> None:
    torch.set_num_threads(args.threads)
    with server(args):
        result = steps(args)
    result["median_s"] = statistics.median(result["times"])
    print("RESULT " + json.dumps(result))


def measure(args, k: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--k", str(k), "--threads", str(threads), "--seed", str(args.seed),
           "--group", str(args.group), "--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens),
           "--steps", str(args.steps), "--backend", args.backend, "--server", args.server] + ["--lora"] * args.lora
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    if args.backend == "vllm" or args.server == "vllm":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"K={k} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def trl_step(args) -> float | None:
    """TRL's synchronous step (median s) from tools/bench_step.py, when a Python with TRL is given."""
    if not args.trl_python:
        return None
    cmd = [args.trl_python, str(Path(__file__).with_name("bench_step.py")), "--worker", "trl", "--threads",
           str(args.threads), "--group", str(args.group), "--prompts", str(args.prompts), "--new-tokens",
           str(args.new_tokens), "--steps", str(args.steps), "--seed", str(args.seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"TRL worker failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])["median_s"]


def compare(args) -> None:
    ratios, to_trl = [], []
    k0_threads = args.k0_threads or args.threads
    for pair in range(args.pairs):
        order = (0, 1) if pair % 2 == 0 else (1, 0)
        got = {k: measure(args, k, k0_threads if k == 0 else args.threads) for k in order}
        trl = trl_step(args)
        a, b = got[0], got[1]
        ratio = b["median_s"] / a["median_s"]
        ratios.append(ratio)
        line = (f"pair {pair}: K=0 {a['median_s']:.2f} s (update {statistics.median(a['updates']):.2f}) | "
                f"K=1 {b['median_s']:.2f} s (wait for rollout {statistics.median(b['waits']):.2f}, update "
                f"{statistics.median(b['updates']):.2f}) | K=1 / K=0 {ratio:.2f}")
        if trl is not None:
            to_trl.append(b["median_s"] / trl)
            line += f" | TRL {trl:.2f} s, K=1 / TRL {to_trl[-1]:.2f}"
        print(line, flush=True)
    print(f"step time K=1 / K=0 over {len(ratios)} pairs: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}"
          f" (backend {args.backend}{' (vllm serve)' if args.server == 'vllm' else ''}, "
          f"{'LoRA' if args.lora else 'full fine-tune'}; threads: K=0 {k0_threads}, K=1 {args.threads})")
    if to_trl:
        print(f"step time K=1 / TRL: min {min(to_trl):.2f}, median {statistics.median(to_trl):.2f}")


def smoke(args) -> None:
    """The smallest setting, K = 0 then K = 1 in this process, one measured step each; the default
    (hf) also runs the served engine, which needs nothing more installed."""
    args.group, args.prompts, args.new_tokens, args.steps = 2, 1, 2, 1
    torch.set_num_threads(args.threads)
    for args.backend in ["hf", "served"] if args.backend == "hf" else [args.backend]:
        for k in (0, 1):
            args.k = k
            with server(args):
                r = steps(args)
            print(f"bench_async --smoke: K={k} step {r['times'][0]:.2f} s (wait for rollout {r['waits'][0]:.2f}, "
                  f"agentcap's update {r['updates'][0]:.2f}; backend {args.backend})", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="G=2, one prompt, 2 new tokens, one step of K=0 and K=1 (CI)")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--k", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="measured steps per process (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--k0-threads", type=int, default=None, help="intra-op threads of the K=0 baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl-python", default=None, help="a Python with trl==1.16.0 (extra `bench`)")
    parser.add_argument("--backend", choices=("hf", "vllm", "served"), default="hf")
    parser.add_argument("--serve", action="store_true", help="run the fake vLLM server (--backend served)")
    parser.add_argument("--server", choices=("fake", "vllm"), default="fake",
                        help="--backend served: the test suite's fake server, or a real `vllm serve` (.venv-vllm)")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (r 8, attention) instead of every weight")
    parser.add_argument("--served-url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args)
    elif args.smoke:
        smoke(args)
    elif args.worker:
        worker(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
