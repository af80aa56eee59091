"""The frozen causal-LM judge every LLM judge builds on: prompts, batching, passes kept in step.

Every pass goes through one method, so that a judge sharded over processes (``judges.pool``) runs
the same number of collective passes on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from agentcap.agents.literal import literal
from agentcap.parallel.distributed import world
from agentcap.parallel.lockstep import FORWARD, GENERATE, announce_pass, stand_in_passes
from agentcap.parallel.sharding import is_sharded


def collective_call(method):
    """A judge call that every process makes together when the judge is sharded: afterwards a
    process runs stand-in passes while any other still has passes of its own
    (:func:`agentcap.parallel.lockstep.stand_in_passes`)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        if self.sharded:
            stand_in_passes(self._stand_in_forward, self._stand_in_generate)
        return out

    return call


class CausalLMJudge:
    """A frozen causal LM that reads prompts: chat template when the tokenizer has one, plain text
    otherwise; left padding with explicit position ids, so a batched row equals the row alone.

    Every pass goes through :meth:`forward` or :meth:`generate_ids`, so that a sharded judge
    (:mod:`agentcap.judges.pool`) can keep the processes' passes in step."""

    def __init__(self, model, tokenizer, batch_size: int = 32):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def sharded(self) -> bool:
        """True when the model is sharded over several processes: each public call is then a collective."""
        return world()[1] > 1 and is_sharded(self.model)

    def forward(self, **inputs):
        if self.sharded:
            announce_pass(FORWARD)
        return self.model(**inputs)

    def generate_ids(self, **inputs) -> torch.Tensor:
        if self.sharded:
            announce_pass(GENERATE)
        return self.model.generate(**inputs, synced_gpus=self.sharded)

    def _stand_in_forward(self) -> None:
        self.model(input_ids=torch.tensor([[self.pad_id]], device=self.device))

    def _stand_in_generate(self) -> None:
        one = torch.tensor([[self.pad_id]], device=self.device)
        self.model.generate(input_ids=one, attention_mask=torch.ones_like(one), max_new_tokens=1, do_sample=False,
                            pad_token_id=self.pad_id, synced_gpus=True)

    def render(self, user_text: str, answer_cue: str = "Answer:") -> str:
        """The full prompt; the model's next token starts the answer. ``user_text`` is data: its
        special-token strings stay literal (``agentcap.agents.literal``)."""
        user_text = literal(user_text, self.tokenizer)
        if self.chat:
            messages = [{"role": "user", "content": user_text}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{user_text}\n{answer_cue}"

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        # A chat template writes its own special tokens; a plain prompt gets the tokenizer's (BOS).
        return [self.tokenizer(p, add_special_tokens=not self.chat).input_ids for p in prompts]

    def batch_tensors(self, ids: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, x in enumerate(ids):
            input_ids[row, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[row, width - len(x) :] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    def batches(self, ids: Sequence[Sequence[int]]):
        """Index groups of at most ``batch_size``, similar lengths together (less padding)."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), self.batch_size):
            yield order[start : start + self.batch_size]

    @torch.inference_mode()
    @collective_call
    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations (new text only), batched."""
        ids = self.encode(prompts)
        out: list[str] = [""] * len(prompts)
        # stop at the model's end of turn and at the tokenizer's EOS; they can differ (SmolLM2's GGUF
        # tokenizer calls <|im_start|> its EOS while the model ends turns with <|im_end|>)
        stops = self.model.generation_config.eos_token_id
        stops = [stops] if isinstance(stops, int) else list(stops or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in stops:
            stops.append(self.tokenizer.eos_token_id)
        for group in self.batches(ids):
            batch = self.batch_tensors([ids[i] for i in group])
            new = self.generate_ids(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=self.pad_id,
                eos_token_id=stops or None,
            )[:, batch["input_ids"].shape[1] :]
            texts = self.tokenizer.batch_decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            for row, i in enumerate(group):
                out[i] = texts[row]
        return out
