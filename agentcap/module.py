"""GRPOModule: rollout → reward → advantage → loss, one schedule stage at a time.

One Lightning module trains every task: the environment knows the task and scores finished
episodes; this module samples with the agents, turns the environment's per-action utilities into
group-normalised advantages (READ Eq. 1; LOOP-GRPO Eq. 17 when several action kinds occur) and
updates the one trainable agent with the clipped objective (``algorithms.grpo``).

Implementation details:

1. Manual optimisation. Exactly one agent trains at a time (asserted); its AdamW is created when
   its stage begins and saved in the checkpoint, frozen agents have no optimiser state.
2. Progress is the schedule tick; the train loader only counts ticks. Each tick is one SFT step,
   one GRPO rollout batch (``ppo_epochs`` × minibatch updates) or one evaluation.
3. Data parallel (``agentcap.distributed``): items are sharded over ranks, so every GRPO group
   lives on one rank and group statistics need no communication. Loss weights are normalised by
   the *global* token count and gradients are summed across ranks explicitly (``GRPODDPStrategy``
   does not wrap the module in DDP, whose reducer cannot follow the trainable agent changing
   between stages).
4. A stage's KL reference is a frozen copy of the trainable agent taken when the stage begins,
   or for a LoRA agent the same model with its adapters disabled; β = 0 skips it entirely.
5. Memory and precision (``optim``, ``agents.adapters``): a per-stage lr schedule, micro-batches
   that add up to one optimiser step, fp32 trained parameters (bf16 compute comes from
   Lightning's ``bf16-mixed`` autocast, which wraps every training step: rollout and update).

The rooms it calls: ``splits`` (environments, drivers, item order), ``replay`` (harvested
Instruct items), ``optim`` (the trainable agent's optimiser), ``agents.reference`` (π_ref),
``logs`` (metrics, samples); its evaluation hooks come from ``evaluation.hooks`` and its checkpoint
hooks from ``resume``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from agentcap import distributed
from agentcap.agents.agent import Agent, AgentConfig, build_agents, pad_right
from agentcap.agents.reference import kl_reference
from agentcap.algorithms.grpo import clipped_objective, token_weights
from agentcap.algorithms.loop import normalize_by_type
from agentcap.evaluation.hooks import EvaluationHooks
from agentcap.logs import emit, rollout_metrics, sample_rows
from agentcap.optim import build_optimizer, build_scheduler, check_trainable_precision, micro_batches, optimizer_step
from agentcap.replay import Replay
from agentcap.resume import ResumeHooks
from agentcap.rollout import Span
from agentcap.schedule import Schedule, Stage
from agentcap.splits import EnvSpec, Splits

__all__ = ["EnvSpec", "GRPOModule"]


class _Ticks(IterableDataset):
    """Yields the schedule ticks still to run; the module reads its own tick, not the batch."""

    def __init__(self, module: "GRPOModule"):
        self.module = module

    def __iter__(self):
        return iter(range(self.module.tick, self.module.schedule.total))

    def __len__(self) -> int:
        return self.module.schedule.total - self.module.tick


class GRPOModule(EvaluationHooks, ResumeHooks, L.LightningModule):
    """Trains the agents of one environment through a schedule of stages (see module docstring).

    Args:
        env: the environment and its splits.
        agents: role name → how to build that agent.
        stages: the schedule, run in order.
        group_size: G, rollouts per item.
        rollout_batch_size: trajectories per GRPO step over all ranks (B × G).
        minibatch_size: spans per optimiser step, per rank.
        micro_batch_size: spans (SFT: demonstrations) per forward/backward pass; their gradients
            add up to the same optimiser step (None: the whole minibatch in one pass).
        ppo_epochs: passes over each rollout batch.
        clip_eps: ε of the clipped ratio (lower side; also the upper side unless clip_eps_high).
        clip_eps_high: upper clip ε, for asymmetric clipping.
        beta: KL coefficient; 0 skips the reference model.
        eps_norm: ε in the group normalisation of utilities (LOOP Eq. 17).
        advantage_std: ``population`` (ours, documented in ``algorithms.loop``) or ``unbiased``
            (TRL's; with ``eps_norm: 1e-4`` it matches TRL's advantages).
        loss_aggregation: ``token`` (mean over all tokens, LOOP Eq. 21) or ``sequence`` (mean of
            per-response means, AudioMap Eq. 1).
        sft_batch_size: demonstrations per SFT step, per rank.
        max_grad_norm: gradient clipping.
        weight_decay: AdamW weight decay.
        eval_limit: evaluate on at most this many held-out items (None: all).
        generation_batch_size: observations per generate call.
        sample_every: GRPO steps between sample tables (the first step of a stage always logs one).
        run_dir: where ``summary.json`` and checkpoints go.
        seed: seeds sampling and the order of items.
    """

    def __init__(
        self,
        env: EnvSpec,
        agents: dict[str, AgentConfig],
        stages: list[Stage],
        group_size: int = 4,
        rollout_batch_size: int = 16,
        minibatch_size: int = 16,
        micro_batch_size: int | None = None,
        ppo_epochs: int = 1,
        clip_eps: float = 0.2,
        clip_eps_high: float | None = None,
        beta: float = 0.0,
        eps_norm: float = 1e-6,
        advantage_std: Literal["population", "unbiased"] = "population",
        loss_aggregation: Literal["token", "sequence"] = "token",
        sft_batch_size: int = 16,
        max_grad_norm: float = 1.0,
        weight_decay: float = 0.0,
        eval_limit: int | None = None,
        generation_batch_size: int = 64,
        sample_every: int = 10,
        run_dir: str = "runs/agentcap",
        seed: int = 0,
    ):
        super().__init__()
        if group_size < 1 or rollout_batch_size % group_size:
            raise ValueError(
                f"--model.group_size ({group_size}) must divide --model.rollout_batch_size ({rollout_batch_size})"
            )
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"--model.micro_batch_size must be ≥ 1, got {micro_batch_size}")
        self.automatic_optimization = False
        self.env_spec = env
        self.schedule = Schedule(stages, list(agents))
        check_trainable_precision(agents, stages)
        texts = env.texts() if any(cfg.build_tokenizer_from for cfg in agents.values()) else []
        self.agents = torch.nn.ModuleDict(build_agents(agents, texts))
        self.group_size, self.rollout_batch_size = group_size, rollout_batch_size
        self.minibatch_size, self.ppo_epochs = minibatch_size, ppo_epochs
        self.micro_batch_size = micro_batch_size
        self.clip_eps, self.clip_eps_high, self.beta, self.eps_norm = clip_eps, clip_eps_high, beta, eps_norm
        self.advantage_std, self.loss_aggregation = advantage_std, loss_aggregation
        self.sft_batch_size, self.max_grad_norm, self.weight_decay = sft_batch_size, max_grad_norm, weight_decay
        self.eval_limit, self.generation_batch_size = eval_limit, generation_batch_size
        self.sample_every, self.run_dir, self.seed = sample_every, run_dir, seed
        self.tick = 0
        self.summary: dict[str, dict[str, float]] = {}
        self.samples: list[dict[str, Any]] = []
        self.splits = Splits(env, self.agents, generation_batch_size, seed)
        self.replay = Replay(self.splits, seed)
        self._stage_index: int | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self._reference: Any = None

    # --- Lightning plumbing -------------------------------------------------------------------
    def configure_optimizers(self):
        return None  # one AdamW per stage, built in `_begin_stage`

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Ticks(self), batch_size=None)

    # `agentcap validate / test` evaluate a split once; `agentcap predict` captions the test split
    # (the hooks: ``agentcap.evaluation.hooks``).
    def val_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=None)

    test_dataloader = predict_dataloader = val_dataloader

    # --- the schedule -------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> None:
        index, step = self.schedule.locate(self.tick)
        stage = self.schedule.stages[index]
        if index != self._stage_index:
            self._begin_stage(index)
        if stage.kind == "evaluate":
            self.evaluate(stage)
        elif stage.kind == "sft":
            self.sft_step(stage, step)
        else:
            self.grpo_step(stage, step)
        if self._scheduler is not None:
            self._scheduler.step()  # one lr per stage step (see agentcap.optim)
        self.tick += 1
        if self.tick >= self.schedule.total:
            self.trainer.should_stop = True

    def _begin_stage(self, index: int) -> None:
        stage = self.schedule.stages[index]
        for agent in self.agents.values():
            agent.set_trainable(agent.name == stage.agent and stage.kind != "evaluate")
        trainable = [a for a in self.agents.values() if a.trainable]
        assert len(trainable) <= 1, "exactly one agent may train at a time"
        self._optimizer, self._scheduler, self._reference = None, None, None
        if trainable:
            agent = trainable[0]
            lr = stage.lr if stage.lr is not None else agent.lr
            self._optimizer = build_optimizer(agent, lr, self.weight_decay)
            self._scheduler = build_scheduler(self._optimizer, stage)
            if stage.kind == "grpo" and self.beta > 0:
                self._reference = kl_reference(agent)
        restored = self.restored_for(index)
        if restored is not None:
            if self._optimizer is not None and restored.get("optimizer"):
                self._optimizer.load_state_dict(restored["optimizer"])
            if self._scheduler is not None and restored.get("scheduler"):
                self._scheduler.load_state_dict(restored["scheduler"])
            if self._reference is not None and restored.get("reference"):
                self._reference.model.load_state_dict(restored["reference"])
        self._stage_index = index
        with_grad = {a.name for a in self.agents.values() if a.trainable_parameters()}
        assert len(with_grad) <= 1, f"several agents have gradients: {sorted(with_grad)}"
        if stage.harvest is not None:
            saved = None if restored is None else restored.get("replay")
            harvested = self.replay.begin(stage, index, self.tick, saved)
            if harvested is not None:
                self._emit({"harvest/items": float(harvested)})

    # --- GRPO ---------------------------------------------------------------------------------
    def grpo_step(self, stage: Stage, step: int) -> None:
        agent = self.agents[stage.agent]
        items = self.splits.item_indices(stage, self._stage_index or 0, step, self.rollout_batch_size // self.group_size)
        rank, _ = distributed.world()
        seed = self.seed * 1_000_003 + self.tick * 10_007 + rank * 101
        torch.manual_seed(seed)  # sampling repeats exactly, also after a resume
        batch = self.splits.driver("train", stage).run(items, self.group_size, seed=seed, sample_agents={agent.name})
        spans = batch.spans_of(agent.name)
        # advantages: group-normalised utilities per (group, kind) — READ Eq. 1 / LOOP Eq. 17
        advantages = normalize_by_type(
            [s.utility for s in spans], [s.kind for s in spans], [s.group for s in spans], self.eps_norm,
            std=self.advantage_std,
        )
        for span, advantage in zip(spans, advantages.tolist()):
            span.advantage = advantage
        stats = self.update(agent, spans)
        metrics = rollout_metrics(batch, spans, stats, agent.name)
        self.log("reward/total", metrics["reward/total"], prog_bar=True, logger=False)
        metrics.update({f"data/{split}/skipped_rows": float(n) for split, n in self.splits.skipped_rows.items()})
        metrics["stage"] = float(self._stage_index or 0)
        self._emit(metrics, mean_over_ranks=[k for k in metrics if k.startswith("reward/")])
        if step % max(self.sample_every, 1) == 0:  # the first step of every stage, then every N
            self.samples = sample_rows(batch, stage.name, self.tick, self.group_size)

    def update(self, agent: Agent, spans: Sequence[Span]) -> dict[str, float]:
        """``ppo_epochs`` passes of clipped updates over this rank's spans (global normalisation)."""
        sums: dict[str, float] = defaultdict(float)
        n_updates = 0
        rng = np.random.default_rng([self.seed, self.tick])
        for _ in range(self.ppo_epochs):
            order = rng.permutation(len(spans)).tolist()
            chunks = [order[i : i + self.minibatch_size] for i in range(0, len(order), self.minibatch_size)]
            for chunk in distributed.aligned(chunks, self.device):
                stats = self._policy_step(agent, [spans[i] for i in chunk])
                for k, v in stats.items():
                    sums[k] += v
                n_updates += 1
        return {k: v / max(n_updates, 1) for k, v in sums.items()}

    def _policy_step(self, agent: Agent, rows: Sequence[Span]) -> dict[str, float]:
        assert self._optimizer is not None
        local = float(sum(r.completion_ids.numel() for r in rows)) if self.loss_aggregation == "token" else float(len(rows))
        norm = distributed.global_sums([local], self.device)[0]
        stats: dict[str, float] = defaultdict(float)
        for micro in micro_batches(rows, self.micro_batch_size):  # weighted sums: they add up
            for k, v in self._policy_loss(agent, micro, norm).items():
                stats[k] += v
        stats["grad_norm"] = optimizer_step(agent, self._optimizer, self.max_grad_norm)
        return dict(stats)

    def _policy_loss(self, agent: Agent, rows: Sequence[Span], norm: float) -> dict[str, float]:
        """Forward and backward of the clipped objective on ``rows``, weighted by the step's ``norm``."""
        inputs = agent.encode([r.observation for r in rows])
        pad = agent.tokenizer.pad_token_id
        completion, mask = pad_right([r.completion_ids for r in rows], pad, self.device)
        old, _ = pad_right([r.old_logprobs for r in rows], 0, self.device)
        advantages = torch.tensor([r.advantage for r in rows], device=self.device)
        logprobs, entropy = agent.completion_logprobs(inputs, completion, mask, with_entropy=True)
        ref = None if self._reference is None else self._reference.completion_logprobs(agent, inputs, completion, mask)
        weights = token_weights(mask, normalizer=norm, mode=self.loss_aggregation, dtype=logprobs.dtype)
        out = clipped_objective(
            logprobs, old.to(logprobs.dtype), advantages, mask, self.clip_eps, self.clip_eps_high,
            self.beta, ref, weights,
        )
        self.manual_backward(out["loss"])
        stats = {k: float(v.detach()) for k, v in out.items()}
        stats["entropy"] = float((entropy.detach() * weights).sum())
        return stats

    # --- SFT ----------------------------------------------------------------------------------
    def sft_step(self, stage: Stage, step: int) -> None:
        """One supervised step on the environment's demonstrations for the stage's agent."""
        agent = self.agents[stage.agent]
        env = self.splits.driver("train", stage).scorer.unwrapped
        world = distributed.world()[1]
        demos: list[tuple[dict[str, Any], str]] = []
        for index in self.splits.item_indices(stage, self._stage_index or 0, step, self.sft_batch_size * world):
            demos.extend((o, a) for o, a in env.demonstrations(env.items[index]) if o["agent"] == agent.name)
        if not demos:
            raise ValueError(f"stage {stage.name!r}: the environment gives no demonstrations for {agent.name!r}")
        targets = agent.encode_completions([a for _, a in demos])
        norm = distributed.global_sums([float(sum(t.numel() for t in targets))], self.device)[0]
        loss_sum = 0.0
        for micro in micro_batches(list(zip(demos, targets)), self.micro_batch_size):
            completion, mask = pad_right([t for _, t in micro], agent.tokenizer.pad_token_id, self.device)
            inputs = agent.encode([o for (o, _), _ in micro])
            logprobs = agent.completion_logprobs(inputs, completion, mask, temperature=1.0)
            loss = -(logprobs * token_weights(mask, normalizer=norm, dtype=logprobs.dtype)).sum()  # token-mean NLL
            self.manual_backward(loss)
            loss_sum += float(loss.detach())
        optimizer_step(agent, self._optimizer, self.max_grad_norm)
        value = loss_sum * world  # this rank's share of the global token mean, rescaled
        self.log(f"loss/{agent.name}/sft", value, prog_bar=True, logger=False)
        self._emit({f"loss/{agent.name}/sft": value, "stage": float(self._stage_index or 0)})

    def _emit(self, metrics: dict[str, float], mean_over_ranks: Sequence[str] = ()) -> None:
        emit(self.loggers, metrics, self.tick, mean_over_ranks)
