"""Caption-as-evidence accuracy on audio QA benchmarks (MMAU, MMAR, MMSU, the toy benchmark).

The protocol of ACE-Cap (Tab. 1, Fig. 4) and AudioMap (the MMAU / MMAR / MMSU columns): the trained
system captions every distinct clip of the benchmark; a frozen text-only judge then answers each
multiple-choice question with that caption as its only evidence (no audio), greedily, with one fixed
prompt (:data:`INSTRUCTION`, version :data:`PROMPT_VERSION`). The answer is read as the examiners
read theirs: the argmax of the next-token logits restricted to the question's own option letters
(A and B for two choices … A–J for ten), so there is no free text to parse. Accuracy is reported
overall and per benchmark / task / category / subcategory / layer.

Captions and answers are cached in the output folder (append-only JSONL): a caption under the
captioner's identity (config, checkpoint file size and mtime) and the clip's path, an answer under
the judge's identity, the prompt version, the caption, the question and its choices. A rerun asks
nothing twice; a second judge on the same captions never runs the captioner. Only letters are cached:
a question left unanswered, or whose reply was invalid (a letter outside its options, another model,
a NaN log-prob, a malformed or oversized body: :mod:`agentcap.judges.replies`), is asked again.

Judges (``--judge``): ``rule`` (the offline toy worlds' deterministic matcher, see
:class:`RuleJudge`), the folder of a local HF causal LM, or an OpenAI-compatible server
(``http://HOST:8000/v1#MODEL``, or a JSON object ``{"url": ..., "model": ...}``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from agentcap.agents.literal import literal
from agentcap.core.manifests import read_manifest, resolve
from agentcap.core.settings import ConfigError, check
from agentcap.data.benchmark_rows import LETTERS, check_benchmark_row, check_unique_ids
from agentcap.judges.causal_lm import CausalLMJudge
from agentcap.judges.questions import sentences
from agentcap.judges.replies import Invalid, ReplyTally, letter_scores
from agentcap.judges.served import ServedClient, letter_token_ids, served_judge_client

#: Changes whenever :data:`INSTRUCTION` or :func:`judge_prompt` changes; part of every answer's cache key.
PROMPT_VERSION = "caption-evidence-v1"
INSTRUCTION = (
    "You cannot hear the audio clip. Below is a caption written about it. Answer the multiple-choice "
    "question about the clip using only the caption as evidence. If the caption does not settle the "
    "question, choose the option the caption makes most likely. Reply with a single letter."
)
#: The row fields accuracy is broken down by (a null value is left out of that breakdown).
GROUPS = ("benchmark", "task", "category", "subcategory", "layer")


@dataclass(frozen=True)
class Ask:
    """One question put to the judge: the caption is its only evidence."""

    caption: str
    question: str
    choices: tuple[str, ...]


def judge_prompt(ask: Ask) -> str:
    """The judge's user turn: instruction, caption, question, lettered choices."""
    options = "\n".join(f"{letter}. {choice}" for letter, choice in zip(LETTERS, ask.choices))
    last = LETTERS[len(ask.choices) - 1]
    return (f"{INSTRUCTION}\n\nCaption: {ask.caption}\n\nQuestion: {ask.question}\n{options}\n"
            f"Answer with one letter from A to {last}.")


# --- judges --------------------------------------------------------------------------------------
class BenchmarkJudge(Protocol):
    """Answers each ask with one of its option letters (None: the judge gave no answer;
    :class:`~agentcap.judges.replies.Invalid`: its reply was not an answer). Neither is cached."""

    identity: str

    def choose(self, asks: Sequence[Ask]) -> list[str | Invalid | None]: ...


_WORD = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?")
_STOP = frozenset("a an the is are was of in to at on and or does do how what which when who from it its "
                  "this that clip sound sounds heard".split())


def _phrase(text: str) -> re.Pattern[str]:
    words = r"\s+".join(re.escape(w) for w in text.split())
    return re.compile(rf"(?<![\w.-]){words}(?![\w-]|\.\d)", re.IGNORECASE)


_ARTICLE = re.compile(r"^(?:the|a|an)\s+(?=\S)", re.IGNORECASE)
_QUOTE = re.compile(r'"([^"]+)"')


#: Question words asking for the later of the named things (captions narrate in time order).
_LATER = frozenset({"later", "last", "latest", "final"})


def _named_last(ask: Ask, parts: Sequence[str]) -> str | None:
    """Of the choices the caption names, the one whose first naming comes last (None: none named)."""
    first: dict[int, tuple[int, int]] = {}
    for k, choice in enumerate(ask.choices):
        for i, part in enumerate(parts):
            spans = [m.start() for name in _names(choice) for m in _phrase(name).finditer(part)]
            if spans:
                first[k] = (i, min(spans))
                break
    return LETTERS[max(first, key=first.get)] if first else None


#: A time as captions and choices write it ("2.5 s", "3 seconds").
_TIME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(?:s|secs?|seconds?)\b", re.IGNORECASE)
#: Question words asking when something ends rather than starts.
_END = frozenset({"end", "ends", "stop", "stops", "finish", "finishes"})
#: The frame of a time question ("At about what time does X start?"): not words about its subject.
_WHEN = _END | {"about", "time", "start", "starts", "begin", "begins"}
_COUNTS = {"none": 0, "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10}
#: "Apart from the voice, how many ...": speech sentences are not counted.
_APART = re.compile(r"\b(?:apart from|besides|other than|except(?: for)?)\s+(?:the\s+)?(?:voices?|speech|speakers?)\b",
                    re.IGNORECASE)
_SPEECH = re.compile(r'"|\b(?:says?|said|speaks?|spoke|saying|speaking)\b', re.IGNORECASE)
#: The words of a sentence that are neither a time nor a timestamp's frame: what it says happens.
_FRAME = frozenset({"from", "to", "s", "at", "until", "between", "and"})


def _count(choice: str) -> int | None:
    text = choice.strip().lower()
    return int(text) if text.isdigit() else _COUNTS.get(text)


def _counted(ask: Ask, parts: Sequence[str]) -> str | None:
    """"How many": the caption's distinct sound sentences (its speech left out when the question says
    "apart from the voice"), as the choice naming that number; a number no choice names: no answer."""
    skip_speech = bool(_APART.search(ask.question))
    said = {frozenset(set(_WORD.findall(_TIME.sub(" ", p.lower()))) - _FRAME)
            for p in parts if not (skip_speech and _SPEECH.search(p))}
    said.discard(frozenset())
    counts = [_count(choice) for choice in ask.choices]
    return LETTERS[counts.index(len(said))] if len(said) in counts else None


def _nearest_time(ask: Ask, parts: Sequence[str], ranked: Sequence[tuple[int, int]]) -> str | None:
    """"At about what time does X start / end": in the first sentence about X (sharing the question's
    words) that gives times, its first (start) or last (end) time; the choice nearest to it."""
    asked = set(_WORD.findall(ask.question.lower()))
    for overlap, i in ranked:
        times = [float(t) for t in _TIME.findall(parts[i])]
        if overlap and times:
            said = times[-1] if asked & _END else times[0]
            gaps = [abs(float(_TIME.fullmatch(c.strip()).group(1)) - said) for c in ask.choices]
            return LETTERS[min(range(len(gaps)), key=lambda k: (gaps[k], k))]
    return None


def _named_after(ask: Ask, parts: Sequence[str], quote: str) -> str | None:
    """"The first one after "Q" is said": the first choice named in the sentences after the one that
    shares most of Q's words (None: no sentence shares any, or none after it names a choice; the
    question is then read as any other)."""
    said = set(_WORD.findall(quote.lower())) - _STOP
    overlaps = [len(said & set(_WORD.findall(p.lower()))) for p in parts]
    if not overlaps or max(overlaps) == 0:
        return None
    for part in parts[overlaps.index(max(overlaps)) + 1:]:
        first = {k: m.start() for k, choice in enumerate(ask.choices) for name in _names(choice)
                 if (m := _phrase(name).search(part))}
        if first:
            return LETTERS[min(first, key=first.get)]
    return None


def _names(choice: str) -> list[str]:
    """The ways a caption may name a choice: its words, without a leading article, its quote."""
    found = [choice, _ARTICLE.sub("", choice), *_QUOTE.findall(choice)]
    return [name for i, name in enumerate(found) if name.strip() and name not in found[:i]]


class RuleJudge:
    """Deterministic stand-in judge for the offline toy worlds ONLY (templated captions).

    The caption sentences are read in order of how many of the question's content words (not those
    of its choices) they share (ties: the earlier sentence first); in the first one that names any
    choice (whole words, longer choices first, a shorter one inside a longer match does not count),
    the choice named first wins. A choice is named by its own words, by them without a leading
    article ("the bell" by "a bell dings") or, when it quotes speech, by its quote ('the speaker
    saying "Thank you"' by 'a woman says "Thank you"'): captions name things, choices refer to them.
    A question asking which comes *later* or *last* takes, of the choices named, the one whose first
    naming comes last. A question whose choices are all times ("At about what time does the bell
    start?") takes the choice nearest to the first time (the last, for "end" / "stop") of the first
    sentence about its subject that gives times; one whose choices are all counts ("how many sound
    effects") counts the caption's distinct sound sentences, speech left out for "apart from the
    voice"; "the first one after "Q" is said" takes the first choice named after the sentence that
    quotes Q (read as any question when there is none). No choice named anywhere: no answer (counted
    wrong). It reasons no further than this, which the per-category table shows; it is not a
    substitute for an LLM judge.
    """

    #: v2: choices are also named without their article or by their quote, and "which comes later"
    #: is read (v1 left the real-speech world's order questions unanswered). v3: times are read as
    #: the nearest choice, not only an exact one, "how many" is counted (v2 left both unanswered
    #: unless a caption's time matched a choice to the digit) and "after "Q"" is read in the
    #: sentences after Q's. The version keeps older answers apart.
    identity = "rule-v3"

    def choose(self, asks: Sequence[Ask]) -> list[str | None]:
        return [self._one(ask) for ask in asks]

    @staticmethod
    def _one(ask: Ask) -> str | None:
        named = {w for choice in ask.choices for w in _WORD.findall(choice.lower())}
        wanted = set(_WORD.findall(ask.question.lower())) - _STOP - named  # the subject, not the options
        parts = sentences(ask.caption)
        if re.search(r"\bhow many\b", ask.question, re.IGNORECASE) and all(_count(c) is not None for c in ask.choices):
            return _counted(ask, parts)
        unquoted = set(_WORD.findall(_QUOTE.sub("", ask.question).lower()))  # not the words of a quote
        if _LATER & unquoted:
            return _named_last(ask, parts)
        quote = _QUOTE.search(ask.question)
        after = _named_after(ask, parts, quote.group(1)) if quote and "after" in unquoted else None
        if after is not None:
            return after  # otherwise read as any question: Q not found, or nothing named after it
        if all(_TIME.fullmatch(c.strip()) for c in ask.choices):
            subject = wanted - _WHEN
            overlaps = [(len(subject & set(_WORD.findall(p.lower()))), i) for i, p in enumerate(parts)]
            return _nearest_time(ask, parts, sorted(overlaps, key=lambda oi: (-oi[0], oi[1])))
        ranked = sorted(range(len(parts)), key=lambda i: (-len(wanted & set(_WORD.findall(parts[i].lower()))), i))
        names = [(k, name) for k, choice in enumerate(ask.choices) for name in _names(choice)]
        longest_first = sorted(names, key=lambda kn: -len(kn[1]))
        for i in ranked:
            claimed: list[tuple[int, int]] = []
            first: dict[int, int] = {}
            for k, name in longest_first:
                for match in _phrase(name).finditer(parts[i]):
                    start, end = match.span()
                    if not any(start < e and s < end for s, e in claimed):
                        claimed.append((start, end))
                        first.setdefault(k, start)
            if first:
                return LETTERS[min(first, key=first.get)]
        return None


def _best_letters(scores: Sequence[Sequence[float]], asks: Sequence[Ask]) -> list[str | Invalid | None]:
    """The argmax over each ask's own letters (the first ``len(choices)`` columns); a row with a NaN or
    +inf there is :class:`~agentcap.judges.replies.Invalid` (never an answer), one with no letter
    scored None."""
    out: list[str | Invalid | None] = []
    for row, ask in zip(scores, asks):
        own = list(row[: len(ask.choices)])
        if any(math.isnan(v) or v == float("inf") for v in own):
            out.append(Invalid(f"non-finite letter scores {own}"))
            continue
        best = max(range(len(own)), key=lambda k: own[k])
        out.append(LETTERS[best] if own[best] != float("-inf") else None)
    return out


class LocalJudge:
    """A local HF causal LM (``agentcap.judges.examiner.CausalLMJudge``): one forward pass per batch,
    the next-token logits at the answer position over the option letters."""

    def __init__(self, judge: CausalLMJudge, identity: str):
        self.judge, self.identity = judge, identity
        self.letter_ids: list[int] | None = None

    def _find_letter_ids(self, prompt: str) -> list[int]:
        """The token ids of A–J as the tokenizer writes them right after a real prompt (no space after
        whitespace, one space after "Answer:"), as the cloze examiner finds its A–E."""
        encode = self.judge.encode
        base = encode([prompt])[0]
        for gap in (("", " ") if prompt[-1:].isspace() else (" ", "")):
            ids = []
            for letter in LETTERS:
                full = encode([prompt + gap + letter])[0]
                if len(full) <= len(base) or full[: len(base)] != base:
                    break
                ids.append(full[len(base)])
            if len(ids) == len(LETTERS) and len(set(ids)) == len(LETTERS):
                return ids
        raise ValueError(f"{self.identity}: the judge's tokenizer has no distinct single tokens for the letters A–J")

    @torch.inference_mode()
    def choose(self, asks: Sequence[Ask]) -> list[str | None]:
        if not asks:
            return []
        prompts = [self.judge.render(judge_prompt(a)) for a in asks]
        if self.letter_ids is None:
            self.letter_ids = self._find_letter_ids(prompts[0])
        ids = self.judge.encode(prompts)
        wanted = torch.tensor(self.letter_ids, device=self.judge.device)
        scores = torch.empty((len(asks), len(LETTERS)))
        for group in self.judge.batches(ids):
            batch = self.judge.batch_tensors([ids[i] for i in group])
            positions = (batch["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
            logits = self.judge.forward(**batch, position_ids=positions, logits_to_keep=1).logits  # [B, 1, V]
            scores[group] = logits[:, -1, wanted].float().cpu()
        return _best_letters(scores.tolist(), asks)


class ServedJudge:
    """A judge on an OpenAI-compatible server (``vllm serve``): one chat completion per ask, one token,
    greedy, restricted to the ask's letters (``allowed_token_ids`` and ``logit_bias``), read from the
    top log-probs as :class:`agentcap.judges.served.ServedExaminer` reads A–E."""

    def __init__(self, client: ServedClient):
        self.client = client
        self.identity = f"served:{client.url}#{client.model}"
        self._ids: list[int] | None = None

    @property
    def letter_ids(self) -> list[int]:
        if self._ids is None:
            try:
                self._ids = letter_token_ids(self.client.tokenize, LETTERS)
            except ValueError as err:
                raise ValueError(f"{self.identity}: {err}") from None
        return self._ids

    def choose(self, asks: Sequence[Ask]) -> list[str | Invalid | None]:
        payloads, checks = [], []
        for ask in asks:
            ids = self.letter_ids[: len(ask.choices)]
            payloads.append({
                "model": self.client.model, "messages": [{"role": "user", "content": literal(judge_prompt(ask))}],
                "max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": len(ids),
                "allowed_token_ids": ids, "logit_bias": {str(i): 100 for i in ids},
            })
            checks.append(functools.partial(letter_scores, letters=LETTERS[: len(ask.choices)]))
        scores = self.client.map("/chat/completions", payloads, validate=checks)  # retried while invalid
        return [s if isinstance(s, Invalid) else letter for s, letter in
                zip(scores, _best_letters([[float("-inf")] if isinstance(s, Invalid) else s for s in scores], asks))]


def served_models(url: str, timeout: float = 30.0, flag: str = "--judge") -> list[str]:
    """The model names an OpenAI-compatible server serves (``GET <url>/models``); a server that does
    not answer is a one-line error naming it."""
    import httpx

    try:
        response = httpx.get(url.rstrip("/") + "/models", timeout=timeout)
        response.raise_for_status()
        return [m["id"] for m in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError, AttributeError) as err:
        raise ValueError(f"{flag}: cannot list the models served at {url} ({type(err).__name__}: {err}); "
                         f"is the server up? Name the model as {url}#MODEL to skip this") from None


def parse_judge_spec(text: str, flag: str = "--judge") -> str | dict[str, Any]:
    """A judge given on the command line: ``rule``, a model folder, ``URL#MODEL``, a bare URL (the
    server's only model), or a JSON object ``{"url", "model", ...}`` (``build_examiner``'s forms)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{flag}: not a valid JSON object ({err.msg}): {text!r}") from None
        if not isinstance(spec, dict):
            raise ValueError(f"{flag}: expected a JSON object, got {text!r}")
        return spec
    if text.startswith(("http://", "https://")):
        url, _, model = text.partition("#")
        if not model:
            names = served_models(url, flag=flag)
            if len(names) != 1:
                raise ValueError(f"{flag}: {url} serves {names}; name one as {url}#MODEL")
            model = names[0]
        return {"url": url, "model": model}
    if text != "rule" and not os.path.isdir(text):
        raise ValueError(f"{flag}: {text!r} is not 'rule', a model folder, a http(s) URL or a JSON object")
    return text


def build_benchmark_judge(spec: str | Mapping[str, Any], device: str = "cpu") -> BenchmarkJudge:
    """The benchmark judge for a spec as :func:`agentcap.judges.build.build_examiner` takes it."""
    if isinstance(spec, Mapping):
        if "vllm" in spec:
            raise ValueError("--judge: a vLLM engine in process is not supported here; serve the model "
                             "(`vllm serve`) and give URL#MODEL (docs/vllm.md)")
        return ServedJudge(served_judge_client(dict(spec), "--judge"))
    if spec == "rule":
        return RuleJudge()
    from agentcap.judges.pool import causal_lm

    return LocalJudge(CausalLMJudge(*causal_lm(spec, device)), f"local:{os.path.abspath(spec)}")


# --- caches ----------------------------------------------------------------------------------------
def cache_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


#: Questions asked of the judge between two writes of the answer cache.
ASK_CHUNK = 64


class JsonlCache:
    """``key → value`` kept as appended JSON lines (flushed each), read back whole on open."""

    def __init__(self, path: str):
        self.path = path
        self.values: dict[str, Any] = {}
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a killed run: asked again
                        continue
                    self.values[entry["key"]] = entry["value"]

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def put(self, entries: Mapping[str, Any]) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            for key, value in entries.items():
                handle.write(json.dumps({"key": key, "value": value}) + "\n")
        self.values.update(entries)


def captioner_identity(config: str, checkpoint: str | None) -> str:
    """What the captions depend on: the config's text and the checkpoint file (path, size, mtime)."""
    with open(config, "rb") as handle:
        text = hashlib.sha256(handle.read()).hexdigest()
    weights = "untrained"
    if checkpoint and os.path.exists(checkpoint):  # a sharded checkpoint folder: its meta.pt, written last
        stat = os.stat(os.path.join(checkpoint, "meta.pt") if os.path.isdir(checkpoint) else checkpoint)
        weights = f"{os.path.abspath(checkpoint)}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{text}|{weights}"


# --- the run ---------------------------------------------------------------------------------------
def read_benchmark(path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The benchmark manifest's rows (the first ``limit``; the reading stops there), each checked by
    ``check_benchmark_row`` (errors name file:line); ids repeated across rows are refused, naming how
    many rows repeat one (``check_unique_ids``)."""
    rows = read_manifest(path, check=check_benchmark_row, limit=limit)
    check_unique_ids(rows, path)
    for row in rows:
        row["_clip"] = os.path.abspath(resolve(row["audio"], row["_manifest"]))
    return rows


#: ``captioner(clip paths) -> {path: {"caption": str} or {"error": str}}``
Captioner = Callable[[Sequence[str]], Mapping[str, Mapping[str, Any]]]


def evaluate_benchmark(
    rows: Sequence[Mapping[str, Any]], captioner: Captioner, captioner_id: str, judge: BenchmarkJudge, out_dir: str
) -> dict[str, Any]:
    """Caption the rows' distinct clips (cached), ask the judge every question (cached), and write
    ``benchmark_items.jsonl`` and ``benchmark_summary.json`` to ``out_dir``; returns the summary."""
    captions = JsonlCache(os.path.join(out_dir, "cache", "captions.jsonl"))
    answers = JsonlCache(os.path.join(out_dir, "cache", "answers.jsonl"))
    clips = list(dict.fromkeys(row["_clip"] for row in rows))
    key_of = {clip: cache_key(captioner_id, clip) for clip in clips}
    missing = [clip for clip in clips if key_of[clip] not in captions]
    errors: dict[str, str] = {}
    if missing:
        made = captioner(missing)
        captions.put({key_of[c]: made[c]["caption"] for c in missing if made.get(c, {}).get("caption") is not None})
        errors = {c: str(made.get(c, {}).get("error") or "no caption returned") for c in missing
                  if made.get(c, {}).get("caption") is None}  # not cached: a rerun tries the clip again

    asks: dict[str, Ask] = {}
    for row in rows:
        if row["_clip"] not in errors:
            ask = Ask(captions[key_of[row["_clip"]]], row["question"], tuple(row["choices"]))
            asks.setdefault(cache_key(judge.identity, PROMPT_VERSION, ask.caption, ask.question, ask.choices), ask)
    # only letters are kept: no answer and invalid replies are asked again by a rerun (an old cache's null too)
    unasked = [key for key in asks if answers.values.get(key) is None]
    fresh: dict[str, str | Invalid | None] = {}
    tally = ReplyTally(f"benchmark judge {judge.identity}")
    for start in range(0, len(unasked), ASK_CHUNK):  # kept chunk by chunk: a judge that fails costs one chunk
        chunk = unasked[start : start + ASK_CHUNK]
        chosen = dict(zip(chunk, judge.choose([asks[k] for k in chunk])))
        fresh.update(chosen)
        answers.put({k: v for k, v in chosen.items() if isinstance(v, str)})
        tally.record(list(chosen.values()))  # stops past the invalid share (agentcap.judges.replies)

    items = []
    for row in rows:
        item = {"id": row["id"], **{g: row.get(g) for g in GROUPS}, "audio": row["audio"],
                "question": row["question"], "choices": row["choices"], "answer": row["answer"]}
        if row["_clip"] in errors:
            item.update(caption=None, letter=None, correct=False, error=errors[row["_clip"]])
        else:
            caption = captions[key_of[row["_clip"]]]
            key = cache_key(judge.identity, PROMPT_VERSION, caption, row["question"], tuple(row["choices"]))
            letter = fresh[key] if key in fresh else answers.values.get(key)
            if isinstance(letter, Invalid):
                item.update(caption=caption, letter=None, correct=False, invalid=letter.reason)
            else:
                item.update(caption=caption, letter=letter, correct=letter == row["answer"])
        items.append(item)
    summary = {"judge": judge.identity, "prompt_version": PROMPT_VERSION, **accuracy_report(items),
               "failed_clips": len(errors)}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "benchmark_items.jsonl"), "w", encoding="utf-8") as handle:
        for item in items:
            handle.write(json.dumps(item) + "\n")
    with open(os.path.join(out_dir, "benchmark_summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    return summary


@dataclass
class BenchmarkConfig:
    """``--model.benchmark``: every greedy ``evaluate`` stage also reports caption-as-evidence accuracy
    on this benchmark, with the protocol and code of ``agentcap evaluate --benchmark`` (ACE-Cap Fig. 4
    reports it per stage).

    Args:
        path: a benchmark manifest (docs/data.md), e.g. ``data/toy_soundscapes/benchmark.jsonl``.
        judge: ``rule``, a model folder, ``URL#MODEL`` or a JSON object ``{url, model}`` (``--judge``).
        limit: ask at most this many questions, the file's first (None: all).
    """

    path: str
    judge: str = "rule"
    limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("path", "judge"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"--model.benchmark.{name} must be a non-empty string, got {value!r}")
        check("--model.benchmark.limit", self.limit, "≥ 1")


def stage_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """An ``evaluate_benchmark`` summary as an evaluate stage's metrics: ``benchmark/accuracy`` and
    ``benchmark/<category>`` for each category the questions name."""
    by_category = summary["by"].get("category", {})
    return {"benchmark/accuracy": float(summary["overall"]["accuracy"]),
            **{f"benchmark/{name}": float(tally["accuracy"]) for name, tally in by_category.items()}}


def _tally(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    correct = sum(bool(i["correct"]) for i in items)
    return {"count": len(items), "correct": correct, "accuracy": correct / len(items) if items else float("nan")}


def accuracy_report(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Accuracy overall and per value of each of :data:`GROUPS` (count, correct, accuracy each). A
    question whose clip could not be captioned counts as wrong and is counted under ``uncaptioned``;
    one the judge left unanswered counts as wrong and under ``unanswered``, one whose reply was
    invalid (:mod:`agentcap.judges.replies`) as wrong and under ``invalid``."""
    by: dict[str, dict[str, Any]] = {}
    for group in GROUPS:
        values = sorted({i[group] for i in items if i.get(group) is not None})
        if values:
            by[group] = {v: _tally([i for i in items if i.get(group) == v]) for v in values}
    return {
        "overall": _tally(items), "by": by,
        "uncaptioned": sum(i.get("caption") is None for i in items),
        "unanswered": sum(i.get("caption") is not None and i.get("letter") is None and "invalid" not in i
                          for i in items),
        "invalid": sum("invalid" in i for i in items),
    }


def benchmark_table(summary: Mapping[str, Any], title: str = "caption-as-evidence accuracy") -> str:
    """The summary as plain text: one line overall, then one per group value."""
    lines = [("all", "", summary["overall"])]
    for group, values in summary["by"].items():
        lines += [(group, value, tally) for value, tally in values.items()]
    rows = [("group", "value", "n", "accuracy")] + [
        (g, str(v), str(t["count"]), f"{100 * t['accuracy']:.1f}%") for g, v, t in lines
    ]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    text = [" | ".join(cell.rjust(w) if c >= 2 else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths)))
            for r in rows]
    notes = [f"judge {summary['judge']}, prompt {summary['prompt_version']}"]
    if summary.get("uncaptioned"):
        notes.append(f"{summary['uncaptioned']} questions without a caption ({summary['failed_clips']} clips "
                     "failed), counted wrong")
    if summary.get("unanswered"):
        notes.append(f"{summary['unanswered']} questions the judge left unanswered, counted wrong")
    if summary.get("invalid"):
        notes.append(f"{summary['invalid']} questions with an invalid judge reply (asked again by a rerun), "
                     "counted wrong")
    return "\n".join([title, text[0], "-+-".join("-" * w for w in widths), *text[1:], *notes])
