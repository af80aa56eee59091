"""The trainable agent's optimiser, its per-stage learning-rate schedule, micro-batches, and the
precision rule for trained parameters.

1. One AdamW per stage over the trainable agent's parameters with gradients (adapter tensors only
   for a LoRA agent), so frozen agents never carry optimiser state; stepped after each minibatch.
2. The lr schedule is per stage and advances once per stage step (one SFT step, or one GRPO
   rollout batch with all its minibatch updates): linear warm-up over ``warmup_steps`` from
   lr/warmup to lr, then ``constant``, ``linear`` (to 0 after the last step) or ``cosine`` decay.
   Its state is checkpointed with the optimiser's. Both are registered as the trainer's own when the
   stage begins (``show_to_lightning``), so Lightning's callbacks (``LearningRateMonitor``) see them.
3. Micro-batches split an optimiser step's rows into forward/backward passes whose gradients add
   up; the loss weights are normalised by the whole step's token count (``token_weights``), so the
   sum equals one pass over all rows.
4. Trained parameters stay float32: an AdamW step at lr 1e-6 on a bf16 weight (8-bit mantissa)
   mostly rounds back to the same value. bf16 compute comes from ``--trainer.precision
   bf16-mixed`` (Lightning's autocast wraps every training step: rollout and update); a bf16 base
   is fine under a LoRA adapter, whose own tensors are float32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch
from lightning.pytorch.utilities.types import LRSchedulerConfig

from agentcap.agents.agent import Agent
from agentcap.core.settings import ConfigError
from agentcap.parallel import distributed
from agentcap.parallel.sharding import full_norm, needs_gradient_all_reduce
from agentcap.training.finite import gradient_error, weight_error

T = TypeVar("T")


def build_optimizer(agent: Agent, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    return torch.optim.AdamW(agent.trainable_parameters(), lr=lr, weight_decay=weight_decay)


def optimizer_step(
    agent: Agent, optimizer: torch.optim.Optimizer, max_grad_norm: float, where: str = "", loss: float | None = None
) -> float:
    """Sum gradients over ranks (a sharded agent's were reduce-scattered in backward), clip, step,
    clear, sync the agent's sampler; returns the gradient norm before clipping.

    A NaN / Inf gradient norm (``loss``: this rank's, to name it) or weight raises
    :class:`~agentcap.training.finite.NonFiniteError` naming ``where`` (stage and tick) and the tensor."""
    if needs_gradient_all_reduce(agent):
        distributed.sum_gradients(agent.parameters())
    trained = [p for p in agent.parameters() if p.requires_grad]
    # clip_grad_norm_ in two halves: clipping by a NaN norm would turn every gradient NaN, hiding the first one
    total = torch.nn.utils.get_total_norm([p.grad for p in trained if p.grad is not None])
    grad_norm = full_norm(total)
    if not math.isfinite(grad_norm):
        raise gradient_error(where or f"agents.{agent.name}", agent, grad_norm, loss)
    torch.nn.utils.clip_grads_with_norm_(trained, max_grad_norm, total)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # the weights' 2-norm: the gradient clip's own kernel, so about as cheap as the sum of the weights
    # (the ∞-norm, exact but never overflowing, took 5× longer on CPU); a NaN or Inf weight makes it non-finite
    weight_norm = full_norm(torch.nn.utils.get_total_norm(trained))
    if not math.isfinite(weight_norm):
        raise weight_error(where or f"agents.{agent.name}", agent, weight_norm)
    agent.sync_weights()  # a vLLM sampler takes the new weights before its next rollout
    return grad_norm


def lr_factor(step: int, steps: int, warmup_steps: int = 0, schedule: str = "constant") -> float:
    """Multiplier of the stage's lr at stage step ``step`` (0-based) of ``steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    raise ValueError(f"lr_schedule: {schedule!r} is not one of constant, linear, cosine")


def build_scheduler(optimizer: torch.optim.Optimizer, stage) -> torch.optim.lr_scheduler.LambdaLR:
    """The stage's warm-up + decay as a LambdaLR, stepped once per stage step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, stage.steps, stage.warmup_steps, stage.lr_schedule)
    )


def show_to_lightning(trainer: Any, optimizer: torch.optim.Optimizer | None, scheduler: Any, agent: str | None) -> None:
    """Make the stage's optimiser and lr schedule the trainer's (``trainer.optimizers``,
    ``trainer.lr_scheduler_configs``; none for an evaluation), where Lightning's callbacks look for
    them: ``LearningRateMonitor`` logs ``lr-<agent>``. Under manual optimisation Lightning steps
    neither; the module does, and checkpoints them itself (``training.checkpoint_hooks``)."""
    if trainer is None:
        return
    trainer.strategy.optimizers = [] if optimizer is None else [optimizer]
    trainer.strategy.lr_scheduler_configs = (
        [] if scheduler is None else [LRSchedulerConfig(scheduler, name=f"lr-{agent}", interval="step")]
    )


def micro_batches(rows: Sequence[T], size: int | None) -> list[list[T]]:
    """``rows`` in consecutive chunks of at most ``size`` (all at once when None); none when empty."""
    rows = list(rows)
    if not rows:
        return []
    size = len(rows) if size is None else size
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def aligned_micro_batches(
    agent: Agent, rows: Sequence[T], size: int | None, stand_in: Sequence[T] = ()
) -> list[tuple[list[T], float]]:
    """``(micro-batch, scale)`` passes for one optimiser step. A sharded agent's every forward and
    backward is a collective, so each rank must run as many passes as the busiest one: the missing
    ones repeat a real micro-batch (or ``stand_in`` rows, for a rank without rows) at scale 0."""
    passes = [(micro, 1.0) for micro in micro_batches(rows, size)]
    if distributed.world()[1] == 1 or needs_gradient_all_reduce(agent):
        return passes
    missing = distributed.most(len(passes)) - len(passes)
    spare = [micro for micro, _ in passes] or micro_batches(stand_in, size)
    if missing and not spare:
        raise ValueError(f"agents.{agent.name}: this process has no rows to take part in the sharded passes")
    return passes + [(spare[-1], 0.0)] * missing


def check_trainable_precision(agents: Mapping[str, Any], stages: Sequence[Any]) -> None:
    """Refuse low-precision parameters on an agent some stage trains with an optimiser (item 4)."""
    trained = {s.agent: s.name for s in stages if s.kind in ("sft", "grpo")}
    for role, stage in trained.items():
        config = agents[role]
        if config.dtype != "float32" and config.peft is None:
            raise ConfigError(
                f"agents.{role}.dtype: {config.dtype} parameters, but stage {stage!r} trains {role!r} with "
                f"AdamW: updates smaller than a {config.dtype} weight's rounding step (lr 1e-6 on weights ~1e-2) "
                "vanish, so most weights would never change. Keep dtype: float32 (fp32 master weights) and "
                "pass --trainer.precision bf16-mixed for bf16 compute, or train a LoRA adapter "
                f"(agents.{role}.peft) over the {config.dtype} base."
            )
