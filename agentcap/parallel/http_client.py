"""A JSON client for OpenAI-compatible servers shared by every rank (``vllm serve``): deadlines, retries,
stop signals, checked replies.

Two kinds of servers use it: served judges (``agentcap.judges.served.ServedClient``) and rollout
engines in processes of their own (``agentcap.agents.backends.served``). Both need the same
guarantees: a server that dies or stalls ends a step with a named error within a known time (the
step's half-done state is never saved, so the newest checkpoint stays the last intact one), a stop
signal ends a wait within 0.1 s, a reply is a bounded JSON object from the model asked.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import ssl
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from agentcap.parallel import signals

#: Replies larger than this are refused unread past it (a letter or a short answer is under 10 kB).
MAX_REPLY_BYTES = 1 << 20

#: vLLM's endpoints at the server root, not under ``/v1``.
ROOT_PATHS = frozenset({"/tokenize", "/collective_rpc", "/weight_info", "/update_weight_version", "/reset_prefix_cache",
                        "/health", "/version"})

#: vLLM's endpoints that answer plain text (``Success: …``), returned as ``{"text": …}``.
TEXT_PATHS = frozenset({"/load_lora_adapter", "/unload_lora_adapter"})


class ServerUnavailable(RuntimeError):
    """The server did not answer (after retries)."""


class Refused(ValueError):
    """The server answered a request with 4xx: retrying does not help. ``status`` and ``body`` kept."""

    def __init__(self, message: str, status: int, body: str):
        super().__init__(message)
        self.status, self.body = status, body


class InvalidReply(ValueError):
    """One reply that is not an answer (raised by a validator; the client asks again)."""


@dataclass(frozen=True)
class Invalid:
    """Stands in a result list for a reply still invalid after the retries (never an answer)."""

    reason: str

    def __bool__(self) -> bool:
        return False


def finite_logprob(value: Any, what: str) -> float:
    """``value`` as a log-prob: a number ≤ 0 or −inf; NaN, +inf, a positive number or a string is invalid."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidReply(f"{what} is not a number: {str(value)[:40]!r}")
    value = float(value)
    if math.isnan(value) or value > 1e-6:
        raise InvalidReply(f"{what} is {value} (a log-prob is finite and ≤ 0)")
    return value


def first_choice(reply: Any) -> dict[str, Any]:
    """``reply["choices"][0]`` of an OpenAI-compatible reply, or :class:`InvalidReply`."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise InvalidReply(f"no choices[0] in the reply: {str(reply)[:120]}")
    return choices[0]


def given_logprobs(reply: Any, prompt: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """The log-probs of ``tokens`` after ``prompt`` in a vLLM reply to a ``prompt_logprobs`` request
    whose prompt was ``prompt + tokens`` (token ids), or :class:`InvalidReply`."""
    steps = first_choice(reply).get("prompt_logprobs") or reply.get("prompt_logprobs")
    if steps is None:
        raise InvalidReply("no prompt_logprobs in the reply (is it vLLM?)")
    if not isinstance(steps, list) or len(steps) != len(prompt) + len(tokens):
        raise InvalidReply(f"prompt_logprobs for {len(steps) if isinstance(steps, list) else '?'} "
                           f"tokens, not {len(prompt) + len(tokens)}")
    try:
        return [finite_logprob(step[str(t)]["logprob"], f"the log-prob of token {t}")
                for step, t in zip(steps[len(prompt):], tokens)]
    except (KeyError, TypeError) as err:
        raise InvalidReply(f"prompt_logprobs without the given token ({err!r})") from None


class JSONClient:
    """A small JSON client (httpx) for an OpenAI-compatible ``/v1`` server (vLLM's own endpoints included).

    Every request has a total deadline, ``timeout`` seconds for connecting and receiving the whole
    answer (a server that trickles bytes does not keep it alive); connecting alone may take at most
    5 s. Failed requests (refused, timed out, 5xx) are retried after ``backoff``, ``2 * backoff``, …
    seconds. With the defaults a server that accepts and never answers raises :attr:`unavailable`
    after 3 × 20 + 1 + 2 = 63 s, one that refuses connections after 3 s, one whose host drops them
    after 18 s. Raise ``timeout`` for a server shared by many ranks. A stop signal (SIGTERM, SIGUSR1)
    ends a wait within 0.1 s (:mod:`agentcap.parallel.signals`).

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
    kind = "vLLM"  # errors name "<kind> server URL", "<kind> url", …
    unavailable: type[ServerUnavailable] = ServerUnavailable  # raised when it does not answer

    def __init__(self, url: str, model: str, timeout: float = 20.0, retries: int = 2, backoff: float = 1.0,
                 batch_size: int = 32, api_key: str | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{self.kind} url: {url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)")
        if batch_size < 1:
            raise ValueError(f"{self.kind} batch_size must be >= 1, got {batch_size}")
        if not timeout > 0:
            raise ValueError(f"{self.kind} timeout must be > 0 seconds, got {timeout}")
        self.url, self.model = url.rstrip("/"), model
        self.root = self.url.removesuffix("/v1")
        self.timeout, self.retries, self.backoff, self.batch_size = timeout, retries, backoff, batch_size
        self.api_key = api_key

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST JSON to ``<url><path>`` (:data:`ROOT_PATHS` go to the server root); retries, then a clear error."""
        return self.map(path, [payload])[0]

    def get(self, path: str) -> dict[str, Any]:
        """GET ``<url><path>`` (``/models``; :data:`ROOT_PATHS` at the root) as a JSON object."""
        return self.map(path, [None])[0]

    def map(self, path: str, payloads: Sequence[dict[str, Any] | None],
            validate: Callable[[Any], Any] | list[Callable[[Any], Any]] | None = None) -> list[Any]:
        """POST every payload (None: a GET), ``batch_size`` in flight at once; results in order.

        Every reply must be a JSON object of at most :data:`MAX_REPLY_BYTES` from the model asked (a
        ``model`` field naming another than the payload's, or the client's, is refused), and pass
        ``validate`` (reply → result, raising :class:`InvalidReply`; or one per payload); an invalid
        reply is asked again like a failed request. One still invalid after the retries is an
        :class:`Invalid` in the results when ``validate`` is given, else :class:`InvalidReply` naming
        the URL is raised."""
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

    async def _map(self, path: str, payloads: list[dict[str, Any] | None], validate: Any) -> list[Any]:
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
                    payload: dict[str, Any] | None, validate: Callable[[Any], Any] | None) -> Any:
        base = self.root if path in ROOT_PATHS else self.url
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
                error, invalid = f"{status}: {_one_line(body)}", None
            elif status >= 400:  # a bad request does not get better by retrying
                text = _one_line(body)
                raise Refused(f"{self.kind} server {base + path} refused the request ({status}): {text}", status, text)
            else:
                try:
                    return self._check(path, body, validate, (payload or {}).get("model", self.model))
                except InvalidReply as err:
                    error = invalid = str(err)
        if invalid is not None:
            if validate is not None:
                return Invalid(invalid)
            raise InvalidReply(f"{self.kind} server {base + path} (model {self.model!r}): invalid reply after "
                               f"{self.retries + 1} attempts ({invalid})")
        raise self.unavailable(
            f"{self.kind} server {base + path} (model {self.model!r}) did not answer after {self.retries + 1} attempts "
            f"({error}); is `vllm serve` running and reachable from this rank?"
        )

    @staticmethod
    async def _exchange(client: httpx.AsyncClient, url: str, payload: dict[str, Any] | None) -> tuple[int, bytes | None]:
        """POST (GET when ``payload`` is None); (status, body), the body None when it passes
        :data:`MAX_REPLY_BYTES` (read no further)."""
        method, body = ("GET", {}) if payload is None else ("POST", {"json": payload})
        async with client.stream(method, url, **body) as response:
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

    def _check(self, path: str, body: bytes, validate: Callable[[Any], Any] | None, model: str) -> Any:
        """The reply parsed and checked: JSON, an object, from ``model``; then ``validate``'s result
        (:data:`TEXT_PATHS`: ``{"text": …}``; an empty body at a root path: ``{}``)."""
        if path in TEXT_PATHS or (path in ROOT_PATHS and not body.strip()):
            reply: Any = {"text": body.decode(errors="replace")} if path in TEXT_PATHS else {}
            return validate(reply) if validate is not None else reply
        try:
            reply = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InvalidReply(f"not JSON ({err}): {body[:80]!r}") from None
        if not isinstance(reply, dict):
            raise InvalidReply(f"not a JSON object: {body[:80]!r}")
        if path not in ROOT_PATHS and "model" in reply and reply["model"] != model:
            raise InvalidReply(f"a reply from model {str(reply['model'])[:80]!r}, not {model!r}")
        return validate(reply) if validate is not None else reply


def _one_line(body: bytes) -> str:
    """The start of a reply body as one line (an HTML error page's line breaks folded)."""
    return " ".join(body[:500].decode(errors="replace").split())


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default certificate check, built once (each new client would load the CA bundle again: 0.3 s)."""
    return httpx.create_ssl_context()
