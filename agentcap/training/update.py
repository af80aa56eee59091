"""The GRPO update of one rollout batch: what ``GRPOModule.update`` runs, and nothing else does.

``update`` takes the trainable agent's spans (each with its advantage, from ``set_advantages``),
draws ``ppo_epochs`` × global minibatches over every rank's spans, and per minibatch runs
``policy_step``: the micro-batches' forward and backward of the clipped objective
(``algorithms.grpo``) under the minibatch's *global* normaliser, then ``training.optim.optimizer_step``
(gradient sum over ranks, non-finite checks, clipping, AdamW, weight norm, the sampler's sync).

It lives outside the Lightning module so that the benchmarks, the prepared GPU check and the tests
call this very code (``agentcap.training.harness`` runs it outside a Trainer); it imports no
environment code, so it loads where only torch, transformers and Lightning are installed.
``backward`` is the module's ``manual_backward`` in training (Lightning's precision plugin and
strategy), a plain ``loss.backward()`` outside a Trainer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agentcap.agents.agent import Agent
from agentcap.agents.tokens import pad_right
from agentcap.algorithms.grpo import clipped_objective, kl_k3, token_weights
from agentcap.algorithms.loop import AdvantageStd, group_scales, normalize_by_type
from agentcap.algorithms.offpolicy import sampler_gap, truncated_importance_weights
from agentcap.parallel import distributed
from agentcap.training.old_policy import fill_old_logprobs, old_or_current
from agentcap.training.optim import aligned_micro_batches, optimizer_step

__all__ = ["UpdateSettings", "policy_loss", "policy_step", "set_advantages", "update"]


@dataclass(frozen=True)
class UpdateSettings:
    """The update's share of ``GRPOModule``'s settings (same names, same defaults; see its Args)."""

    minibatch_size: int = 16
    micro_batch_size: int | None = None
    ppo_epochs: int = 1
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    loss_aggregation: Literal["token", "sequence"] = "token"
    max_grad_norm: float = 1.0
    tis_cap: float | None = None
    seed: int = 0


def set_advantages(spans: Sequence[Any], eps_norm: float, std: AdvantageStd) -> None:
    """Each span's advantage: its utility normalised within its (group, kind), READ Eq. 1 / LOOP Eq. 17.

    Spans whose text the environment credited piece by piece (``Span.pieces``) also get per-token
    advantages: the span's advantage redistributed over its pieces. A piece's utility is its share, a
    difference against the caption without it (``Score.text_credit``); a token gets its span's
    advantage plus its piece's share minus the mean share of the span's pieces, divided by what the
    span's advantage is divided by (the (group, kind)'s sigma + eps, so both are in the caption's
    units). The pieces of one caption average to its own advantage (piece by piece, not token by
    token): the group pushes its captions up and down as plain GRPO does, and only which sentences
    carry the push changes; a group whose captions tie gives no signal. (Two earlier designs, shares
    centred over the group alone, then shares not centred beside the caption's advantage, taught
    captions to drop events; the second's mostly positive shares made its losses tens of times
    caption credit's; docs/real.md.)"""
    utilities, kinds, groups = [s.utility for s in spans], [s.kind for s in spans], [s.group for s in spans]
    advantages = normalize_by_type(utilities, kinds, groups, eps_norm, std=std)
    scales = group_scales(utilities, kinds, groups, eps_norm, std=std).tolist()
    for span, advantage, scale in zip(spans, advantages.tolist(), scales):
        span.advantage = advantage
        span.token_advantages = None
        if getattr(span, "pieces", None) is None:
            continue
        shares = span.piece_utilities
        mean = sum(shares) / len(shares)
        own = [advantage + ((share - mean) / scale if scale > 0 else 0.0) for share in shares]
        span.token_advantages = [own[k] for k in span.pieces]


def _advantages(rows: Sequence[Any], length: int, device: torch.device) -> torch.Tensor:
    """[N] when every row has one advantage; [N, T] when a row has per-token ones (padded with 0)."""
    if all(getattr(r, "token_advantages", None) is None for r in rows):
        return torch.tensor([r.advantage for r in rows], device=device)
    out = torch.zeros(len(rows), length, dtype=torch.float64)
    for i, r in enumerate(rows):
        own = getattr(r, "token_advantages", None)
        if own is None:
            out[i] = r.advantage
        else:
            out[i, : len(own)] = torch.tensor(own, dtype=torch.float64)
    return out.to(device)


def update(
    agent: Agent,
    spans: Sequence[Any],
    keys: Sequence[tuple[int, int]],
    settings: UpdateSettings,
    optimizer: torch.optim.Optimizer,
    *,
    tick: int,
    device: torch.device,
    reference: Any = None,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    where: str = "",
) -> dict[str, float]:
    """``ppo_epochs`` passes of clipped updates; each minibatch is drawn over every rank's spans
    (``keys`` name this rank's globally; ``tick`` seeds the order) and its loss normalised globally.
    Returns the mean of each minibatch's figures."""
    sums: dict[str, float] = defaultdict(float)
    n_updates = 0
    epochs = [
        distributed.global_minibatches(keys, settings.minibatch_size, seed=(settings.seed, tick, epoch))
        for epoch in range(settings.ppo_epochs)
    ]
    # off-policy steps need old log-probs; the first minibatch is on-policy (agentcap.training.old_policy)
    fill_old_logprobs(agent, spans, set(epochs[0][0]) if epochs and epochs[0] else set(), settings.minibatch_size)
    for chunks in epochs:
        for chunk in chunks:
            stats = policy_step(agent, [spans[i] for i in chunk], settings, optimizer, device=device,
                                reference=reference, backward=backward, where=where, stand_in=spans[:1])
            for k, v in stats.items():
                sums[k] += v
            n_updates += 1
    return {k: v / max(n_updates, 1) for k, v in sums.items()}


def policy_step(
    agent: Agent,
    rows: Sequence[Any],
    settings: UpdateSettings,
    optimizer: torch.optim.Optimizer,
    *,
    device: torch.device,
    reference: Any = None,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    where: str = "",
    stand_in: Sequence[Any] = (),
) -> dict[str, float]:
    """One optimiser step on a minibatch: its micro-batches' gradients add up under the global normaliser."""
    local = float(sum(int(agent.trained_tokens(r.completion_ids).sum()) for r in rows)) \
        if settings.loss_aggregation == "token" else float(len(rows))
    norm = distributed.global_sums([local], device)[0]
    stats: dict[str, float] = defaultdict(float)
    # weighted sums: they add up (a sharded rank short of passes runs stand-ins at scale 0)
    for micro, scale in aligned_micro_batches(agent, rows, settings.micro_batch_size, stand_in):
        for k, v in policy_loss(agent, micro, norm, settings, device=device, reference=reference,
                                backward=backward, scale=scale).items():
            stats[k] = max(stats[k], v) if k == "sampler_gap_max" else stats[k] + v
    stats["grad_norm"] = optimizer_step(agent, optimizer, settings.max_grad_norm, where, stats.get("loss"))
    return dict(stats)


def policy_loss(
    agent: Agent,
    rows: Sequence[Any],
    norm: float,
    settings: UpdateSettings,
    *,
    device: torch.device,
    reference: Any = None,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    scale: float = 1.0,
) -> dict[str, float]:
    """Forward and backward of the clipped objective on ``rows``, weighted by the step's ``norm``
    (``scale`` 0: a sharded rank's stand-in pass, which contributes nothing)."""
    inputs = agent.encode([r.observation for r in rows])
    pad = agent.tokenizer.pad_token_id
    completion, mask = pad_right([r.completion_ids for r in rows], pad, device)
    advantages = _advantages(rows, completion.shape[1], device)
    # the reference pass first: a LoRA stage-start reference swaps the adapter in place (agents.reference)
    ref = None if reference is None else reference.completion_logprobs(agent, inputs, completion, mask)
    logprobs, entropy = agent.completion_logprobs(inputs, completion, mask, with_entropy=True)
    old = old_or_current(rows, logprobs)
    trained = mask * agent.trained_tokens(completion).to(mask.dtype)  # greedy numbers are not π's draws
    weights = token_weights(trained, normalizer=norm, mode=settings.loss_aggregation, dtype=logprobs.dtype) * scale
    sampler, _ = pad_right([r.old_logprobs if r.sampler_logprobs is None else r.sampler_logprobs for r in rows],
                           0, device)
    tis = None if settings.tis_cap is None else truncated_importance_weights(old, sampler, mask, settings.tis_cap)
    out = clipped_objective(
        logprobs, old, advantages, trained, settings.clip_eps, settings.clip_eps_high, settings.beta, ref, weights,
        importance_weights=tis,
    )
    loss = out["loss"]
    if agent.number_beta > 0 and ref is not None:  # the greedy numbers: no policy term, their own KL
        numbers = mask - trained  # the response tokens the policy term left out
        on = token_weights(trained, normalizer=norm, mode=settings.loss_aggregation, dtype=logprobs.dtype,
                           on=numbers) * scale
        out["number_kl"] = (kl_k3(logprobs, ref.detach(), numbers.bool()) * on).sum()
        out["loss"] = loss = loss + agent.number_beta * out["number_kl"]
    backward(loss)
    if not scale:
        return {}
    stats = {k: float(v.detach()) for k, v in out.items()}
    gap = sampler_gap(old, sampler, trained)  # mean: token-weighted over micro-batches, like the loss terms
    stats["sampler_gap_mean"] = gap["sampler_gap_mean"] * float(trained.sum()) / max(norm, 1.0) \
        if settings.loss_aggregation == "token" else gap["sampler_gap_mean"] * len(rows) / max(norm, 1.0)
    stats["sampler_gap_max"] = gap["sampler_gap_max"]
    stats["entropy"] = float((entropy.detach() * weights).sum())
    return stats
