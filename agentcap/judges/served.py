"""Judges served by vLLM: an OpenAI-compatible server shared by every rank, or an engine in process.

One large judge (a 27B examiner) serves a whole cluster when it runs as a server
(``vllm serve NAME``) and every rank points at it: ``examiner: {url: http://HOST:8000/v1, model: NAME}``.
Requests go out ``batch_size`` at a time in parallel (the server batches them on the accelerator),
each with a total deadline and retries; a server that stays down or silent raises
:class:`JudgeUnavailable` naming the URL (after 63 s at most with the defaults, :class:`ServedClient`).

The examiner reads the letter A–E as :class:`~agentcap.judges.examiner.LLMExaminer` does: one
next token, restricted to the five letter ids (``allowed_token_ids`` and ``logit_bias``) and read
from its top log-probs, greedy, no free text to parse. AudioMap's temporal examiner asks for a short
free answer (greedy) and reads it as the local one does. The coherence scorer needs log-probs of given
tokens: vLLM's ``prompt_logprobs`` of prompt + response token ids (READ Eq. 4 on the server).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch

from agentcap.agents.literal import literal
from agentcap.judges.coherence import CoherenceScorer
from agentcap.judges.examiner import letters_question
from agentcap.judges.questions import LETTERS, Question, check_pairs, distinct_pairs
from agentcap.judges.replies import (
    Invalid,
    ReplyTally,
    TooManyInvalidReplies,
    letter_scores,
    message_text,
)
from agentcap.judges.temporal import AnswerTemporalExaminer, temporal_question
from agentcap.parallel.http_client import JSONClient, ServerUnavailable, given_logprobs


class JudgeUnavailable(ServerUnavailable):
    """The judge server did not answer (after retries)."""


class ServedClient(JSONClient):
    """The client of a judge server (:class:`~agentcap.parallel.http_client.JSONClient`: every request
    with a total deadline and retries; a server that stays down or silent raises
    :class:`JudgeUnavailable` naming the URL, after 63 s at most with the defaults)."""

    kind = "judge"
    unavailable = JudgeUnavailable


def letter_token_ids(tokenize, letters: Sequence[str] = LETTERS) -> list[int]:
    """The single-token ids of ``letters`` (A–E by default; ``tokenize``: text → ids), or a clear error."""
    ids = [tokenize(letter) for letter in letters]
    if any(len(x) != 1 for x in ids) or len({x[0] for x in ids}) != len(letters):
        raise ValueError(f"the judge's tokenizer does not give {letters[0]}–{letters[-1]} one distinct token each "
                         f"(got {ids})")
    return [x[0] for x in ids]


def _examiner_messages(caption: str, question: Question) -> list[dict[str, str]]:
    return [{"role": "user", "content": literal(letters_question(caption, question))}]  # data: no forged turns


def _invalid_row(row: Sequence[float]) -> bool:
    """A readout row that is no answer: NaN or +inf anywhere, or no letter scored at all."""
    return any(math.isnan(v) or v == float("inf") for v in row) or all(v == float("-inf") for v in row)


class _LetterExaminer:
    """Shared ``answer`` / ``letter_logits`` over a ``_read(prompts) -> [N, 5]`` readout; a row of NaN
    is a reply that stayed invalid (:mod:`agentcap.judges.replies`)."""

    def answer(self, captions: Sequence[str], questions: Sequence[Question]) -> list[str | None]:
        """One letter per pair; None where the judge's reply was invalid (never read as an answer)."""
        rows = self.letter_logits(captions, questions)
        return [None if _invalid_row(row) else LETTERS[max(range(5), key=row.__getitem__)] for row in rows.tolist()]

    def letter_logits(self, captions: Sequence[str], questions: Sequence[Question]) -> torch.Tensor:
        """[N, 5] log-probs of A–E per pair (identical pairs asked once; NaN rows: invalid replies)."""
        check_pairs(captions, questions, "questions")
        if not captions:
            return torch.zeros((0, 5))
        pairs, inverse = distinct_pairs(captions, questions)
        return self._read([_examiner_messages(*pair) for pair in pairs])[inverse]


class ServedExaminer(_LetterExaminer):
    """The cloze / MCQ examiner on an OpenAI-compatible server (see module docstring)."""

    def __init__(self, client: ServedClient):
        self.client = client
        self._letter_ids: list[int] | None = None
        self.tally = ReplyTally(f"examiner {client.url} (model {client.model!r})")

    @property
    def letter_ids(self) -> list[int]:
        if self._letter_ids is None:
            self._letter_ids = letter_token_ids(self.client.tokenize)
        return self._letter_ids

    def _read(self, conversations: list[list[dict[str, str]]]) -> torch.Tensor:
        ids = self.letter_ids
        payloads = [
            {
                "model": self.client.model, "messages": messages, "max_tokens": 1, "temperature": 0.0,
                "logprobs": True, "top_logprobs": 5, "allowed_token_ids": ids,
                "logit_bias": {str(i): 100 for i in ids},
            }
            for messages in conversations
        ]
        results = self.client.map("/chat/completions", payloads, validate=lambda r: letter_scores(r, LETTERS))
        self.tally.record(results)
        rows = [[float("nan")] * 5 if isinstance(r, Invalid) else r for r in results]
        return torch.tensor(rows, dtype=torch.float32)


class ServedTemporalExaminer(AnswerTemporalExaminer):
    """AudioMap's temporal examiner on an OpenAI-compatible server: the local
    :class:`~agentcap.judges.temporal.LLMTemporalExaminer`'s question as one user message, greedy,
    at most ``max_new_tokens``, its answer read by the same rule. One server can hold both judges."""

    def __init__(self, client: ServedClient, half_width: float = 0.5, max_new_tokens: int = 24):
        super().__init__(half_width, max_new_tokens)
        self.client = client
        self.tally = ReplyTally(f"temporal examiner {client.url} (model {client.model!r})")

    def _answers(self, pairs: list[tuple[str, str]]) -> list[str | None]:
        payloads = [
            {"model": self.client.model, "messages": [{"role": "user", "content": literal(temporal_question(c, e))}],
             "max_tokens": self.max_new_tokens, "temperature": 0.0}
            for c, e in pairs
        ]
        answers = self.client.map("/chat/completions", payloads, validate=message_text)
        self.tally.record(answers)
        return [None if isinstance(a, Invalid) else a for a in answers]  # None: read by the rule fallback


class VLLMExaminer(_LetterExaminer):
    """The examiner as a vLLM engine in this process (``examiner: {vllm: MODEL_FOLDER}``)."""

    def __init__(self, path: str, gpu_memory_utilization: float = 0.2, max_model_len: int | None = 4096,
                 dtype: str = "auto", enforce_eager: bool = False):
        from vllm import LLM

        kwargs: dict[str, Any] = dict(model=path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                                      enforce_eager=enforce_eager, logprobs_mode="processed_logprobs")
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        self.llm = LLM(**kwargs)
        tokenizer = self.llm.get_tokenizer()
        self.letter_ids = letter_token_ids(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
        self.tally = ReplyTally(f"examiner vllm:{path}")

    def _read(self, conversations: list[list[dict[str, str]]]) -> torch.Tensor:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, allowed_token_ids=self.letter_ids)
        outputs = self.llm.chat(conversations, params, use_tqdm=False)
        rows = []
        for out in outputs:
            step = (out.outputs[0].logprobs or [{}])[0]
            by_id = {token: lp.logprob for token, lp in step.items()}
            row = [by_id.get(i, float("-inf")) for i in self.letter_ids]
            rows.append([float("nan")] * 5 if _invalid_row(row) else row)
        self.tally.record([Invalid("non-finite letter log-probs") if math.isnan(r[0]) else r for r in rows])
        return torch.tensor(rows, dtype=torch.float32)


class ServedCoherenceScorer:
    """READ's coherence scorer (Eq. 4) on a served causal LM: the same anti-copy masked mean
    log-prob as :class:`~agentcap.judges.coherence.CoherenceScorer`, with the response tokens'
    log-probs taken from the server's ``prompt_logprobs``. The local ``tokenizer`` folder must be
    the served model's (token ids travel, not text)."""

    def __init__(self, client: ServedClient, tokenizer: str, max_length: int = 1024):
        from transformers import AutoTokenizer

        self.client = client
        self._local = CoherenceScorer.__new__(CoherenceScorer)  # its query building, our forward pass
        self._local.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self._local.batch_size = client.batch_size
        self._local.max_length = max_length
        self._local._masked_mean_logprob = self._masked_mean_logprob
        self.tally = ReplyTally(f"coherence scorer {client.url} (model {client.model!r})")

    def score(self, contexts: Sequence[Sequence[str]], responses: Sequence[str], n: int = 3) -> torch.Tensor:
        return self._local.score(contexts, responses, n=n)

    def _masked_mean_logprob(self, batch: list[tuple[list[int], list[int], list[int]]]) -> torch.Tensor:
        payloads = [
            {"model": self.client.model, "prompt": list(prefix) + list(response), "max_tokens": 1,
             "temperature": 0.0, "prompt_logprobs": 0}
            for prefix, response, _ in batch
        ]
        results = self.client.map("/completions", payloads, validate=[functools.partial(given_logprobs, prompt=p, tokens=r) for p, r, _ in batch])
        self.tally.record(results)
        out = []
        for logprobs, (prefix, response, mask) in zip(results, batch):
            if isinstance(logprobs, Invalid):  # no stand-in for a log-prob: stop
                raise TooManyInvalidReplies(f"{self.tally.where}: invalid reply after {self.client.retries + 1} "
                                            f"attempts ({logprobs.reason})")
            kept = sum(m for m in mask)
            out.append(sum(lp * m for lp, m in zip(logprobs, mask)) / kept)
        return torch.tensor(out, dtype=torch.float64)


def served_judge_client(spec: dict[str, Any], where: str) -> ServedClient:
    """A :class:`ServedClient` from a config mapping ``{url, model, timeout?, retries?, batch_size?}``."""
    known = {"url", "model", "timeout", "retries", "backoff", "batch_size", "api_key"}
    unknown = sorted(set(spec) - known - {"tokenizer", "vllm", "max_length"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a served judge takes {sorted(known)}")
    if "url" not in spec or "model" not in spec:
        raise ValueError(f"{where}: a served judge needs both url and model (got {sorted(spec)})")
    return ServedClient(**{k: v for k, v in spec.items() if k in known})
