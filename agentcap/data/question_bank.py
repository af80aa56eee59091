"""Build a validated cloze bank (AudioMap ESR, ACE-Cap G2P) from (audio, gold caption) pairs.

Why: the evidence rewards are only as good as their question bank. An item with two golds, a gold
"Not given", a repeated option or a masked fact that the caption never states would reward the
wrong captions, so every item — whoever wrote it — passes :func:`validate_cloze_item` before it
is kept; rejected items go to a separate file with their reasons, so nothing is lost silently.

Three writers (``agentcap data bank --writer``, see :mod:`agentcap.commands.bank`):
- ``http://HOST:PORT/v1`` (with ``--model NAME``): an OpenAI-compatible server (``vllm serve``)
  writes items for audible facts of each caption as JSON, ``--batch-size`` requests in flight;
- ``hf:PATH``: the same prompt to a local HF causal LM in this process (optional ``--gguf-file``);
- ``rule``: deterministic, offline — every attribute word of a vocabulary (``--vocab`` JSON
  ``{"class": ["value", ...]}``, default: the toy soundscape world's classes) found in a caption
  sentence is masked, with three distractors from the same class.

A bank is written a clip at a time and resumes: a killed run, rerun, asks only the clips it has not
finished (:func:`build_bank`). Each output row is the input row with its ``id`` and the kept items
under ``cloze`` (ClozeCaption) and ``mcq`` (EvidenceGame); clips with no valid item are left out
(both environments refuse an empty bank) and filed in the rejected file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentcap.agents.literal import literal
from agentcap.agents.pretrained import load_causal_lm
from agentcap.core.manifests import resolve
from agentcap.judges.causal_lm import CausalLMJudge
from agentcap.judges.questions import BLANK, LETTERS, NOT_GIVEN, question_problems, sentences
from agentcap.judges.served import JudgeUnavailable, ServedClient

#: The toy soundscape world's attribute classes (agentcap_envs.toy.soundscapes); ``type`` names the
#: sound, so it is also the item's ``meta["subject"]``.
DEFAULT_VOCAB: dict[str, list[str]] = {
    "type": ["beep", "buzz", "hiss", "knock", "chirp"],
    "pitch": ["low", "mid", "high", "very high"],
    "loudness": ["very soft", "soft", "loud", "very loud"],
    "count": ["once", "twice", "three times", "four times"],
}

WRITER_PROMPT = """Write fill-in-the-blank questions about audible facts in this audio caption.
For each fact (a sound, its pitch, loudness, count, timing, speech content, ...), copy one sentence
of the caption with the fact replaced by ___ (exactly one blank), and give five options: A-D are
the true fact and three plausible wrong values of the same kind, in random order, and E is
"Not given". Reply with only a JSON list like
[{{"passage": "A dog barks ___ times.", "options": ["two", "three", "five", "six", "Not given"], "answer": "B"}}]

Caption: {caption}"""


def _phrase(text: str) -> re.Pattern[str]:
    words = r"\s+".join(re.escape(w) for w in text.split())
    return re.compile(rf"(?<![\w-]){words}(?![\w-])", re.IGNORECASE)


def validate_cloze_item(item: Any, caption: str) -> list[str]:
    """Why ``item`` is not a usable cloze item for ``caption``; an empty list means it is valid.

    Checks: a JSON object with a passage holding exactly one blank ``___``, five distinct options
    with E = "Not given", one gold letter in A–D, and the gold option's text present in the caption
    (whole words, any case) but absent from the passage (which would give the answer away).
    """
    if not isinstance(item, Mapping):
        return [f"item must be a JSON object, got {item!r}"]
    missing = [name for name in ("passage", "options", "answer") if name not in item]
    if missing:
        return [f"missing field(s) {missing} (item has {sorted(item)})"]
    passage, options, answer = item["passage"], item["options"], item["answer"]
    if isinstance(answer, str):
        answer = answer.strip().upper()
    if not isinstance(options, (list, tuple)):
        return [f"field 'options' must be a list of 5 strings, got {options!r}"]
    reasons = question_problems(passage, options, answer, item.get("meta"))
    if isinstance(passage, str):
        blanks = len(BLANK.findall(passage))
        if blanks != 1:
            reasons.append(f"field 'passage' must contain exactly one blank '___', got {blanks}: {passage!r}")
    if answer in LETTERS[:4] and len(options) == 5 and isinstance(options[LETTERS.index(answer)], str):
        gold = options[LETTERS.index(answer)].strip()
        if gold and not _phrase(gold).search(caption):
            reasons.append(f"gold option {answer} {gold!r} (the masked fact) does not occur in the caption")
        if gold and isinstance(passage, str) and _phrase(gold).search(passage):
            reasons.append(f"field 'passage' already contains the gold option {gold!r}")
    return reasons


# --- rule writer -------------------------------------------------------------------------------------
def _rng(*parts: Any) -> random.Random:
    """A generator seeded by the text it serves, so a caption's items do not depend on file order."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def check_vocab(vocab: Mapping[str, Sequence[str]], subject_class: str | None) -> None:
    for name, values in vocab.items():
        if len(set(values)) < 4:
            raise ValueError(
                f"vocabulary class {name!r} needs >= 4 distinct values (gold + 3 distractors), got {list(values)}"
            )
    if subject_class is not None and subject_class not in vocab:
        raise ValueError(f"--subject-class {subject_class!r} is not a vocabulary class (have {sorted(vocab)})")


def rule_items(caption: str, vocab: Mapping[str, Sequence[str]], subject_class: str | None = "type") -> list[dict]:
    """One item per vocabulary word found in a caption sentence (longest value wins an overlap)."""
    values = sorted(((v, c) for c, vs in vocab.items() for v in vs), key=lambda vc: -len(vc[0]))
    items = []
    for sentence in sentences(caption):
        found: list[tuple[int, int, str, str]] = []
        for value, cls in values:
            for match in _phrase(value).finditer(sentence):
                if not any(match.start() < e and s < match.end() for s, e, _, _ in found):
                    found.append((match.start(), match.end(), value, cls))
        found.sort()
        subject = next((v for _, _, v, c in found if c == subject_class), None)
        for start, end, value, cls in found:
            rng = _rng(caption, sentence, start, value)
            distractors = rng.sample(sorted(set(vocab[cls]) - {value}), 3)
            options = [value, *distractors]
            rng.shuffle(options)
            meta = {"attribute": cls}
            if subject is not None:
                meta["subject"] = subject
            items.append({
                "passage": sentence[:start] + "___" + sentence[end:],
                "options": [*options, NOT_GIVEN],
                "answer": LETTERS[options.index(value)],
                "meta": meta,
            })
    return items


# --- LLM writer --------------------------------------------------------------------------------------
_JSON_START = re.compile(r"[\[{]")


def items_from_text(text: str) -> list[Any]:
    """The JSON items in an LLM reply: the first parseable list holding an object, else every
    parseable object (so a reply cut off inside its list still yields its complete items). A list
    of plain values (an options list echoed outside its item) is not taken for the item list."""
    decoder = json.JSONDecoder()
    objects: list[Any] = []
    position = 0
    while True:
        found = _JSON_START.search(text, position)
        if found is None:
            return objects
        try:
            value, position = decoder.raw_decode(text, found.start())
        except json.JSONDecodeError:
            position = found.start() + 1
            continue
        if isinstance(value, dict):
            objects.append(value)
        elif any(isinstance(v, dict) for v in value):
            return value


def writer_prompt(caption: str) -> str:
    return WRITER_PROMPT.format(caption=caption)


#: A writer: captions → ``(index, reply, items)`` per caption, in caption order (a failing writer may
#: skip an index and raise after the answered ones, so they are kept); ``reply`` is "" for the rule writer.
Writer = Callable[[Sequence[str]], Iterator[tuple[int, str, list[Any]]]]


def rule_writer(vocab: Mapping[str, Sequence[str]], subject_class: str | None = "type") -> Writer:
    check_vocab(vocab, subject_class)

    def write(captions: Sequence[str]) -> Iterator[tuple[int, str, list[Any]]]:
        for index, caption in enumerate(captions):
            yield index, "", rule_items(caption, vocab, subject_class)

    return write


def hf_writer(path: str, gguf_file: str | None, batch_size: int, max_new_tokens: int) -> Writer:
    """A local HF causal LM in this process; ``batch_size`` captions per ``generate`` call, each
    batch yielded (and so written) before the next is generated."""
    model, tokenizer = load_causal_lm(path, gguf_file=gguf_file)
    judge = CausalLMJudge(model, tokenizer, batch_size=batch_size)

    def write(captions: Sequence[str]) -> Iterator[tuple[int, str, list[Any]]]:
        for first in range(0, len(captions), batch_size):
            prompts = [judge.render(writer_prompt(c), answer_cue="JSON:") for c in captions[first:first + batch_size]]
            for offset, reply in enumerate(judge.generate(prompts, max_new_tokens=max_new_tokens)):
                yield first + offset, reply, items_from_text(reply)

    return write


def served_writer(client: ServedClient, max_new_tokens: int, temperature: float = 0.0) -> Writer:
    """An OpenAI-compatible server (``vllm serve``) through ``client``: ``client.batch_size`` chat
    requests in flight (the server batches them), replies taken in caption order. A request that
    fails (server gone after the client's retries, or a refusal) stops new requests; the captions
    already answered are still yielded, then the error is raised, so a rerun asks only the rest."""

    def ask(caption: str) -> str:
        payload = {"model": client.model, "messages": [{"role": "user", "content": literal(writer_prompt(caption))}],
                   "max_tokens": max_new_tokens, "temperature": temperature}
        reply = client.post("/chat/completions", payload)
        try:
            return reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"writer server {client.url}/chat/completions: the reply has no "
                             f"choices[0].message.content (is it OpenAI-compatible?): {str(reply)[:300]}") from None

    def write(captions: Sequence[str]) -> Iterator[tuple[int, str, list[Any]]]:
        pool = ThreadPoolExecutor(max_workers=client.batch_size)
        pending: deque[tuple[int, Future]] = deque()
        queue = iter(enumerate(captions))
        error: Exception | None = None
        try:
            while True:
                # two batches queued: the workers stay busy while the oldest request is awaited
                while error is None and len(pending) < 2 * client.batch_size:
                    nxt = next(queue, None)
                    if nxt is None:
                        break
                    pending.append((nxt[0], pool.submit(ask, nxt[1])))
                if not pending:
                    break
                index, future = pending.popleft()
                if future.cancelled():
                    continue
                try:
                    reply = future.result()
                except (JudgeUnavailable, ValueError) as err:
                    if error is None:
                        error = err
                        for _, later in pending:
                            later.cancel()
                    continue
                yield index, reply, items_from_text(reply)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if error is not None:
            raise error

    return write


# --- building a bank, resumably ------------------------------------------------------------------
def bank_paths(out: str | Path, rejected: str | Path | None = None) -> dict[str, Path]:
    """The files of a bank beside ``out`` (``bank.jsonl``): ``bank.rejected.jsonl`` (unless given),
    ``bank.progress.jsonl`` (one line per finished clip: what a rerun skips) and ``bank.report.json``."""
    out = Path(out)
    stem = str(out.with_suffix("")) if out.suffix == ".jsonl" else str(out)
    return {"out": out, "rejected": Path(rejected) if rejected else Path(stem + ".rejected.jsonl"),
            "progress": Path(stem + ".progress.jsonl"), "report": Path(stem + ".report.json")}


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON rows of a file this builder appends to. A kill mid-write leaves a torn last line: it
    is dropped; a bad line before the last is an error naming the file and line."""
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"expected a JSON object, got {type(row).__name__}")
        except ValueError as err:
            if number == len(lines):
                print(f"{path}:{number}: dropping a torn last line (an interrupted write)", file=sys.stderr)
                break
            raise ValueError(f"{path}:{number}: not a JSON row this bank builder wrote ({err}); "
                             f"delete {path} to start over") from None
        rows.append(row)
    return rows


def _rewrite(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Replace ``path`` by ``rows`` atomically (a kill now leaves the old or the new file, whole)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    os.replace(tmp, path)


def _resume(paths: dict[str, Path], ids: Sequence[str], manifest: str) -> dict[str, dict[str, Any]]:
    """The finished clips of an earlier run (``id`` → its progress row), with the bank and rejected
    files cut back to exactly those clips (a clip written after its last progress line is asked
    again); no progress file: a fresh start, and old bank files are emptied."""
    if not paths["progress"].exists():
        for key in ("out", "rejected"):
            _rewrite(paths[key], [])
        return {}
    done = {row["id"]: row for row in _read_lines(paths["progress"])}
    unknown = sorted(set(done) - set(ids))
    if unknown:
        raise ValueError(f"{paths['progress']}: clip id(s) {unknown[:5]} are not in the manifest {manifest}; this "
                         f"progress file belongs to another bank: choose another --out or delete it to start over")
    for key in ("out", "rejected"):
        _rewrite(paths[key], [row for row in _read_lines(paths[key]) if row.get("id") in done])
    _rewrite(paths["progress"], list(done.values()))
    return done


def clip_ids(rows: Sequence[Mapping[str, Any]], id_field: str, audio_field: str) -> list[str]:
    """Each row's clip id (``id_field``, else its audio path): what a rerun skips, so it must be unique."""
    ids, first = [], {}
    for row in rows:
        clip = row.get(id_field, row[audio_field])
        if not isinstance(clip, str) or not clip:
            raise ValueError(f"{row['_where']}: field {id_field!r} must be a non-empty string, got {clip!r}")
        if clip in first:
            raise ValueError(f"{row['_where']}: clip id {clip!r} repeats {first[clip]}; a bank needs unique clip ids")
        first[clip] = row["_where"]
        ids.append(clip)
    return ids


def qa_pairs(items: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Question–answer pairs for the evidence game's warm start: an item's passage asked as a
    question, answered by the passage with its gold filled in (a sentence of the gold caption)."""
    pairs = []
    for item in items:
        gold = item["options"][LETTERS.index(item["answer"])]
        pairs.append({"question": f"What fills the blank: {item['passage']}",
                      "answer": BLANK.sub(lambda _: gold, item["passage"], count=1)})
    return pairs


def _bank_row(row: Mapping[str, Any], clip: str, kept: list[dict], fields: Sequence[str], audio_field: str,
              out_dir: Path) -> dict[str, Any]:
    """The input row (private ``_`` keys dropped) with its id, its audio path relative to the bank's
    folder (manifests resolve relative paths from their own folder), and the kept items."""
    data = {key: value for key, value in row.items() if not key.startswith("_")}
    data["id"] = clip
    audio = row[audio_field]
    if not os.path.isabs(audio):
        data[audio_field] = os.path.relpath(resolve(audio, row.get("_manifest")), out_dir)
    for name in fields:
        data[name] = qa_pairs(kept) if name == "qa" else kept
    return data


def _clean(item: Mapping[str, Any]) -> dict[str, Any]:
    """A valid item as the environments read it: its four fields, the answer letter normalised."""
    kept = {"passage": item["passage"], "options": list(item["options"]), "answer": item["answer"].strip().upper()}
    if item.get("meta"):
        kept["meta"] = item["meta"]
    return kept


FIELDS = ("cloze", "mcq", "qa")


def build_bank(manifest: str, rows: Sequence[Mapping[str, Any]], write: Writer, out: str | Path,
               rejected: str | Path | None = None, fields: Sequence[str] = ("cloze", "mcq"),
               audio_field: str = "audio", caption_field: str = "caption", id_field: str = "id",
               writer_name: str = "") -> dict[str, Any]:
    """Write the bank of ``rows`` (read from ``manifest``) with ``write``, a clip at a time, resuming.

    Per clip, flushed in this order: its rejected items (``{"id", "where", "audio", "item",
    "reasons"}``), its bank row (only when an item was kept: the environments refuse an empty bank),
    then its progress line. A rerun keeps the clips with a progress line and asks only the others.
    Returns the report (also written to ``bank.report.json``); when the writer stops early (server
    gone, request refused) it has ``complete: false`` and the ``error``. Anything else (a kill, a bug)
    is raised after the report is written.
    """
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown or not fields:
        raise ValueError(f"--fields {list(fields)}: choose among {list(FIELDS)}")
    paths = bank_paths(out, rejected)
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    ids = clip_ids(rows, id_field, audio_field)
    done = _resume(paths, ids, manifest)
    todo = [i for i, clip in enumerate(ids) if clip not in done]
    report: dict[str, Any] = {"manifest": str(manifest), "writer": writer_name, "clips": len(rows),
                              "resumed": len(done), "asked": 0}
    out_dir = paths["out"].resolve().parent
    error: BaseException | None = None
    with (open(paths["out"], "a", encoding="utf-8") as bank, open(paths["rejected"], "a", encoding="utf-8") as bad,
          open(paths["progress"], "a", encoding="utf-8") as progress):
        try:
            for index, reply, items in write([rows[i][caption_field] for i in todo]):
                row, clip = rows[todo[index]], ids[todo[index]]
                caption, audio = row[caption_field], row[audio_field]
                kept, lines = [], []
                if not items:
                    reason = "the writer produced no items" + (f"; its reply was {reply[:200]!r}" if reply else "")
                    lines.append({"id": clip, "where": row["_where"], "audio": audio, "item": None,
                                  "reasons": [reason]})
                for item in items:
                    reasons = validate_cloze_item(item, caption)
                    if reasons:
                        lines.append({"id": clip, "where": row["_where"], "audio": audio, "item": item,
                                      "reasons": reasons})
                    else:
                        kept.append(_clean(item))
                bad.writelines(json.dumps(line) + "\n" for line in lines)
                bad.flush()
                if kept:
                    bank.write(json.dumps(_bank_row(row, clip, kept, fields, audio_field, out_dir)) + "\n")
                    bank.flush()
                rejected_items = len(lines) - (not items)
                done[clip] = {"id": clip, "kept": len(kept), "rejected": rejected_items}
                progress.write(json.dumps(done[clip]) + "\n")
                progress.flush()
                report["asked"] += 1
        except BaseException as err:  # a writer failure or a kill: report what is done, then stop
            error = err
    report.update({
        "complete": len(done) == len(rows),
        "clips_done": len(done),
        "clips_kept": sum(1 for d in done.values() if d["kept"]),
        "clips_rejected": sum(1 for d in done.values() if not d["kept"]),
        "items_kept": sum(d["kept"] for d in done.values()),
        "items_rejected": sum(d["rejected"] for d in done.values()),
        **{key: str(path) for key, path in paths.items() if key != "report"},
    })
    if error is not None:
        report["error"] = f"{type(error).__name__}: {error}"
    paths["report"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if error is not None and not isinstance(error, (JudgeUnavailable, ValueError)):
        raise error  # a kill or a bug: the report is written, the traceback still shown
    return report
