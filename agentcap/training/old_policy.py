"""Old-policy log-probs, computed only when the update needs them.

The clipped ratio π_θ / π_old is exactly 1 on the first optimiser step of a rollout batch: the
parameters have not moved since sampling. So the first minibatch takes its old log-probs from
its own forward (``logprobs.detach()``) and a batch updated in one minibatch and one epoch (the
usual GRPO setting) needs no extra pass at all. Only when there are further minibatches or epochs
do the *other* spans get one no-grad pass, before the first step changes the weights. Old
log-probs a sampler already returned (a serving backend's) are kept as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentcap.agents.agent import Agent
from agentcap.agents.tokens import pad_right
from agentcap.parallel.distributed import most


@torch.no_grad()
def fill_old_logprobs(agent: Agent, spans: Sequence, skip: set[int], batch_size: int) -> int:
    """Give every span without ``old_logprobs`` (except the indices in ``skip``) the current
    policy's log-probs of its tokens; returns how many spans were scored."""
    todo = [i for i, s in enumerate(spans) if s.old_logprobs is None and i not in skip]
    pad = agent.tokenizer.pad_token_id
    for start in range(0, len(todo), max(batch_size, 1)):
        rows = [spans[i] for i in todo[start : start + batch_size]]
        completion, mask = pad_right([r.completion_ids for r in rows], pad, agent.family.device)
        logprobs = agent.completion_logprobs(agent.encode([r.observation for r in rows]), completion, mask)
        for r, lp, n in zip(rows, logprobs, mask.sum(1).tolist()):
            r.old_logprobs = lp[:n].cpu()
    return len(todo)


@torch.no_grad()
def fill_old_logprobs_together(agent: Agent, spans: Sequence, batch_size: int) -> int:
    """:func:`fill_old_logprobs` of every span, with as many forwards on every process as the one
    with most rows needs (a sharded agent's forward is a collective): a process with fewer runs
    stand-in passes of its sync probe (``backends.verify``). In the main thread, for rollouts a
    thread sampled through the agent's engine under ``grpo_fsdp`` (``rollout.pipeline``)."""
    todo = [s for s in spans if s.old_logprobs is None]
    size = max(batch_size, 1)
    own = -(-len(todo) // size)
    for index in range(most(own)):
        if index < own:
            fill_old_logprobs(agent, todo[index * size : (index + 1) * size], set(), size)
        else:
            probe = agent.backend.probe
            agent.completion_logprobs(probe.inputs, probe.completion, probe.mask)
    return len(todo)


def old_or_current(rows: Sequence, logprobs: torch.Tensor) -> torch.Tensor:
    """[N, T] old log-probs of ``rows``; rows still without them are on-policy (the first step of
    the batch): theirs are ``logprobs.detach()``, which are also stored for later epochs."""
    have = torch.tensor([r.old_logprobs is not None for r in rows], device=logprobs.device)
    if bool(have.all()):
        old, _ = pad_right([r.old_logprobs for r in rows], 0, logprobs.device)
        return old.to(logprobs.dtype)
    current = logprobs.detach()
    filled = [r.old_logprobs if r.old_logprobs is not None else torch.zeros(0) for r in rows]
    old, _ = pad_right(filled, 0, logprobs.device)
    old = torch.where(have[:, None], old.to(current.dtype), current)
    for r, row, keep in zip(rows, current, have.tolist()):
        if not keep:
            r.old_logprobs = row[: r.completion_ids.numel()].cpu()
    return old
