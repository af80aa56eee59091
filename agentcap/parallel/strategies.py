"""Data parallelism (``grpo_ddp``) and sharding (``grpo_fsdp``) for a module whose trainable agent
changes between stages.

``torch.nn.parallel.DistributedDataParallel`` fixes the set of trainable parameters when it wraps
the model, which the schedule breaks (Captioner, then Instruct, then Composer train in turn). This
strategy keeps everything Lightning's DDP strategy does (process launch, groups, samplers, metric
sync) but does not wrap the module; :class:`agentcap.training.module.GRPOModule` sums gradients across
ranks itself after normalising its loss by the global token count.
"""

from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path

from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, StrategyRegistry

from agentcap.parallel.watchdog import collective_timeout
from agentcap.resume import sharded


class GRPODDPStrategy(DDPStrategy):
    """``timeout``: agentcap's collective timeout (:func:`agentcap.parallel.watchdog.collective_timeout`,
    600 s unless ``--collective_timeout`` / ``AGENTCAP_COLLECTIVE_TIMEOUT`` says otherwise), not
    Lightning's 30 minutes; a ``timedelta`` or seconds."""

    strategy_name = "grpo_ddp"

    def __init__(self, *args, timeout=None, **kwargs):
        super().__init__(*args, timeout=_timeout(timeout), **kwargs)

    def configure_ddp(self) -> None:
        assert self.model is not None
        _sync_module_states(self.model)  # what DDP's constructor would broadcast from rank 0


def _timeout(timeout) -> datetime.timedelta:
    """A strategy's collective timeout: agentcap's default when none is given; seconds or a ``timedelta``."""
    if timeout is None:
        return collective_timeout()
    return timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=float(timeout))


StrategyRegistry.register(
    "grpo_ddp", GRPODDPStrategy, description="DDP without the module wrapper (agentcap)", override=True
)
StrategyRegistry.register(
    "grpo_ddp_spawn",
    GRPODDPStrategy,
    description="spawned DDP without the module wrapper (agentcap)",
    start_method="spawn",
    override=True,
)


class GRPOFSDPStrategy(ModelParallelStrategy):
    """FSDP2 through Lightning: ``GRPOModule.configure_model`` shards every agent on its own.

    Pure data parallel over every process of every node (no tensor parallelism). A checkpoint is a
    folder each process writes its own shards into (:mod:`agentcap.resume.sharded`): weights, the
    stage's optimiser and a sharded KL reference, never gathered into one process; DCP reshards them
    when a run resumes on another number of processes. ``save_distributed_checkpoint=False`` gathers
    them into one full file on rank 0 instead. A full file loads either way. ``--trainer.num_nodes``
    scales it out under torchrun or SLURM. ``timeout``: as :class:`GRPODDPStrategy`'s.
    """

    strategy_name = "grpo_fsdp"

    def __init__(self, save_distributed_checkpoint: bool = True, timeout=None, **kwargs):
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint, timeout=_timeout(timeout), **kwargs)

    @property
    def sharded_checkpoints(self) -> bool:
        """Whether checkpoints are folders of shards (read by ``training.checkpoint_hooks`` to keep its state sharded)."""
        return self._save_distributed_checkpoint

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        if self._tensor_parallel_size == "auto":
            self._tensor_parallel_size = 1
        super().setup_environment()

    def optimizer_state(self, optimizer):
        # the module checkpoints its own per-stage optimiser (training.checkpoint_hooks); gathering it again
        # for Lightning's copy would be a wasted collective
        return {}

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        if self.global_rank == 0 and path.is_dir() and not path.is_symlink():  # a killed save's leftovers
            shutil.rmtree(path)
        elif self.global_rank == 0 and os.path.lexists(path):
            path.unlink()
        self.barrier("agentcap-sharded-save")
        sharded.save(checkpoint, path, self.global_rank == 0)

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        from lightning.fabric.strategies.model_parallel import _load_checkpoint

        path = Path(self.broadcast(str(checkpoint_path)))
        strict = self.lightning_module.strict_loading
        if path.is_dir():  # the module restores its optimiser and reference from the folder itself
            return sharded.load(path, self.model, strict=strict)
        # a full file: the weights; the module restores its optimiser itself
        return _load_checkpoint(path=path, state={"state_dict": self.model}, strict=strict, weights_only=weights_only)


StrategyRegistry.register(
    "grpo_fsdp", GRPOFSDPStrategy, description="FSDP2, each agent sharded on its own (agentcap)", override=True
)
