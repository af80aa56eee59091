"""Peak host memory per process while a sharded agent loads: today's path (every process loads
the full weights, rank 0's are broadcast, then ``fully_shard``) against loading by shard (built on
meta, sharded, each process reads only its rows of the safetensors files; agentcap.parallel.loading).

    .venv/bin/python tools/bench_loading.py                      # a random Llama of real dimensions
    .venv/bin/python tools/bench_loading.py --folder runs/models/smollm2
    .venv/bin/python tools/bench_loading.py --smoke              # a tiny Llama, N = 1 and 2 (CI)

N = 1 is today's full load (no sharding), then N = 2 and 4 gloo processes on the CPU, each path
once per N, interleaved, one process group per measurement. Each process resets its peak RSS after
its imports and its process group (``/proc/self/clear_refs``), builds the agent as ``agentcap fit``
would (float32 masters) and shards it; the figure is its peak RSS (``VmHWM``) above that baseline,
shown in MiB and as a ratio to one full float32 copy of the model.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import tempfile
from pathlib import Path

import torch.multiprocessing as mp


def _status(field: str) -> int:
    """A /proc/self/status figure in bytes."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _worker(rank: int, world: int, port: int, folder: str, path: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    from agentcap.agents.agent import AgentConfig, build_agent
    from agentcap.parallel import loading
    from agentcap.parallel.sharding import shard_agents

    transformers.utils.logging.disable_progress_bar()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (world,))
    loading.load_by_shard(path == "by shard")
    dist.barrier()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")  # the peak RSS restarts from here
    baseline = _status("VmRSS")
    agent = build_agent("policy", AgentConfig(model=folder))
    if path != "today, 1 process":
        shard_agents({"policy": agent}, mesh)
    peak = _status("VmHWM") - baseline
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in agent.model.parameters())
    Path(out, f"{rank}.json").write_text(json.dumps({"peak": peak, "local": local}))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(folder: str, world: int, path: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(world, _free_port(), folder, path, out), nprocs=world, start_method="spawn")
        return [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]


def random_llama(folder: Path, hidden: int, layers: int, vocab: int) -> Path:
    """A Llama of real dimensions with random weights, saved in bf16 safetensors (as checkpoints are)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentcap.agents.tokenizer import build_word_tokenizer

    tokenizer = build_word_tokenizer(["a random model for the loading benchmark"])
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                         num_key_value_heads=max(1, hidden // 256), intermediate_size=hidden * 11 // 4,
                         vocab_size=vocab, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder, max_shard_size="200MB")
    tokenizer.save_pretrained(folder)
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=None, help="an HF model folder (default: a random Llama)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--smoke", action="store_true", help="a Llama of width 64, 2 layers; N = 1 and 2 (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.ranks = 64, 2, 512, [2]
    folder = args.folder or random_llama(Path("runs/bench_loading") / f"llama-{args.hidden}x{args.layers}",
                                         args.hidden, args.layers, args.vocab)
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentcap.parallel.loading import parameters_on_meta

    with parameters_on_meta():
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).parameters())
    full = params * 4  # one float32 copy: what every process of today's path holds
    mib = 2 ** 20
    print(f"{folder}: {params / 1e6:.0f} M parameters, one float32 copy {full / mib:.0f} MiB")
    print(f"{'N':>2}  {'path':<18} {'peak / rank (MiB)':>22}  {'ratio to one copy':>22}  {'1/N':>5}")
    runs = [(1, "today, 1 process")] + [(n, path) for n in args.ranks for path in ("today", "by shard")]
    for world, path in runs:
        ranks = measure(str(folder), world, path)
        peaks = [r["peak"] for r in ranks]
        shown = " ".join(f"{p / mib:.0f}" for p in peaks)
        ratios = " ".join(f"{p / full:.2f}" for p in peaks)
        print(f"{world:>2}  {path:<18} {shown:>22}  {ratios:>22}  {1 / world:>5.2f}", flush=True)


if __name__ == "__main__":
    main()
