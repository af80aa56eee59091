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

import asyncio
import functools
import json
import math
import ssl
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import torch

from agentcap.agents.literal import literal
from agentcap.judges.coherence import CoherenceScorer
from agentcap.judges.examiner import letters_question
from agentcap.judges.questions import LETTERS, Question, check_pairs, distinct_pairs
from agentcap.judges.replies import (
    MAX_REPLY_BYTES,
    Invalid,
    InvalidReply,
    ReplyTally,
    TooManyInvalidReplies,
    finite_logprob,
    first_choice,
    letter_scores,
    message_text,
)
from agentcap.judges.temporal import AnswerTemporalExaminer, temporal_question
from agentcap.parallel import signals


class JudgeUnavailable(RuntimeError):
    """The judge server did not answer (after retries)."""


class ServedClient:
    """A small JSON client (httpx) for an OpenAI-compatible ``/v1`` server (vLLM's own endpoints included).

    Every request has a total deadline, ``timeout`` seconds for connecting and receiving the whole
    answer (a server that trickles bytes does not keep it alive); connecting alone may take at most
    5 s. Failed requests (refused, timed out, 5xx) are retried after ``backoff``, ``2 * backoff``, …
    seconds. With the defaults a judge that accepts and never answers raises
    :class:`JudgeUnavailable` after 3 × 20 + 1 + 2 = 63 s, one that refuses connections after 3 s,
    one whose host drops them after 18 s. Raise ``timeout`` for a server shared by many ranks.
    A stop signal (SIGTERM, SIGUSR1) ends a wait within 0.1 s (:mod:`agentcap.parallel.signals`).

    Args:
        url: base URL ending in ``/v1``, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name (``vllm serve``'s ``--served-model-name`` or path).
        timeout: seconds per request, connect and whole response together.
        retries: further attempts after a failed request (connection refused, 5xx, timeout).
        backoff: seconds before the first retry, doubled each time.
        batch_size: requests in flight at once.
        api_key: sent as a bearer token when set.
    """

    connect_timeout = 5.0

    def __init__(self, url: str, model: str, timeout: float = 20.0, retries: int = 2, backoff: float = 1.0,
                 batch_size: int = 32, api_key: str | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"judge url: {url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)")
        if batch_size < 1:
            raise ValueError(f"judge batch_size must be >= 1, got {batch_size}")
        if not timeout > 0:
            raise ValueError(f"judge timeout must be > 0 seconds, got {timeout}")
        self.url, self.model = url.rstrip("/"), model
        self.timeout, self.retries, self.backoff, self.batch_size = timeout, retries, backoff, batch_size
        self.api_key = api_key

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST JSON to ``<url><path>`` (``/tokenize`` goes to the server root); retries, then a clear error."""
        return self.map(path, [payload])[0]

    def map(self, path: str, payloads: Sequence[dict[str, Any]],
            validate: Callable[[Any], Any] | list[Callable[[Any], Any]] | None = None) -> list[Any]:
        """POST every payload, ``batch_size`` in flight at once; results in order.

        Every reply must be a JSON object of at most :data:`~agentcap.judges.replies.MAX_REPLY_BYTES`
        from the model asked (a ``model`` field naming another is refused), and pass ``validate``
        (reply → result, raising :class:`~agentcap.judges.replies.InvalidReply`; or one per payload);
        an invalid reply is asked again like a failed request. One still invalid after the retries is an
        :class:`~agentcap.judges.replies.Invalid` in the results when ``validate`` is given, else
        :class:`~agentcap.judges.replies.InvalidReply` naming the URL is raised."""
        if not payloads:
            return []
        work = lambda: asyncio.run(self._map(path, list(payloads), validate))  # noqa: E731
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the usual case: no event loop in this thread
            return work()
        with ThreadPoolExecutor(max_workers=1) as pool:  # called from async code (a notebook): a loop of its own
            return pool.submit(work).result()

    def tokenize(self, text: str) -> list[int]:
        return list(self.post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})["tokens"])

    async def _map(self, path: str, payloads: list[dict[str, Any]], validate: Any) -> list[Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        timeout = httpx.Timeout(self.timeout, connect=min(self.connect_timeout, self.timeout), pool=None)
        limits = httpx.Limits(max_connections=self.batch_size, max_keepalive_connections=self.batch_size)
        slots = asyncio.Semaphore(self.batch_size)
        async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits, verify=_ssl_context()) as client:
            checks = validate if isinstance(validate, list) else [validate] * len(payloads)
            everything = asyncio.gather(*(self._post(client, slots, path, p, c) for p, c in zip(payloads, checks)))
            everything.add_done_callback(lambda f: f.cancelled() or f.exception())  # cancelled on a stop: no log
            while True:  # wake up to notice a stop signal; leaving cancels the requests in flight
                done, _ = await asyncio.wait({everything}, timeout=0.1)
                if done:
                    return everything.result()
                signals.check()

    async def _post(self, client: httpx.AsyncClient, slots: asyncio.Semaphore, path: str,
                    payload: dict[str, Any], validate: Callable[[Any], Any] | None) -> Any:
        base = self.url.removesuffix("/v1") if path == "/tokenize" else self.url
        error: Exception | str | None = None
        invalid: str | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            async with slots:
                try:
                    async with asyncio.timeout(self.timeout):  # the whole exchange, however the bytes trickle
                        status, body = await self._exchange(client, base + path, payload)
                except TimeoutError:
                    error, invalid = f"no whole answer within timeout={self.timeout} s", None
                    continue
                except httpx.TransportError as err:
                    error, invalid = f"{type(err).__name__}: {err}", None
                    continue
            if body is None:  # larger than the cap: not read further
                error = invalid = f"a reply body over {MAX_REPLY_BYTES} bytes"
            elif status >= 500:
                error, invalid = f"{status}: {body[:500].decode(errors='replace')}", None
            elif status >= 400:  # a bad request does not get better by retrying
                raise ValueError(f"judge server {base + path} refused the request "
                                 f"({status}): {body[:500].decode(errors='replace')}")
            else:
                try:
                    return self._check(path, body, validate)
                except InvalidReply as err:
                    error = invalid = str(err)
        if invalid is not None:
            if validate is not None:
                return Invalid(invalid)
            raise InvalidReply(f"judge server {base + path} (model {self.model!r}): invalid reply after "
                               f"{self.retries + 1} attempts ({invalid})")
        raise JudgeUnavailable(
            f"judge server {base + path} (model {self.model!r}) did not answer after {self.retries + 1} attempts "
            f"({error}); is `vllm serve` running and reachable from this rank?"
        )

    @staticmethod
    async def _exchange(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> tuple[int, bytes | None]:
        """POST; (status, body), the body None when it passes :data:`MAX_REPLY_BYTES` (read no further)."""
        async with client.stream("POST", url, json=payload) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_REPLY_BYTES:
                return response.status_code, None
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_REPLY_BYTES:
                    return response.status_code, None
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

    def _check(self, path: str, body: bytes, validate: Callable[[Any], Any] | None) -> Any:
        """The reply parsed and checked: JSON, an object, from the model asked; then ``validate``'s result."""
        try:
            reply = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InvalidReply(f"not JSON ({err}): {body[:80]!r}") from None
        if not isinstance(reply, dict):
            raise InvalidReply(f"not a JSON object: {body[:80]!r}")
        if path != "/tokenize" and "model" in reply and reply["model"] != self.model:
            raise InvalidReply(f"a reply from model {str(reply['model'])[:80]!r}, not {self.model!r}")
        return validate(reply) if validate is not None else reply


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default certificate check, built once (each new client would load the CA bundle again: 0.3 s)."""
    return httpx.create_ssl_context()


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
        def reader(prefix: list[int], response: list[int]) -> Callable[[Any], list[float]]:
            def read(reply: Any) -> list[float]:
                steps = first_choice(reply).get("prompt_logprobs") or reply.get("prompt_logprobs")
                if steps is None:
                    raise InvalidReply("no prompt_logprobs in the reply (is it vLLM?)")
                if not isinstance(steps, list) or len(steps) != len(prefix) + len(response):
                    raise InvalidReply(f"prompt_logprobs for {len(steps) if isinstance(steps, list) else '?'} "
                                       f"tokens, not {len(prefix) + len(response)}")
                try:
                    return [finite_logprob(step[str(t)]["logprob"], f"the log-prob of token {t}")
                            for step, t in zip(steps[len(prefix):], response)]
                except (KeyError, TypeError) as err:
                    raise InvalidReply(f"prompt_logprobs without the given token ({err!r})") from None
            return read

        results = self.client.map("/completions", payloads, validate=[reader(p, r) for p, r, _ in batch])
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
