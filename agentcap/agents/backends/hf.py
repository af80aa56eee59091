"""The HF backend: the agent's own model samples through ``generate``; nothing to sync."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentcap.agents.generation import Generation
from agentcap.agents.sampling import RowSampler
from agentcap.agents.tokens import trim_after_eos
from agentcap.parallel.sharding import is_sharded, synced_generation


class HFBackend:
    """Sampling with HF ``generate`` on the learner's weights (sampler = learner)."""

    def __init__(self, agent):
        self.agent = agent

    def weights_changed(self) -> None:
        """Nothing to do: the sampler is the learner."""

    @torch.no_grad()
    def sample(
        self,
        observations: Sequence[dict[str, Any]],
        inputs: dict[str, Any],
        greedy: bool,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """With ``seeds`` (one per row) each row samples from its own generator
        (:class:`~agentcap.agents.sampling.RowSampler`), so its tokens do not depend on its batch or
        rank; without, from the global RNG. Repeated prompts (an item's G rollouts) are prefilled
        once when the agent's ``share_prompts`` is on (:mod:`agentcap.agents.prefix`)."""
        agent = self.agent
        if not greedy and seeds is None and agent.greedy_ids is not None:  # the number collapse is RowSampler's
            seeds = torch.randint(2**62, (len(observations),)).tolist()
        kwargs: dict[str, Any] = dict(
            max_new_tokens=agent.max_new_tokens,
            do_sample=not greedy and seeds is None,
            pad_token_id=agent.tokenizer.pad_token_id,
            eos_token_id=agent.eos_ids,
        )
        if synced_generation(agent.model):
            kwargs["synced_gpus"] = True  # sharded: every forward is a collective, keep stepping until all are done
        if not greedy and seeds is None:
            kwargs.update(temperature=agent.temperature, top_p=agent.top_p, top_k=0)
        elif not greedy:
            kwargs.update(logits_processor=[RowSampler(seeds, agent.temperature, agent.top_p, agent.greedy_ids)])
        if agent.share_prompts and not is_sharded(agent.model):  # FSDP2 unshards in forward / generate only
            cache = agent.family.prompt_cache(inputs)  # the G copies of a prompt prefilled once
            if cache is not None:
                kwargs["past_key_values"] = cache
        new = agent.family.generate(inputs, **kwargs)  # [N, T]
        completion, mask = trim_after_eos(new, agent.eos_ids, agent.tokenizer.pad_token_id)
        return [Generation(completion[i, : int(mask[i].sum())].cpu()) for i in range(completion.shape[0])]

    def sync(self) -> None:
        """The sampler is the learner's own model."""
