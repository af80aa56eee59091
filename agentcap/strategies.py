"""Data parallelism for a module whose trainable agent changes between stages.

``torch.nn.parallel.DistributedDataParallel`` fixes the set of trainable parameters when it wraps
the model, which the schedule breaks (Captioner, then Instruct, then Composer train in turn). This
strategy keeps everything Lightning's DDP strategy does (process launch, groups, samplers, metric
sync) but does not wrap the module; :class:`agentcap.module.GRPOModule` sums gradients across
ranks itself after normalising its loss by the global token count.
"""

from __future__ import annotations

from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry


class GRPODDPStrategy(DDPStrategy):
    strategy_name = "grpo_ddp"

    def configure_ddp(self) -> None:
        assert self.model is not None
        _sync_module_states(self.model)  # what DDP's constructor would broadcast from rank 0


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
