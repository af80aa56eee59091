"""Cloze / MCQ examiners: a frozen judge that reads ONLY a caption and answers a question about it.

The evidence rewards (AudioMap ESR, Eq. 2–3; ACE-Cap G2P, Eq. 2–3) need one letter A–E per
(caption, question) pair. Every examiner is pairwise: caption i answers question i, so a reward
can flatten a whole batch of banks into one call.

- :class:`LLMExaminer` — any HF causal LM. By default it reads the next-token logits at the
  answer position restricted to the five letter ids, in one forward pass per batch: no free
  generation, hence no parsing failures, and the cost is one prompt encoding per question. Models
  too small to bind option text to its letter (135M-class) can use ``readout="options"`` instead,
  which scores each option's text in the passage — still forward passes only.
- :class:`~agentcap.judges.rule.RuleExaminer` — deterministic string matching, for the offline toy
  worlds only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import torch

from agentcap.agents.literal import literal
from agentcap.agents.pretrained import load_causal_lm
from agentcap.judges.causal_lm import CausalLMJudge, collective_call
from agentcap.judges.prefix import PrefixReader
from agentcap.judges.questions import BLANK, LETTERS, Question, check_pairs, distinct_pairs, unique

INSTRUCTION = (
    "Read the caption and answer the question using only what the caption says. "
    "Choose A, B, C or D only if the caption explicitly states or clearly entails that option; "
    "otherwise choose E (Not given). Reply with a single letter."
)


# --- the protocol --------------------------------------------------------------------------------
@runtime_checkable
class Examiner(Protocol):
    """Answers question i from caption i only; returns one letter "A".."E" per pair, or None where a
    served judge's reply was invalid (:mod:`agentcap.judges.replies`; the rewards leave it out)."""

    def answer(self, captions: Sequence[str], questions: Sequence[Question]) -> list[str | None]: ...


def letters_question(caption: str, question: Question) -> str:
    """The user turn of the letters readout: instruction, caption, question with options A–E."""
    return f"{INSTRUCTION}\n\nCaption: {caption}\n\nQuestion: {question.prompt_text()}"


_LETTER_IN_TEXT = re.compile(r"(?<![A-Za-z])([A-E])(?![A-Za-z])")


def parse_letter(text: str) -> str | None:
    """The first standalone capital A–E in a generated answer, or None."""
    match = _LETTER_IN_TEXT.search(text)
    return match.group(1) if match else None


# --- the LLM examiner -----------------------------------------------------------------------------
class LLMExaminer(CausalLMJudge):
    """A frozen causal LM answering cloze / MCQ items from a caption alone (AudioMap Eq. 2).

    Nothing but the caption and the question reaches the model (no audio, no gold caption), no
    text is generated, so there are no parsing failures, and identical (caption, question) pairs
    are scored once. Two readouts:

    ``readout="letters"`` (default; the paper's judge) — an instruction, the caption and the
    lettered options; the answer is the argmax of the next-token logits restricted to the ids of
    A–E. The prompts are read as a prefix tree (:mod:`agentcap.judges.prefix`): the shared
    instruction once, each distinct caption once, the sentence that several of its questions
    quote once, then only each question's own tokens on top of that KV cache
    (``share_prefix=False``: one full pass per prompt). Tokenizers differ on whether the answer is "A" or
    " A" (chat templates end in "\n" or a space, a plain prompt in "Answer:"); the ids used are
    those the tokenizer produces for the letter appended to a real prompt — the first token after
    the prompt's own ids — trying no gap first after whitespace and one space first otherwise, and
    keeping the first variant that leaves the prompt's ids intact and gives five distinct known ids.
    They are found once: every prompt ends in the same template tail.

    ``readout="options"`` (our addition, for small models) — letter-choice MCQ needs a judge that
    binds option text to its letter, which small LMs do at chance (SmolLM2-135M-Instruct: 25 % on
    rotated items whatever the caption says). This readout scores each option A–D by the
    log-likelihood of the passage continued with that option after "Caption: <caption>", minus the
    same with an empty caption (how much the caption supports the option); the best option wins if
    that gain is at least ``margin`` nats, otherwise the answer is E. An empty caption therefore
    always gets E. It costs four short rows per pair (the empty-caption rows are shared by every
    caption of a question), one forward pass per batch of rows.
    """

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 32,
        readout: Literal["letters", "options"] = "letters",
        margin: float = 2.0,
        share_prefix: bool = True,
    ):
        super().__init__(model, tokenizer, batch_size)
        self.share_prefix = share_prefix
        if readout not in ("letters", "options"):
            raise ValueError(f"readout must be 'letters' or 'options', got {readout!r}")
        self.readout = readout
        self.margin = margin
        self.letter_ids: list[int] | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        gguf_file: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        batch_size: int = 32,
        cache_dir: str | os.PathLike | None = None,
        readout: Literal["letters", "options"] = "letters",
        margin: float = 2.0,
    ) -> "LLMExaminer":
        model, tokenizer = load_causal_lm(path, gguf_file=gguf_file, device=device, dtype=dtype, cache_dir=cache_dir)
        return cls(model, tokenizer, batch_size=batch_size, readout=readout, margin=margin)

    def answer(self, captions: Sequence[str], questions: Sequence[Question]) -> list[str]:
        if self.readout == "letters":
            return [LETTERS[k] for k in self.letter_logits(captions, questions).argmax(dim=1).tolist()]
        gains = self.option_gains(captions, questions)
        best = gains.max(dim=1)
        return [LETTERS[k] if g >= self.margin else "E" for g, k in zip(best.values.tolist(), best.indices.tolist())]

    # --- letters -------------------------------------------------------------------------------
    def prompt(self, caption: str, question: Question) -> str:
        return self.render(letters_question(caption, question))

    def find_letter_ids(self, prompt: str) -> list[int]:
        base = self.encode([prompt])[0]
        unk = getattr(self.tokenizer, "unk_token_id", None)
        # after whitespace the letter follows directly; after "Answer:" it is the word " A"
        gaps = ("", " ") if prompt[-1:].isspace() else (" ", "")
        for gap in gaps:
            ids = []
            for letter in LETTERS:
                full = self.encode([prompt + gap + letter])[0]
                if len(full) <= len(base) or full[: len(base)] != base:
                    break
                ids.append(full[len(base)])
            if len(ids) == 5 and len(set(ids)) == 5 and unk not in ids:
                return ids
        raise ValueError(
            "cannot find five distinct token ids for the answer letters A–E after the prompt "
            f"(tokenizer {type(self.tokenizer).__name__}); the examiner needs them in the vocabulary"
        )

    @torch.inference_mode()
    @collective_call
    def letter_logits(self, captions: Sequence[str], questions: Sequence[Question]) -> torch.Tensor:
        """[N, 5] logits of A–E at the answer position for each pair (deduplicated internally)."""
        check_pairs(captions, questions, "questions")
        if not captions:
            return torch.zeros((0, 5))
        pairs, inverse = distinct_pairs(captions, questions)
        prompts = [self.prompt(*pair) for pair in pairs]
        if self.letter_ids is None:
            self.letter_ids = self.find_letter_ids(prompts[0])
        letter_ids = torch.tensor(self.letter_ids, device=self.device)
        ids = self.encode(prompts)
        if self.share_prefix:  # the instruction, each caption, each shared sentence: read once
            reader = PrefixReader(self.model, self.pad_id, self.batch_size, forward=self.forward)
            return reader.last_logits(ids, self.letter_ids)[inverse]
        scores = torch.empty((len(pairs), 5), dtype=torch.float32)
        for group in self.batches(ids):  # one forward pass per batch
            batch = self.batch_tensors([ids[i] for i in group])
            positions = (batch["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
            logits = self.forward(**batch, position_ids=positions, logits_to_keep=1).logits  # [B, 1, V]
            scores[group] = logits[:, -1, letter_ids].float().cpu()
        return scores[inverse]

    # --- options ---------------------------------------------------------------------------------
    @staticmethod
    def option_texts(caption: str, question: Question) -> list[tuple[str, str]]:
        """(context, continuation) per option A–D: the passage up to the blank is context, the
        option and the rest of the passage are scored. A question without a blank is answered
        after "Answer:"."""
        parts = BLANK.split(question.passage, maxsplit=1)
        head = f"Caption: {caption}\nAccording to the caption:"
        if len(parts) == 1:
            before, after = " " + question.passage + "\nAnswer: ", ""
        else:
            before, after = " " + parts[0], parts[1]
        stem = before.rstrip()
        gap = before[len(stem) :]  # the space before the blank belongs to the option's first word
        return [(head + stem, gap + option + after) for option in question.options[:4]]

    @torch.inference_mode()
    @collective_call
    def option_gains(self, captions: Sequence[str], questions: Sequence[Question]) -> torch.Tensor:
        """[N, 4]: log p(passage with option k | caption) − log p(same | empty caption), nats."""
        check_pairs(captions, questions, "questions")
        if not captions:
            return torch.zeros((0, 4))
        texts = [t for c, q in zip(captions, questions) for t in self.option_texts(c, q)]
        texts += [t for q in questions for t in self.option_texts("", q)]
        distinct, inverse = unique(texts)
        logprobs = self.continuation_logprobs(distinct)[torch.tensor(inverse)]
        n = len(captions)
        return (logprobs[: 4 * n] - logprobs[4 * n :]).view(n, 4)

    def continuation_logprobs(self, texts: Sequence[tuple[str, str]]) -> torch.Tensor:
        """Summed log-probability of each continuation after its context; one pass per batch."""
        ids, lengths = [], []
        for context, continuation in texts:
            head = self.tokenizer(literal(context, self.tokenizer), add_special_tokens=True).input_ids
            tail = self.tokenizer(literal(continuation, self.tokenizer), add_special_tokens=False).input_ids
            if not head or not tail:
                raise ValueError(f"empty context or continuation to score: {context!r} / {continuation!r}")
            ids.append(head + tail)
            lengths.append(len(tail))
        out = torch.empty(len(texts), dtype=torch.float32)
        for group in self.batches(ids):
            batch = self.batch_tensors([ids[i] for i in group])
            positions = (batch["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
            keep = max(lengths[i] for i in group) + 1  # every continuation sits at the right end
            logits = self.forward(**batch, position_ids=positions, logits_to_keep=keep).logits  # [B, keep, V]
            targets = batch["input_ids"][:, 1 - keep :]  # [B, keep-1]
            token_lp = logits[:, :-1].float().log_softmax(-1).gather(2, targets[..., None])[..., 0]
            for row, i in enumerate(group):
                out[i] = token_lp[row, keep - 1 - lengths[i] :].sum().cpu()
        return out

    # --- free generation (benchmark only) ---------------------------------------------------------
    def answer_by_generation(
        self, captions: Sequence[str], questions: Sequence[Question], max_new_tokens: int = 8
    ) -> list[str]:
        """Free greedy generation on the letters prompt, parsed for the first standalone A–E ("E"
        when none is found). For the examiner benchmark only: it costs ``max_new_tokens`` decoding
        steps and can fail to parse, which :meth:`answer` cannot."""
        check_pairs(captions, questions, "questions")
        texts = self.generate([self.prompt(c, q) for c, q in zip(captions, questions)], max_new_tokens)
        return [parse_letter(t) or "E" for t in texts]
