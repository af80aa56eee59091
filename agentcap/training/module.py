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
3. Data parallel (``agentcap.parallel.distributed``): batch sizes are global; items are sharded over ranks,
   so every GRPO group lives on one rank and group statistics need no communication; sampling
   seeds and minibatches follow global positions, so N processes reproduce one. Loss weights are
   normalised by the *global* token count and gradients are summed across ranks explicitly
   (``GRPODDPStrategy`` does not wrap the module in DDP, whose reducer cannot follow the trainable
   agent changing between stages); under ``grpo_fsdp`` every agent is sharded on its own
   (``agentcap.parallel.sharding``) and FSDP2 sums the gradients in backward.
4. A stage's KL reference is a frozen copy of the trainable agent taken when the stage begins,
   or for a LoRA agent the same model with its adapters disabled; β = 0 skips it entirely.
5. Memory and precision (``optim``, ``agents.adapters``): a per-stage lr schedule, micro-batches
   that add up to one optimiser step, fp32 trained parameters (bf16 compute comes from
   Lightning's ``bf16-mixed`` autocast, which wraps every training step: rollout and update).

The rooms it calls: ``rollout.splits`` (environments, drivers, item order), ``rollout.replay``
(harvested Instruct items), ``rollout.pipeline`` (rollouts sampled ahead of the update,
``max_staleness``), ``training.update`` (the clipped update of a rollout batch: Eq. 18-21 through
``algorithms.grpo``), ``training.optim`` (the trainable agent's optimiser), ``agents.reference`` (π_ref),
``training.logs`` (global metrics, samples), ``parallel`` (ranks);
its evaluation hooks (``training.evaluation_hooks``) and checkpoint hooks (``training.checkpoint_hooks``)
live beside it.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from agentcap.agents.agent import Agent, AgentConfig, build_agents
from agentcap.agents.reference import kl_reference
from agentcap.agents.tokens import pad_right
from agentcap.algorithms.grpo import token_weights
from agentcap.algorithms.loop import AdvantageStd
from agentcap.algorithms.offpolicy import effective_tis_cap
from agentcap.core.bounds import check_batch
from agentcap.core.schedule import Schedule, Stage
from agentcap.core.settings import ConfigError, check
from agentcap.evaluation.benchmark import BenchmarkConfig
from agentcap.evaluation.tasks import reference_field
from agentcap.judges.pool import shard_judges
from agentcap.judges.replies import invalid_count
from agentcap.parallel import distributed
from agentcap.parallel.sharding import is_sharded, load_optimizer_state, mixed_precision, shard_agents
from agentcap.resume import entries
from agentcap.resume.checkpoints import TickCheckpoint
from agentcap.rollout.driver import RolloutBatch, Span
from agentcap.rollout.pipeline import RolloutPipeline
from agentcap.rollout.replay import Replay
from agentcap.rollout.splits import EnvConfig, Splits
from agentcap.training import engines
from agentcap.training.callbacks import EvaluationStops, LogLines, ResultsTable, SampleTable, SpreadWatch, TickStep
from agentcap.training.checkpoint_hooks import CheckpointHooks
from agentcap.training.evaluation_hooks import EvaluationHooks
from agentcap.training.logs import StepClock, emit, rollout_metrics, sample_rows, update_metrics
from agentcap.training.old_policy import fill_old_logprobs_together
from agentcap.training.optim import (
    aligned_micro_batches,
    build_optimizer,
    build_scheduler,
    check_trainable_precision,
    optimizer_step,
    show_to_lightning,
)
from agentcap.training.update import UpdateSettings, set_advantages, update

__all__ = ["EnvConfig", "GRPOModule"]

#: The allowed values of GRPOModule's numeric arguments (an optional one left at None is not checked).
#: clip_eps < 1: the ratio's lower clip 1 − ε must stay positive; seed ≥ 0: numpy's SeedSequence.
SETTINGS = {
    "group_size": "≥ 1", "rollout_batch_size": "≥ 1", "minibatch_size": "≥ 1", "micro_batch_size": "≥ 1",
    "ppo_epochs": "≥ 1", "clip_eps": "in (0, 1)", "clip_eps_high": "> 0", "beta": "≥ 0", "eps_norm": "> 0",
    "sft_batch_size": "≥ 1", "max_grad_norm": "> 0", "weight_decay": "≥ 0", "eval_limit": "≥ 1",
    "generation_batch_size": "≥ 1", "sample_every": "≥ 1", "seed": "≥ 0", "tis_cap": "> 0",
    "max_staleness": "≥ 0",
}


class _Ticks(IterableDataset):
    """Yields the schedule ticks still to run; the module reads its own tick, not the batch."""

    def __init__(self, module: "GRPOModule"):
        self.module = module

    def __iter__(self):
        return iter(range(self.module.tick, self.module.schedule.total))

    def __len__(self) -> int:
        return self.module.schedule.total - self.module.tick


class GRPOModule(EvaluationHooks, CheckpointHooks, L.LightningModule):
    """Trains the agents of one environment through a schedule of stages (see module docstring).

    Args:
        env: the environment and its splits.
        agents: role name → how to build that agent.
        stages: the schedule, run in order.
        group_size: G, rollouts per item.
        rollout_batch_size: trajectories per GRPO step over all ranks (B × G).
        minibatch_size: spans per optimiser step, over all ranks.
        micro_batch_size: spans (SFT: demonstrations) per forward/backward pass; their gradients
            add up to the same optimiser step (None: the whole minibatch in one pass).
        ppo_epochs: passes over each rollout batch.
        clip_eps: ε of the clipped ratio (lower side; also the upper side unless clip_eps_high).
        clip_eps_high: upper clip ε, for asymmetric clipping.
        beta: KL coefficient; 0 skips the reference model.
        kl_reference: a LoRA agent's π_ref: ``base`` (adapters off) or ``stage_start`` (its adapter as
            the GRPO stage began, as a full fine-tune's always is; ``agents.reference``).
        eps_norm: ε in the group normalisation of utilities (LOOP Eq. 17).
        advantage_std: ``population`` (ours, documented in ``algorithms.loop``), ``unbiased``
            (TRL's; with ``eps_norm: 1e-4`` it matches TRL's advantages) or ``none`` (no division:
            Dr. GRPO, TRL's ``scale_rewards="none"``).
        loss_aggregation: ``token`` (mean over all tokens, LOOP Eq. 21) or ``sequence`` (mean of
            per-response means, AudioMap Eq. 1).
        sft_batch_size: training items per SFT step, over all ranks (each gives its demonstrations).
        max_grad_norm: gradient clipping.
        weight_decay: AdamW weight decay.
        eval_limit: evaluate on at most this many held-out items (None: all).
        eval_metrics: ``rewards`` (each evaluation reports the reward means) or ``papers`` (also the
            papers' metrics: BLEU-1…4, METEOR, ROUGE-L, CIDEr-D, BERTScore, R@k/N, LogP/PPL,
            question accuracy, tIoU; needs ``agentcap[eval]``, METEOR needs Java).
        generation_batch_size: observations per generate call.
        sample_every: GRPO steps between sample tables (the first step of a stage always logs one).
        run_dir: where ``summary.json`` and checkpoints go.
        seed: seeds sampling (per trajectory, from its global position) and the order of items.
        tis_cap: truncated importance sampling between a vLLM sampler and the learner: each
            token's surrogate is weighted by min(π_old / π_sampler, tis_cap); None (default) is off,
            except with ``max_staleness`` ≥ 1, where it is ``offpolicy.STALE_TIS_CAP``.
        max_staleness: K, rollouts sampled ahead of the update: step s samples with the weights of
            step max(0, s − K) while earlier steps update (``agentcap.rollout.pipeline``,
            ``docs/async.md``); 0 (default) samples each step with its own weights.
        benchmark: every greedy ``evaluate`` stage also reports caption-as-evidence accuracy on this
            benchmark (``{path, judge}``; ``agentcap.training.evaluation_hooks.stage_benchmark``).
    """

    def __init__(
        self,
        env: EnvConfig,
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
        kl_reference: Literal["base", "stage_start"] = "base",
        eps_norm: float = 1e-6,
        advantage_std: AdvantageStd = "population",
        loss_aggregation: Literal["token", "sequence"] = "token",
        sft_batch_size: int = 16,
        max_grad_norm: float = 1.0,
        weight_decay: float = 0.0,
        eval_limit: int | None = None,
        eval_metrics: Literal["rewards", "papers"] = "rewards",
        generation_batch_size: int = 64,
        sample_every: int = 10,
        run_dir: str = "runs/agentcap",
        seed: int = 0,
        tis_cap: float | None = None,
        benchmark: BenchmarkConfig | None = None,
        max_staleness: int = 0,
    ):
        # every setting is checked before anything loads (ConfigError: `agentcap fit` prints one line)
        arguments = locals()
        for key, rule in SETTINGS.items():
            check(f"--model.{key}", arguments[key], rule)
        if rollout_batch_size % group_size:
            raise ConfigError(
                f"--model.group_size ({group_size}) must divide --model.rollout_batch_size ({rollout_batch_size})"
            )
        schedule = Schedule(stages, list(agents))
        for role, config in agents.items():
            config.check(role)
            if config.number_beta > 0 and beta == 0:
                raise ConfigError(f"--model.agents.{role}.number_beta ({config.number_beta!r}) needs --model.beta > 0: "
                                  f"the KL reference is built only then")
        # sizes against the host memory, before any environment or model is built (agentcap.core.bounds)
        tokens = max((config.max_new_tokens for config in agents.values()), default=1)
        kinds = {stage.kind for stage in schedule.stages}
        if "grpo" in kinds:
            check_batch({"--model.rollout_batch_size": rollout_batch_size}, rollout_batch_size, tokens)
        if "sft" in kinds:
            check_batch({"--model.sft_batch_size": sft_batch_size}, sft_batch_size, tokens, unit="items")
        RolloutPipeline.check(max_staleness, agents)
        check_trainable_precision(agents, stages)
        super().__init__()
        self.schedule = schedule
        self.automatic_optimization = False
        self.env_config = env
        texts = env.texts() if any(cfg.build_tokenizer_from for cfg in agents.values()) else []
        vocabulary = lambda name: os.path.join(run_dir, "tokenizers", f"{name}.json")  # noqa: E731  (kept by the run)
        self.agents = torch.nn.ModuleDict(build_agents(agents, texts, vocabulary))
        self.group_size, self.rollout_batch_size = group_size, rollout_batch_size
        self.minibatch_size, self.ppo_epochs = minibatch_size, ppo_epochs
        self.micro_batch_size = micro_batch_size
        self.clip_eps, self.clip_eps_high, self.beta, self.eps_norm = clip_eps, clip_eps_high, beta, eps_norm
        self.kl_reference = kl_reference
        self.advantage_std, self.loss_aggregation = advantage_std, loss_aggregation
        self.sft_batch_size, self.max_grad_norm, self.weight_decay = sft_batch_size, max_grad_norm, weight_decay
        self.eval_limit, self.eval_metrics, self.generation_batch_size = eval_limit, eval_metrics, generation_batch_size
        self.sample_every, self.run_dir, self.seed = sample_every, run_dir, seed
        self.tis_cap, self.benchmark = effective_tis_cap(tis_cap, max_staleness), benchmark
        self.max_staleness = max_staleness
        self.pipeline = RolloutPipeline(max_staleness)
        self.tick = 0
        self.summary: dict[str, dict[str, float]] = {}
        self.samples: list[dict[str, Any]] = []
        self.splits = Splits(env, self.agents, generation_batch_size, seed)
        self.replay = Replay(self.splits, seed)
        self._stage_index: int | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self._reference: Any = None
        self._mirrors: dict[str, Any] = {}  # sharded agents' frozen copies for their KL reference

    # --- Lightning plumbing -------------------------------------------------------------------
    def configure_model(self) -> None:
        """Under ``grpo_fsdp`` every agent is sharded on its own (``agentcap.parallel.sharding``)."""
        mesh = getattr(self, "_device_mesh", None)
        if mesh is not None:
            RolloutPipeline.check_sharded(self.max_staleness, self.agents)
            # full fine-tunes with a KL reference get a sharded frozen copy now (agents.reference)
            kl = {s.agent for s in self.schedule.stages if s.kind == "grpo"} if self.beta > 0 else set()
            mirrored = {name for name in kl if self.agents[name].adapters is None}
            if self.kl_reference == "stage_start" and kl - mirrored:
                raise ConfigError(f"--model.kl_reference stage_start is not supported under grpo_fsdp for the LoRA "
                                  f"agents {sorted(kl - mirrored)}: use --model.kl_reference base")
            mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
            policy = mixed_precision(self.trainer.precision)  # bf16-mixed: bf16 all-gathers and compute
            self._mirrors.update(shard_agents(self.agents, mesh, mirrored, policy))
            shard_judges(mesh)  # the environments' LLM judges, as they load (agentcap.judges.pool)
            if distributed.world()[0] == 0:
                compute = " (bf16 compute, fp32 masters)" if policy is not None else ""
                print(f"agentcap: sharded {', '.join(self.agents)} with FSDP2 over {mesh.size()} processes{compute}",
                      file=sys.stderr)

    def configure_optimizers(self):
        return None  # one AdamW per stage, built in `_begin_stage` and then shown to the trainer

    def configure_callbacks(self) -> list[L.Callback]:
        """What every fit needs, also under a plain ``L.Trainer(...).fit(module)``: Lightning's step
        kept at the tick, tick checkpoints (the trainer's own TickCheckpoint when it has one, e.g.
        the CLI's ``--checkpoint_every`` / ``--checkpoint_keep``), sample tables, EarlyStopping
        checked after each evaluate stage, a log line per logging step when stdout is not a terminal, a
        warning when a GRPO stage's groups have no spread, and the results table when the fit ends."""
        given = any(isinstance(c, TickCheckpoint) for c in self.trainer.callbacks)
        return [TickStep(), *([] if given else [TickCheckpoint()]), SampleTable(), EvaluationStops(), LogLines(),
                SpreadWatch(), ResultsTable()]

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A stage begins as its first tick arrives, before callbacks see the batch: at
        ``on_train_batch_start`` LearningRateMonitor already finds this stage's optimiser."""
        if self._trainer is not None and self.trainer.training:
            index, _ = self.schedule.locate(self.tick)
            if index != self._stage_index:
                self._begin_stage(index)
        return batch

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Ticks(self), batch_size=None)

    # `agentcap validate / test` evaluate a split once; `agentcap predict` captions the test split
    # (the hooks: ``agentcap.training.evaluation_hooks``).
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
            result = self.evaluate(stage)
            # the split's latest evaluation under one name: EarlyStopping(monitor="val/reward") compares them
            self.log_dict({f"{stage.split}/{k}": v for k, v in result.items()}, logger=False, batch_size=1)
        elif stage.kind == "sft":
            self.sft_step(stage, step)
        else:
            self.grpo_step(stage, step)
        if self._scheduler is not None:
            self._scheduler.step()  # one lr per stage step (see agentcap.training.optim)
        self.tick += 1
        if self.tick >= self.schedule.total:
            self.trainer.should_stop = True

    def _begin_stage(self, index: int) -> None:
        stage = self.schedule.stages[index]
        for agent in self.agents.values():
            agent.set_trainable(agent.name == stage.agent and stage.kind != "evaluate")
        trainable = [a for a in self.agents.values() if a.trainable]
        assert len(trainable) <= 1, "exactly one agent may train at a time"
        # the previous stage's rollouts in flight are dropped; a GRPO stage with K ≥ 1 gets a sampler copy
        acting = engines.acting_roles(stage, self.env_config, self.agents) if self.max_staleness and stage.kind == "grpo" else ()
        self.pipeline.begin(index, trainable[0] if stage.kind == "grpo" else None,
                            self.trainer.precision_plugin.train_step_context if self._trainer is not None else None,
                            acting=[self.agents[name] for name in sorted(acting)])
        self._optimizer, self._scheduler, self._reference = None, None, None
        if trainable:
            agent = trainable[0]
            lr = stage.lr if stage.lr is not None else agent.lr
            self._optimizer = build_optimizer(agent, lr, self.weight_decay)
            self._scheduler = build_scheduler(self._optimizer, stage)
            if stage.kind == "grpo" and self.beta > 0:
                self._reference = kl_reference(agent, self._mirrors.get(agent.name), self.kl_reference)
        restored = self.restored_for(index)
        if restored is not None:
            if self._optimizer is not None and restored.get(entries.OPTIMIZER):
                load_optimizer_state(trainable[0], self._optimizer, restored[entries.OPTIMIZER])
            if self._scheduler is not None and restored.get(entries.SCHEDULER):
                self._scheduler.load_state_dict(restored[entries.SCHEDULER])
            if self._reference is not None and restored.get(entries.REFERENCE):
                self._reference.load_state(restored[entries.REFERENCE])
        show_to_lightning(self._trainer, self._optimizer, self._scheduler, stage.agent)
        self._stage_index = index
        with_grad = {a.name for a in self.agents.values() if a.trainable_parameters()}
        assert len(with_grad) <= 1, f"several agents have gradients: {sorted(with_grad)}"
        if stage.harvest is not None:
            saved = None if restored is None else restored.get(entries.REPLAY)
            harvested = self.replay.begin(stage, index, self.tick, saved)
            if harvested is not None:
                self._emit({"harvest/items": float(harvested)})
        engines.begin_stage(self.agents, self.schedule.stages, index, self.env_config)  # unused vLLM engines sleep

    def _where(self) -> str:
        """The stage and tick, for a NaN / Inf error (``training.finite``)."""
        stage = self.schedule.stages[self._stage_index or 0]
        return f"stage {stage.name!r} ({stage.kind} of {stage.agent!r}), tick {self.tick}"

    def _trainable(self) -> Agent:
        return next(a for a in self.agents.values() if a.trainable)

    # --- GRPO ---------------------------------------------------------------------------------
    def grpo_step(self, stage: Stage, step: int) -> None:
        agent = self.agents[stage.agent]
        clock = StepClock(self.device)
        driver = self.splits.driver("train", stage)
        # R_step, sampled now; with max_staleness K ≥ 1 sampled in the background by θ_{step−K} (rollout.pipeline)
        start = self.tick - step
        batch, staleness = self.pipeline.take(step, stage.steps - 1, agent,
                                              lambda later: self._rollout(stage, later, start + later))
        if self._collective_free(agent):  # sampled by the rollout thread without talking to other ranks
            driver.score(batch)
            fill_old_logprobs_together(agent, batch.spans_of(agent.name), self.generation_batch_size)
        clock.mark("rollout")
        spans = batch.spans_of(agent.name)
        set_advantages(spans, self.eps_norm, self.advantage_std)  # READ Eq. 1 / LOOP Eq. 17, per (group, kind)
        stats = self.update(agent, spans, [(batch.trajectory_ids[s.trajectory], s.action_index) for s in spans])
        clock.mark("update")
        metrics = {**rollout_metrics(batch, spans, agent.name, self.group_size, self.agents),
                   **update_metrics(stats, agent.name)}
        metrics.update(clock.metrics(sum(s.completion_ids.numel() for s in batch.spans)))
        self.log(f"reward/{agent.name}/total", metrics[f"reward/{agent.name}/total"], prog_bar=True, logger=False)
        metrics.update(self._skipped_rows())
        metrics.update(self._judge_invalid())
        metrics["stage"] = float(self._stage_index or 0)
        metrics[f"lr/{agent.name}"] = self._optimizer.param_groups[0]["lr"]  # this step's
        if self.max_staleness:
            metrics["async/staleness"] = float(staleness)
        self._emit(metrics)
        if step % max(self.sample_every, 1) == 0:  # the first step of every stage, then every N
            self.samples = sample_rows(batch, stage.name, self.tick, self.group_size,
                                       reference_field(driver.scorer.unwrapped))

    def _rollout(self, stage: Stage, step: int, tick: int) -> Callable[[Mapping[str, Agent] | None], RolloutBatch]:
        """The rollout of the stage's ``step`` (schedule ``tick``): its items and seed now, the sampling
        when called (``stand_ins``: a sampler copy acting for the trainable agent)."""
        agent = self.agents[stage.agent]
        groups = self.splits.item_indices(stage, self._stage_index or 0, step, self.rollout_batch_size // self.group_size)
        items, positions = distributed.share(groups, "groups")
        seed = self.seed * 1_000_003 + tick * 10_007  # per tick: sampling repeats exactly after a resume
        driver = self.splits.driver("train", stage)
        # old log-probs come lazily from the update (agentcap.training.old_policy), except for a sharded agent:
        # its forwards are collectives, and a lazy pass would run a different number on each rank; with
        # rollouts ahead of the update under grpo_fsdp the thread runs no collective (every agent samples
        # through its engine): grpo_step scores the episodes and takes those log-probs in this thread
        alone = self._collective_free(agent)
        return lambda stand_ins: driver.run(
            items, self.group_size, seed=seed, sample_agents={agent.name, *stage.sample_frozen}, positions=positions,
            old_logprobs=is_sharded(agent.model) and not alone, stand_ins=stand_ins, collectives=not alone,
        )

    def _collective_free(self, agent: Agent) -> bool:
        """Rollouts ahead of the update of a sharded agent: the rollout thread must not talk to other ranks."""
        return bool(self.max_staleness) and is_sharded(agent.model)

    def teardown(self, stage: str) -> None:
        self.pipeline.close()  # the rollout worker thread, if any

    def _skipped_rows(self) -> dict[str, float]:
        """``data/<split>/skipped_rows`` of the splits whose count is new or changed: logged once, not every step."""
        logged = self.__dict__.setdefault("_skipped_logged", {})
        new = {split: n for split, n in self.splits.skipped_rows.items() if logged.get(split) != n}
        logged.update(new)
        return {f"data/{split}/skipped_rows": float(n) for split, n in new.items()}

    def _judge_invalid(self) -> dict[str, float]:
        """``judge/invalid``: the judges' invalid replies so far (``agentcap.judges.replies``), logged when it grows."""
        count = invalid_count()
        if count == self.__dict__.get("_invalid_logged", 0):
            return {}
        self.__dict__["_invalid_logged"] = count
        return {"judge/invalid": float(count)}

    @property
    def update_settings(self) -> UpdateSettings:
        """The update's share of the settings, read from the module's own attributes at each step."""
        return UpdateSettings(self.minibatch_size, self.micro_batch_size, self.ppo_epochs, self.clip_eps,
                              self.clip_eps_high, self.beta, self.loss_aggregation, self.max_grad_norm, self.tis_cap,
                              self.seed)

    def update(self, agent: Agent, spans: Sequence[Span], keys: Sequence[tuple[int, int]]) -> dict[str, float]:
        """The clipped updates of one rollout batch (``agentcap.training.update``, also what the benchmarks,
        the GPU check and the tests run); ``keys`` name this rank's spans globally."""
        return update(agent, spans, keys, self.update_settings, self._optimizer, tick=self.tick, device=self.device,
                      reference=self._reference, backward=self.manual_backward, where=self._where())

    # --- SFT ----------------------------------------------------------------------------------
    def sft_step(self, stage: Stage, step: int) -> None:
        """One supervised step on the environment's demonstrations for the stage's agent."""
        agent = self.agents[stage.agent]
        env = self.splits.driver("train", stage).scorer.unwrapped
        demos: list[tuple[dict[str, Any], str]] = []
        items = self.splits.item_indices(stage, self._stage_index or 0, step, self.sft_batch_size)
        for index in distributed.share(items, "SFT items")[0]:
            demos.extend((o, a) for o, a in env.demonstrations(env.items[index]) if o["agent"] == agent.name)
        if not distributed.global_sums([float(len(demos))], self.device)[0]:
            # e.g. demo_questions "random" / "padded" drew no question for any item of the step: nothing
            # to teach this role, so no update (the next step draws other items); a stage that never
            # demonstrates the role warns every step
            if self.trainer.is_global_zero:
                warnings.warn(f"agentcap: SFT stage {stage.name!r} step {step}: its items demonstrate no "
                              f"{agent.name!r} turn; the step makes no update", UserWarning, stacklevel=2)
            self._emit({f"sft/{agent.name}/empty_steps": 1.0, "stage": float(self._stage_index or 0)})
            self._optimizer.step()  # no gradient: AdamW skips every parameter; the lr schedule still counts the step
            return
        # a process whose items demonstrate none while others' do adds zero gradients: unsharded it runs no
        # pass (the gradient sum counts its gradients as zeros), sharded it runs stand-in passes at scale 0
        rows = list(zip(demos, agent.encode_completions([a for _, a in demos]))) if demos else []
        stand_in = [] if demos or not is_sharded(agent.model) else self._sft_stand_in(env, agent)
        norm = distributed.global_sums([float(sum(t.numel() for _, t in rows))], self.device)[0]
        loss_sum = 0.0
        for micro, scale in aligned_micro_batches(agent, rows, self.micro_batch_size, stand_in):
            completion, mask = pad_right([t for _, t in micro], agent.tokenizer.pad_token_id, self.device)
            inputs = agent.encode([o for (o, _), _ in micro])
            logprobs = agent.completion_logprobs(inputs, completion, mask, temperature=1.0)
            weights = token_weights(mask, normalizer=norm, dtype=logprobs.dtype) * scale
            loss = -(logprobs * weights).sum()  # token-mean NLL
            self.manual_backward(loss)
            loss_sum += float(loss.detach())
        optimizer_step(agent, self._optimizer, self.max_grad_norm, self._where(), loss_sum)
        value = distributed.global_sums([loss_sum], self.device)[0]  # the ranks' shares of the global token mean
        self.log(f"loss/{agent.name}/sft", value, prog_bar=True, logger=False)
        self._emit({f"loss/{agent.name}/sft": value, "stage": float(self._stage_index or 0),
                    f"lr/{agent.name}": self._optimizer.param_groups[0]["lr"]})

    @staticmethod
    def _sft_stand_in(env: Any, agent: Agent) -> list[tuple[tuple[dict[str, Any], str], torch.Tensor]]:
        """The split's first demonstration of ``agent``'s turn: the input of a sharded process's
        zero-weight passes when its own items demonstrate none."""
        for item in env.items:
            for observation, action in env.demonstrations(item):
                if observation["agent"] == agent.name:
                    return [((observation, action), agent.encode_completions([action])[0])]
        raise ValueError(f"no item of the split demonstrates a {agent.name!r} turn")

    def _emit(self, metrics: dict[str, float]) -> None:
        """To every logger at the tick; ``self.logged`` keeps the tick's metrics for the log line."""
        emit(self.loggers, metrics, self.tick)
        if self.__dict__.get("_logged_tick") != self.tick:
            self.__dict__["logged"], self.__dict__["_logged_tick"] = {}, self.tick
        self.__dict__["logged"].update(metrics)
