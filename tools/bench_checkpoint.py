"""Rank 0's peak host memory while a sharded agent is checkpointed: the old full gather vs sharded (DCP).

    .venv/bin/python tools/bench_checkpoint.py                 # SmolLM2-135M dimensions, 2 gloo processes
    .venv/bin/python tools/bench_checkpoint.py --procs 4 --layers 8
    .venv/bin/python tools/bench_checkpoint.py --smoke          # a tiny Llama (CI)

Each process builds a Llama of the given dimensions (random weights), shards it with FSDP2 as
``grpo_fsdp`` does (``agentcap.parallel.sharding``), takes one AdamW step, then checkpoints its
weights and optimiser state twice, as ``training.checkpoint_hooks`` does:

- full: ``model_state`` / ``optimizer_state`` gathered into full tensors, ``torch.save`` on rank 0
  (what ``grpo_fsdp`` wrote before sharded checkpoints, ``save_distributed_checkpoint=False``);
- sharded: ``resume.sharded.save``, each rank writing its own shards through torch.distributed.checkpoint.

The figure is rank 0's peak RSS growth during each save (Linux: the high-water mark is reset
through ``/proc/self/clear_refs`` before each), printed beside rank 0's own shard and the full state.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import socket
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 2**20


def _status(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_growth(save) -> tuple[int, float]:
    """(peak RSS growth in bytes, seconds) of ``save()`` in this process."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM, the peak RSS, to the current RSS
    before, start = _status("VmRSS"), time.perf_counter()
    save()
    seconds = time.perf_counter() - start
    return max(0, _status("VmHWM") - before), seconds  # 0, not below: RSS may shrink while saving


class _Agent:
    def __init__(self, model):
        self.model = model


def _worker(rank: int, port: int, args, out: str, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentcap.parallel.sharding import _shard, model_state, optimizer_state
    from agentcap.resume import sharded

    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)  # DCP's notes on its own planner defaults
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.procs,
                            timeout=datetime.timedelta(minutes=10))
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         tie_word_embeddings=True)
    model = _shard(LlamaForCausalLM(config), init_device_mesh("cpu", (args.procs,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (1, 16))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    agent = _Agent(model)
    own = sum(t.to_local().numel() * t.element_size() for t in model.parameters())
    own += sum(v.to_local().numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if hasattr(v, "to_local"))
    total = sum(t.numel() * t.element_size() for t in model.parameters()) * 3  # weights + two AdamW moments

    def full() -> None:
        state = {"state_dict": model_state(model), "agentcap": {"optimizer": optimizer_state(agent, optimizer)}}
        if rank == 0:
            torch.save(state, Path(out) / "full.ckpt")
        dist.barrier()

    def shards() -> None:
        state = {"state_dict": model_state(model, full=False),
                 "agentcap": {"optimizer": optimizer_state(agent, optimizer, full=False)}}
        sharded.save(state, Path(out) / "sharded", rank == 0)
        dist.barrier()

    figures = {}
    for name, save in (("sharded", shards), ("full", full), ("sharded again", shards)):
        figures[name] = peak_growth(save)
    if rank == 0:
        results.put({"own": own, "total": total, **figures})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=576, help="SmolLM2-135M: 576")
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv_heads", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--smoke", action="store_true", help="a 2-layer Llama of width 64, 2 processes (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.procs, args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads, args.vocab = 2, 64, 128, 2, 4, 2, 512
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as out:
        procs = [context.Process(target=_worker, args=(r, port, args, out, results)) for r in range(args.procs)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            raise SystemExit(f"bench_checkpoint: a process failed: exit codes {[p.exitcode for p in procs]}")
        full_size = Path(out, "full.ckpt").stat().st_size
        folder_size = sum(f.stat().st_size for f in Path(out, "sharded").iterdir())
    r = results.get()
    params = r["total"] / 3 / 4 / 1e6
    print(f"bench_checkpoint: Llama {args.layers} layers × {args.hidden}, {params:.0f} M params (fp32), AdamW, "
          f"{args.procs} gloo processes")
    print(f"  full state (weights + 2 moments)  {r['total'] / MiB:8.0f} MiB   on disk: full.ckpt "
          f"{full_size / MiB:.0f} MiB, sharded folder {folder_size / MiB:.0f} MiB")
    print(f"  rank 0's own shard                {r['own'] / MiB:8.0f} MiB")
    print(f"  {'save':<16}{'rank 0 peak RSS growth':>24}{'÷ own shard':>13}{'÷ full gather':>15}{'seconds':>9}")
    for name in ("full", "sharded", "sharded again"):
        grown, seconds = r[name]
        ratios = f"{grown / r['own']:>13.2f}{grown / r['full'][0]:>15.3f}"
        print(f"  {name:<16}{grown / MiB:>20.0f} MiB{ratios}{seconds:>9.1f}")


if __name__ == "__main__":
    main()
