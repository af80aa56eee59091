"""Build a validated cloze bank (AudioMap ESR, ACE-Cap G2P) from (audio, gold caption) pairs.

Why: the evidence rewards are only as good as their question bank. An item with two golds, a gold
"Not given", a repeated option or a masked fact that the caption never states would reward the
wrong captions, so every item — whoever wrote it — passes :func:`validate_cloze_item` before it
is kept; rejected items go to a separate file with their reasons, so nothing is lost silently.

Two writers:
- ``--model PATH``: an instruction-following HF causal LM (local folder, optional ``--gguf-file``)
  writes items for audible facts of each caption as JSON;
- ``--rule``: deterministic, offline — every attribute word of a vocabulary (``--vocab`` JSON
  ``{"class": ["value", ...]}``, default: the toy soundscape world's classes) found in a caption
  sentence is masked, with three distractors from the same class.

    python tools/build_cloze_bank.py --input train.jsonl --out bank.jsonl --rejected rejected.jsonl --rule

Input rows carry ``audio`` and ``caption`` (names set by ``--audio-field`` / ``--caption-field``).
Each output row is ``{"audio", "caption", "cloze": [items]}``; each rejected line is
``{"where", "audio", "item", "reasons"}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentcap.core.manifests import read_manifest
from agentcap.judges.examiner import BLANK, LETTERS, NOT_GIVEN, question_problems, sentences

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


def llm_replies(model, tokenizer, captions: Sequence[str], batch_size: int, max_new_tokens: int) -> list[str]:
    from agentcap.judges.examiner import CausalLMJudge

    writer = CausalLMJudge(model, tokenizer, batch_size=batch_size)
    prompts = [writer.render(WRITER_PROMPT.format(caption=c), answer_cue="JSON:") for c in captions]
    return writer.generate(prompts, max_new_tokens=max_new_tokens)


# --- CLI ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="JSONL of (audio, gold caption) rows")
    parser.add_argument("--out", required=True, help="JSONL of accepted banks, one row per input row")
    parser.add_argument("--rejected", required=True, help="JSONL of rejected items with their reasons")
    writer = parser.add_mutually_exclusive_group(required=True)
    writer.add_argument("--model", help="local folder of an instruction-following HF causal LM")
    writer.add_argument("--rule", action="store_true", help="mask vocabulary words deterministically (offline)")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --model")
    parser.add_argument("--vocab", default=None, help="JSON {class: [values]} for --rule (default: toy world)")
    parser.add_argument("--subject-class", default="type", help="vocabulary class naming the sound (meta.subject)")
    parser.add_argument("--audio-field", default="audio")
    parser.add_argument("--caption-field", default="caption")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=384, help="room for ~4 JSON items")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    args = build_parser().parse_args(argv)
    rows = read_manifest(args.input, {args.audio_field: str, args.caption_field: str})
    captions = [row[args.caption_field] for row in rows]
    if args.rule:
        vocab = json.loads(Path(args.vocab).read_text(encoding="utf-8")) if args.vocab else DEFAULT_VOCAB
        check_vocab(vocab, args.subject_class)
        drafts = [rule_items(c, vocab, args.subject_class) for c in captions]
        replies = [""] * len(rows)
    else:
        from agentcap.judges.examiner import load_causal_lm

        model, tokenizer = load_causal_lm(args.model, gguf_file=args.gguf_file)
        replies = llm_replies(model, tokenizer, captions, args.batch_size, args.max_new_tokens)
        drafts = [items_from_text(reply) for reply in replies]
    counts = {"rows": len(rows), "accepted": 0, "rejected": 0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.rejected).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as out, open(args.rejected, "w", encoding="utf-8") as bad:
        for row, caption, items, reply in zip(rows, captions, drafts, replies):
            kept = []
            if not items:
                reason = "the writer produced no items" + (f"; its reply was {reply[:200]!r}" if reply else "")
                bad.write(json.dumps({"where": row["_where"], "audio": row[args.audio_field], "item": None,
                                      "reasons": [reason]}) + "\n")
                counts["rejected"] += 1
            for item in items:
                reasons = validate_cloze_item(item, caption)
                if reasons:
                    bad.write(json.dumps({"where": row["_where"], "audio": row[args.audio_field], "item": item,
                                          "reasons": reasons}) + "\n")
                    counts["rejected"] += 1
                else:
                    kept.append({**item, "answer": item["answer"].strip().upper()})
            counts["accepted"] += len(kept)
            out.write(json.dumps({"audio": row[args.audio_field], "caption": caption, "cloze": kept}) + "\n")
    print(f"{counts['rows']} captions: {counts['accepted']} items kept in {args.out}, "
          f"{counts['rejected']} rejected in {args.rejected}", file=sys.stderr)
    return counts


if __name__ == "__main__":
    main()
