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
3. Data parallel: items are sharded over ranks, so every GRPO group lives on one rank and group
   statistics need no communication. Loss weights are normalised by the *global* token count and
   gradients are summed across ranks explicitly (``GRPODDPStrategy`` does not wrap the module in
   DDP, whose reducer cannot follow the trainable agent changing between stages).
4. A stage's KL reference is a frozen copy of the trainable agent taken when the stage begins;
   β = 0 skips it entirely.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset
from torchmetrics import MeanMetric

from agentcap.agents.agent import Agent, AgentConfig, build_agent, pad_right
from agentcap.algorithms.grpo import clipped_objective, token_weights
from agentcap.algorithms.loop import normalize_by_type
from agentcap.rollout import RolloutBatch, RolloutDriver, Span
from agentcap.schedule import Schedule, Stage


@dataclass
class EnvSpec:
    """Which registered environment to train on, and its keyword arguments per split.

    Args:
        id: a registered id (``agentcap envs`` lists them); ``module:Id`` imports ``module`` first.
        kwargs: keyword arguments common to every split.
        train: keyword arguments of the training split (typically ``manifest``).
        val: keyword arguments of the validation split.
        test: keyword arguments of the test split.
    """

    id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    val: dict[str, Any] = field(default_factory=dict)
    test: dict[str, Any] = field(default_factory=dict)

    def make(self, split: str, overrides: dict[str, Any] | None = None, **extra) -> gym.Env:
        kwargs = {**self.kwargs, **getattr(self, split), **(overrides or {}), **extra}
        return gym.make(self.id, **kwargs)


class _Ticks(IterableDataset):
    """Yields the schedule ticks still to run; the module reads its own tick, not the batch."""

    def __init__(self, module: "GRPOModule"):
        self.module = module

    def __iter__(self):
        return iter(range(self.module.tick, self.module.schedule.total))

    def __len__(self) -> int:
        return self.module.schedule.total - self.module.tick


class GRPOModule(L.LightningModule):
    """Trains the agents of one environment through a schedule of stages (see module docstring).

    Args:
        env: the environment and its splits.
        agents: role name → how to build that agent.
        stages: the schedule, run in order.
        group_size: G, rollouts per item.
        rollout_batch_size: trajectories per GRPO step over all ranks (B × G).
        minibatch_size: spans per optimiser step, per rank.
        ppo_epochs: passes over each rollout batch.
        clip_eps: ε of the clipped ratio (lower side; also the upper side unless clip_eps_high).
        clip_eps_high: upper clip ε, for asymmetric clipping.
        beta: KL coefficient; 0 skips the reference model.
        eps_norm: ε in the group normalisation of utilities (LOOP Eq. 17).
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
        ppo_epochs: int = 1,
        clip_eps: float = 0.2,
        clip_eps_high: float | None = None,
        beta: float = 0.0,
        eps_norm: float = 1e-6,
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
        self.automatic_optimization = False
        self.env_spec = env
        texts = self.env_texts() if any(cfg.build_tokenizer_from for cfg in agents.values()) else []
        self.agents = torch.nn.ModuleDict({name: build_agent(name, cfg, texts) for name, cfg in agents.items()})
        self.schedule = Schedule(stages, list(agents))
        self.group_size, self.rollout_batch_size = group_size, rollout_batch_size
        self.minibatch_size, self.ppo_epochs = minibatch_size, ppo_epochs
        self.clip_eps, self.clip_eps_high, self.beta, self.eps_norm = clip_eps, clip_eps_high, beta, eps_norm
        self.loss_aggregation = loss_aggregation
        self.sft_batch_size, self.max_grad_norm, self.weight_decay = sft_batch_size, max_grad_norm, weight_decay
        self.eval_limit, self.generation_batch_size = eval_limit, generation_batch_size
        self.sample_every, self.run_dir, self.seed = sample_every, run_dir, seed
        self.tick = 0
        self.summary: dict[str, dict[str, float]] = {}
        self.samples: list[dict[str, Any]] = []
        self._stage_index: int | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._reference: torch.nn.Module | None = None
        self._restored: dict[str, Any] | None = None
        self._drivers: dict[tuple, RolloutDriver] = {}
        self._replay: dict[str, list[dict[str, Any]]] = {}
        self.skipped_rows: dict[str, int] = {}

    def env_texts(self) -> list[str]:
        """Every prompt and demonstration of every split: the vocabulary of a word-level tokenizer."""
        texts: list[str] = []
        for split in ("train", "val", "test"):
            if not getattr(self.env_spec, split):
                continue
            env = self.env_spec.make(split).unwrapped
            for item in env.items:
                for observation, action in env.demonstrations(item):
                    texts.extend(m["content"] for m in observation["messages"])
                    texts.append(action)
        return texts

    # --- Lightning plumbing -------------------------------------------------------------------
    def configure_optimizers(self):
        return None  # one AdamW per stage, built in `_begin_stage`

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Ticks(self), batch_size=None)

    # `agentcap validate / test` evaluate a split once; `agentcap predict` captions the test split.
    def val_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=None)

    test_dataloader = predict_dataloader = val_dataloader

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.trainer.state.fn == "fit":
            return  # `fit` evaluates through the schedule's own evaluate stages
        self.evaluate(Stage(name="validate", kind="evaluate", split="val"))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.evaluate(Stage(name="test", kind="evaluate", split="test"))

    @torch.no_grad()
    def predict_step(self, batch: Any, batch_idx: int) -> list[dict[str, Any]]:
        """Captions of the test split (READ: recurrent), also written to ``<run_dir>/predictions.jsonl``."""
        stage = Stage(name="predict", kind="evaluate", split="test")
        driver = self.driver("test", stage)
        env = driver.scorer.unwrapped
        rank, world = self.world
        results = env.caption(driver, env.items if world == 1 else env.items[rank::world])
        os.makedirs(self.run_dir, exist_ok=True)
        with open(os.path.join(self.run_dir, f"predictions{'' if world == 1 else f'.rank{rank}'}.jsonl"), "w") as out:
            for row in results:
                out.write(json.dumps(row) + "\n")
        return results

    @property
    def world(self) -> tuple[int, int]:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["agentcap"] = {
            "tick": self.tick,
            "summary": self.summary,
            "stage_index": self._stage_index,
            "stages": [stage.name for stage in self.schedule.stages],
            "optimizer": None if self._optimizer is None else self._optimizer.state_dict(),
            "reference": None if self._reference is None else self._reference.state_dict(),
            "replay": self._replay_state(),
        }

    def _replay_state(self) -> str | None:
        """The active stage's harvested Instruct items, every rank's, as JSON (rank 0 writes the file).

        A resumed stage must replay the same prompts: harvesting again would roll out a partly
        trained Instruct at another tick and give other histories.
        """
        if self._stage_index is None:
            return None
        items = self._replay.get(self.schedule.stages[self._stage_index].name)
        if items is None:
            return None
        _, world = self.world
        gathered: list[Any] = [items]
        if world > 1:  # every rank checkpoints at the same tick, so the collective is matched
            gathered = [None] * world
            dist.all_gather_object(gathered, items)
        clean = [[{k: v for k, v in item.items() if not k.startswith("_questions")} for item in rank] for rank in gathered]
        return json.dumps(clean)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("agentcap")
        if state is None:
            return
        names = [stage.name for stage in self.schedule.stages]
        if state.get("stages", names) != names:
            raise ValueError(
                f"the checkpoint in {self.run_dir} was written by another schedule (stages {state['stages']}, "
                f"now {names}); resume with the same stages, or start a new --model.run_dir"
            )
        self.tick, self.summary = int(state["tick"]), dict(state["summary"])
        self._restored = state
        # progress is the tick; Lightning's own loop counters would end the resumed epoch early
        checkpoint.pop("loops", None)

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
        self.tick += 1
        if self.tick >= self.schedule.total:
            self.trainer.should_stop = True

    def _begin_stage(self, index: int) -> None:
        stage = self.schedule.stages[index]
        for agent in self.agents.values():
            agent.set_trainable(agent.name == stage.agent and stage.kind != "evaluate")
        trainable = [a for a in self.agents.values() if a.trainable]
        assert len(trainable) <= 1, "exactly one agent may train at a time"
        self._optimizer, self._reference = None, None
        if trainable:
            agent = trainable[0]
            params = [p for p in agent.parameters() if p.requires_grad]
            lr = stage.lr if stage.lr is not None else agent.lr
            self._optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=self.weight_decay)
            if stage.kind == "grpo" and self.beta > 0:
                self._reference = copy.deepcopy(agent.model).eval().requires_grad_(False)
        restored, self._restored = self._restored, None
        if restored is not None and restored.get("stage_index") == index:
            if self._optimizer is not None and restored.get("optimizer"):
                self._optimizer.load_state_dict(restored["optimizer"])
            if self._reference is not None and restored.get("reference"):
                self._reference.load_state_dict(restored["reference"])
        self._stage_index = index
        self._assert_one_trainable()
        if stage.harvest is not None:
            saved = restored.get("replay") if restored is not None and restored.get("stage_index") == index else None
            if saved:
                self._restore_replay(stage, json.loads(saved))
            else:
                self._harvest(stage)

    def _restore_replay(self, stage: Stage, ranks: list[list[dict[str, Any]]]) -> None:
        """This rank's share of a checkpointed harvest; re-split when the number of processes changed."""
        rank, world = self.world
        self._use_replay(stage, ranks[rank] if len(ranks) == world else [i for r in ranks for i in r][rank::world])
        if rank == 0:
            total = sum(len(r) for r in ranks)
            print(f"agentcap: {stage.name}: replaying the {total} Instruct items harvested before the checkpoint",
                  file=sys.stderr)

    @torch.no_grad()
    def _harvest(self, stage: Stage) -> None:
        """Roll out the harvest environment with every agent frozen; its episodes become the stage's items."""
        source = Stage(name=f"{stage.name}/harvest", kind="evaluate", env=dict(stage.harvest))
        driver = self.driver("train", source)
        n = len(driver.scorer.unwrapped.items)
        rng = np.random.default_rng([self.seed, self.schedule.stages.index(stage)])
        rank, world = self.world
        chosen = rng.permutation(n)[: stage.harvest_items].tolist()[rank::world]
        batch = driver.run(chosen, group_size=1, seed=self.seed + self.tick)
        items = driver.scorer.unwrapped.harvest(batch.episodes)
        if not items:
            raise RuntimeError(f"stage {stage.name!r}: the harvest produced no items (no questions asked?)")
        self._use_replay(stage, items)
        self._emit({"harvest/items": float(len(items))})

    def _use_replay(self, stage: Stage, items: list[dict[str, Any]]) -> None:
        """The stage's training items from now on; its cached driver (built on older items) is dropped."""
        self._replay[stage.name] = items
        self._drivers = {k: v for k, v in self._drivers.items() if k[0] != stage.name}

    def _assert_one_trainable(self) -> None:
        with_grad = {a.name for a in self.agents.values() if any(p.requires_grad for p in a.parameters())}
        assert len(with_grad) <= 1, f"several agents have gradients: {sorted(with_grad)}"

    # --- environments and items ---------------------------------------------------------------
    def driver(self, split: str, stage: Stage) -> RolloutDriver:
        replay = self._replay.get(stage.name) if split == "train" else None
        key = (stage.name if replay else split, json.dumps(stage.env, sort_keys=True, default=str))
        if key not in self._drivers:
            overrides = dict(stage.env)
            if replay:
                overrides.update(manifest=None, items=replay)
            self._drivers[key] = driver = RolloutDriver(
                lambda: self.env_spec.make(split, overrides, defer_scoring=True),
                self.agents,
                generation_batch_size=self.generation_batch_size,
            )
            skipped = driver.scorer.unwrapped.skipped.skipped
            if skipped and self.world[0] == 0:
                rank_zero_warn(f"{split}: skipped {len(skipped)} unusable rows:\n  " + "\n  ".join(skipped[:10]))
            self.skipped_rows[split] = len(skipped)
        return self._drivers[key]

    def eligible_items(self, stage: Stage) -> list[int]:
        """Indices of the training items this stage may draw (duration curriculum)."""
        items = self.driver("train", stage).scorer.unwrapped.items
        if stage.max_duration is None:
            return list(range(len(items)))
        chosen = [i for i, item in enumerate(items) if float(item.get("duration", 0.0)) <= stage.max_duration]
        if not chosen:
            raise ValueError(f"stage {stage.name!r}: no training item is at most max_duration={stage.max_duration}s")
        return chosen

    def item_indices(self, stage: Stage, step: int, per_step: int) -> list[int]:
        """This rank's share of the global batch of items for ``step`` (seeded, epoch-wise shuffle)."""
        pool = self.eligible_items(stage)
        n = len(pool)
        start = step * per_step
        order: list[int] = []
        epoch = start // n
        while len(order) < (start % n) + per_step:
            rng = np.random.default_rng([self.seed, self._stage_index or 0, epoch])
            order.extend(pool[i] for i in rng.permutation(n).tolist())
            epoch += 1
        chosen = order[start % n : start % n + per_step]
        rank, world = self.world
        return chosen[rank::world]

    # --- GRPO ---------------------------------------------------------------------------------
    def grpo_step(self, stage: Stage, step: int) -> None:
        agent = self.agents[stage.agent]
        items = self.item_indices(stage, step, self.rollout_batch_size // self.group_size)
        rank, _ = self.world
        seed = self.seed * 1_000_003 + self.tick * 10_007 + rank * 101
        torch.manual_seed(seed)  # sampling repeats exactly, also after a resume
        batch = self.driver("train", stage).run(items, self.group_size, seed=seed, sample_agents={agent.name})
        spans = batch.spans_of(agent.name)
        # advantages: group-normalised utilities per (group, kind) — READ Eq. 1 / LOOP Eq. 17
        advantages = normalize_by_type(
            [s.utility for s in spans], [s.kind for s in spans], [s.group for s in spans], self.eps_norm
        )
        for span, advantage in zip(spans, advantages.tolist()):
            span.advantage = advantage
        stats = self.update(agent, spans)
        self._log_rollout(stage, step, batch, spans, stats)

    def update(self, agent: Agent, spans: Sequence[Span]) -> dict[str, float]:
        """``ppo_epochs`` passes of clipped updates over this rank's spans (global normalisation)."""
        sums: dict[str, float] = defaultdict(float)
        n_updates = 0
        rng = np.random.default_rng([self.seed, self.tick])
        for _ in range(self.ppo_epochs):
            order = rng.permutation(len(spans)).tolist()
            chunks = [order[i : i + self.minibatch_size] for i in range(0, len(order), self.minibatch_size)]
            for chunk in self._aligned(chunks):
                rows = [spans[i] for i in chunk]
                stats = self._policy_step(agent, rows)
                for k, v in stats.items():
                    sums[k] += v
                n_updates += 1
        return {k: v / max(n_updates, 1) for k, v in sums.items()}

    def _aligned(self, chunks: list[list[int]]) -> list[list[int]]:
        """Every rank must take the same number of optimiser steps; short ranks step on nothing."""
        count = torch.tensor([len(chunks)], device=self.device)
        if self.world[1] > 1:
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return chunks + [[] for _ in range(int(count) - len(chunks))]

    def _policy_step(self, agent: Agent, rows: Sequence[Span]) -> dict[str, float]:
        assert self._optimizer is not None
        local_tokens = float(sum(r.completion_ids.numel() for r in rows))
        norm = self._global_sum(local_tokens if self.loss_aggregation == "token" else float(len(rows)))
        stats: dict[str, float] = {}
        if rows:
            inputs = agent.encode([r.observation for r in rows])
            pad = agent.tokenizer.pad_token_id
            completion, mask = pad_right([r.completion_ids for r in rows], pad, self.device)
            old, _ = pad_right([r.old_logprobs for r in rows], 0, self.device)
            advantages = torch.tensor([r.advantage for r in rows], device=self.device)
            logprobs, entropy = agent.completion_logprobs(inputs, completion, mask, with_entropy=True)
            ref = None
            if self._reference is not None:
                with torch.no_grad():
                    ref = self._reference_logprobs(agent, inputs, completion, mask)
            weights = token_weights(mask, normalizer=norm, mode=self.loss_aggregation)
            out = clipped_objective(
                logprobs, old.to(logprobs.dtype), advantages, mask, self.clip_eps, self.clip_eps_high,
                self.beta, ref, weights,
            )
            self.manual_backward(out["loss"])
            stats = {k: float(v.detach()) for k, v in out.items()}
            stats["entropy"] = float((entropy.detach() * weights).sum())
        self._sync_gradients(agent)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in agent.parameters() if p.requires_grad], self.max_grad_norm
        )
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        stats["grad_norm"] = float(grad_norm)
        return stats

    def _reference_logprobs(self, agent: Agent, inputs, completion, mask) -> torch.Tensor:
        live = agent.family.model
        agent.family.model = self._reference
        try:
            return agent.completion_logprobs(inputs, completion, mask)
        finally:
            agent.family.model = live

    def _global_sum(self, value: float) -> float:
        return self._global_sums([value])[0]

    def _global_sums(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over ranks, in one all-reduce."""
        if self.world[1] == 1:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def _sync_gradients(self, agent: Agent) -> None:
        """Sum gradients over ranks: the loss weights are already globally normalised."""
        if self.world[1] == 1:
            return
        for p in agent.parameters():
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)

    # --- SFT ----------------------------------------------------------------------------------
    def sft_step(self, stage: Stage, step: int) -> None:
        """One supervised step on the environment's demonstrations for the stage's agent."""
        agent = self.agents[stage.agent]
        env = self.driver("train", stage).scorer.unwrapped
        demos: list[tuple[dict[str, Any], str]] = []
        for index in self.item_indices(stage, step, self.sft_batch_size * self.world[1]):
            demos.extend((o, a) for o, a in env.demonstrations(env.items[index]) if o["agent"] == agent.name)
        if not demos:
            raise ValueError(f"stage {stage.name!r}: the environment gives no demonstrations for {agent.name!r}")
        targets = agent.encode_completions([a for _, a in demos])
        completion, mask = pad_right(targets, agent.tokenizer.pad_token_id, self.device)
        norm = self._global_sum(float(mask.sum()))
        inputs = agent.encode([o for o, _ in demos])
        logprobs = agent.completion_logprobs(inputs, completion, mask, temperature=1.0)
        loss = -(logprobs * token_weights(mask, normalizer=norm)).sum()  # token-mean NLL
        self.manual_backward(loss)
        self._sync_gradients(agent)
        torch.nn.utils.clip_grad_norm_([p for p in agent.parameters() if p.requires_grad], self.max_grad_norm)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach()) * self.world[1]  # this rank's share of the global token mean, rescaled
        self.log(f"loss/{agent.name}/sft", value, prog_bar=True, logger=False)
        self._emit({f"loss/{agent.name}/sft": value, "stage": float(self._stage_index or 0)})

    # --- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, stage: Stage) -> dict[str, float]:
        """Rollouts on a held-out split (greedy unless the stage says otherwise); every reward
        component averaged over all ranks."""
        driver = self.driver(stage.split, stage)
        n = len(driver.scorer.unwrapped.items)
        indices = list(range(n if self.eval_limit is None else min(n, self.eval_limit)))
        rank, world = self.world
        mine = indices[rank::world]
        metrics: dict[str, MeanMetric] = {}
        chunk = max(1, self.generation_batch_size)
        torch.manual_seed(self.seed + rank)
        for start in range(0, len(mine), chunk):
            batch = driver.run(mine[start : start + chunk], group_size=1, greedy=stage.greedy)
            for score in batch.scores:
                values = {"reward": score.reward, **score.components}
                values.update({k: v for k, v in score.extras.items() if isinstance(v, (int, float))})
                for k, v in values.items():
                    metrics.setdefault(k, MeanMetric().to(self.device)).update(float(v))
        names = sorted(metrics)
        if world > 1:  # every rank must know every name before the synced compute
            gathered: list[list[str]] = [None] * world  # type: ignore[list-item]
            dist.all_gather_object(gathered, names)
            names = sorted({k for part in gathered for k in part})
        result = {}
        for k in names:
            metric = metrics.setdefault(k, MeanMetric().to(self.device))
            result[k] = float(metric.compute()) if metric.update_called or world > 1 else float("nan")
        self.summary[stage.name] = result
        self._emit({f"eval/{stage.name}/{k}": v for k, v in result.items()})
        if rank == 0:
            self.write_summary()
        return result

    def write_summary(self) -> str:
        """``<run_dir>/summary.json``; `validate` / `test` add their entry to a training run's file."""
        os.makedirs(self.run_dir, exist_ok=True)
        path = os.path.join(self.run_dir, "summary.json")
        summary = dict(self.summary)
        if self._trainer is not None and self.trainer.state.fn in ("validate", "test") and os.path.isfile(path):
            with open(path) as handle:
                summary = {**json.load(handle), **summary}
        with open(path + ".tmp", "w") as handle:
            json.dump(summary, handle, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)
        return path

    # --- logging ------------------------------------------------------------------------------
    def _emit(self, metrics: dict[str, float], mean_over_ranks: Sequence[str] = ()) -> None:
        """Send this tick's metrics to every logger, at step = tick.

        Not ``self.log``: Lightning keeps a key's last value until the epoch ends, and a whole
        schedule is one epoch, so an earlier stage's metrics (the Captioner's SFT loss, the
        Composer's generate calls) would be logged again at every later step. Keys in
        ``mean_over_ranks`` are averaged over processes (every rank logs the same keys).
        """
        metrics = dict(metrics)
        rank, world = self.world
        if world > 1 and mean_over_ranks:
            keys = sorted(mean_over_ranks)
            metrics.update((k, total / world) for k, total in zip(keys, self._global_sums([metrics[k] for k in keys])))
        if rank == 0:
            for logger in self.loggers:
                logger.log_metrics(metrics, step=self.tick)

    def _log_rollout(
        self, stage: Stage, step: int, batch: RolloutBatch, spans: Sequence[Span], stats: dict[str, float]
    ) -> None:
        name = stage.agent
        components: dict[str, list[float]] = defaultdict(list)
        for score in batch.scores:
            components["total"].append(score.reward)
            for k, v in score.components.items():
                components[k].append(v)
        metrics = {f"reward/{k}": float(np.mean(values)) for k, values in components.items()}
        self.log("reward/total", metrics["reward/total"], prog_bar=True, logger=False)
        extras: dict[str, list[float]] = defaultdict(list)
        for score in batch.scores:
            for k, v in score.extras.items():
                if isinstance(v, (int, float)):
                    extras[k].append(float(v))
        for k, values in extras.items():  # e.g. questions per episode, forced-finalisation rate
            metrics[f"episode/{k}"] = float(np.nanmean(values))
        for k, v in stats.items():
            metrics[f"loss/{name}/{k}"] = float(v)
        if spans:
            metrics[f"rollout/{name}/response_length"] = float(np.mean([s.completion_ids.numel() for s in spans]))
        metrics["rollout/turns"] = float(np.mean(batch.turns))
        for agent, calls in batch.generate_calls.items():
            metrics[f"rollout/{agent}/generate_calls"] = float(calls)
        by_kind: dict[str, list[float]] = defaultdict(list)
        for s in spans:
            by_kind[s.kind].append(float(s.utility))
        for kind, values in by_kind.items():
            metrics[f"utility/{kind}/mean"] = float(np.mean(values))
            metrics[f"utility/{kind}/std"] = float(np.std(values))
        metrics["stage"] = float(self._stage_index or 0)
        for split, count in self.skipped_rows.items():
            metrics[f"data/{split}/skipped_rows"] = float(count)
        self._emit(metrics, mean_over_ranks=[k for k in metrics if k.startswith("reward/")])
        if step % max(self.sample_every, 1) == 0:  # the first step of every stage, then every N
            self.samples = [
                {
                    "tick": self.tick,
                    "stage": stage.name,
                    "agent": s.agent,
                    "kind": s.kind,
                    "prompt": s.observation["messages"][-1]["content"][-400:],
                    "response": s.text,
                    "utility": float(s.utility) if s.utility is not None else math.nan,
                    "advantage": float(s.advantage),
                    "reward": float(batch.scores[s.trajectory].reward),
                }
                for s in batch.spans
                if s.trajectory < self.group_size  # the first group: whole trajectories, every span
            ]
