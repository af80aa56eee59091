"""Two gloo processes for one test: rank 0 in the test's own process, rank 1 spawned (one fresh
interpreter instead of two keeps a test fast on 2 cores: the imports dominate)."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def process_group(rank: int, port: int, world_size: int = 2):
    """A gloo group on loopback for the ``with`` block; a collective that waits over a minute fails
    instead of hanging.

    The address goes in ``init_method``, not in ``MASTER_PORT``: an environment variable left in the
    test process would send a later test's Lightning launch to this (closed or reused) port. Ranks that
    finished meet at a barrier before leaving, so neither tears its sockets down while the other is
    still reading them (a one-sided teardown aborted a loaded CI run's second rank)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_in_two_processes(worker, *args, timeout: float = 120) -> None:
    """``worker(rank, port, *args)`` on ranks 0 and 1; ``worker`` must be a module-level function."""
    port = free_port()
    context = mp.spawn(_rank_one, args=(worker, port, *args), nprocs=1, join=False)
    try:
        worker(0, port, *args)
    finally:
        if not context.join(timeout=timeout):
            for process in context.processes:
                process.terminate()


def _rank_one(_index: int, worker, port: int, *args) -> None:
    """Rank 1 leaves with ``os._exit`` once its worker returned: its results are on disk, and C++
    static destructors at interpreter exit are not what a test measures."""
    worker(1, port, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
