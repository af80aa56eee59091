"""``agentcap data bank``: a validated cloze / MCQ bank for each clip of a manifest (AudioMap ESR,
ACE-Cap G2P).

    agentcap data bank --manifest train.jsonl --out bank.jsonl --writer http://HOST:8000/v1 --model NAME
    agentcap data bank --manifest train.jsonl --out bank.jsonl --writer hf:models/qwen-instruct
    agentcap data bank --manifest train.jsonl --out bank.jsonl --writer rule

Every item is validated; rejected ones go to ``bank.rejected.jsonl`` with their reasons. The bank is
written a clip at a time: rerun the same command after a kill or a server failure and it asks only
the clips not yet finished (``bank.progress.jsonl``). The counts of kept and rejected items and
clips are printed and written to ``bank.report.json``. Exit status 1 when the writer stopped early.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentcap.core.manifests import read_manifest
from agentcap.data.question_bank import (
    DEFAULT_VOCAB,
    FIELDS,
    build_bank,
    hf_writer,
    rule_writer,
    served_writer,
)
from agentcap.judges.served import ServedClient


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentcap data bank", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", required=True, help="JSONL of (audio, gold caption) rows")
    p.add_argument("--out", required=True, help="JSONL bank: the input rows with their kept items")
    p.add_argument("--writer", required=True,
                   help="rule | hf:PATH (local HF causal LM) | http://HOST:PORT/v1 (OpenAI-compatible server)")
    p.add_argument("--model", help="the served model name (required with an http writer)")
    p.add_argument("--rejected", default=None, help="JSONL of rejected items (default: beside --out)")
    p.add_argument("--fields", nargs="+", default=["cloze", "mcq"], choices=FIELDS,
                   help="where the kept items go: cloze (ClozeCaption), mcq (EvidenceGame), qa (its warm start)")
    p.add_argument("--batch-size", type=int, default=8, help="requests in flight (http) or prompts per generate (hf)")
    p.add_argument("--max-new-tokens", type=int, default=384, help="room for ~4 JSON items")
    p.add_argument("--temperature", type=float, default=0.0, help="http writer; 0 = greedy")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (http writer)")
    p.add_argument("--retries", type=int, default=3, help="further attempts per failed request (http writer)")
    p.add_argument("--api-key", default=None, help="bearer token for the server (http writer)")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside an hf: folder")
    p.add_argument("--vocab", default=None, help="JSON {class: [values]} for the rule writer (default: toy world)")
    p.add_argument("--subject-class", default="type", help="vocabulary class naming the sound (meta.subject)")
    p.add_argument("--audio-field", default="audio")
    p.add_argument("--caption-field", default="caption")
    p.add_argument("--id-field", default="id", help="clip id (default: the audio path when a row has none)")
    return p


def make_writer(args: argparse.Namespace):
    spec = args.writer
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if spec == "rule":
        try:
            vocab = json.loads(Path(args.vocab).read_text(encoding="utf-8")) if args.vocab else DEFAULT_VOCAB
        except (OSError, ValueError) as err:
            raise ValueError(f"--vocab {args.vocab}: not a readable JSON {{class: [values]}} file ({err})") from None
        return rule_writer(vocab, args.subject_class)
    if spec.startswith("hf:"):
        return hf_writer(spec[3:], args.gguf_file, args.batch_size, args.max_new_tokens)
    if spec.startswith(("http://", "https://")):
        if not args.model:
            raise ValueError(f"--writer {spec} needs --model NAME (the server's served model name)")
        client = ServedClient(spec, args.model, timeout=args.timeout, retries=args.retries,
                              batch_size=args.batch_size, api_key=args.api_key)
        return served_writer(client, args.max_new_tokens, args.temperature)
    raise ValueError(f"--writer {spec!r}: expected rule, hf:PATH or http://HOST:PORT/v1")


def bank_command(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        rows = read_manifest(args.manifest, {args.audio_field: str, args.caption_field: str})
        writer = make_writer(args)
        name = args.writer if not args.model else f"{args.writer} ({args.model})"
        report = build_bank(args.manifest, rows, writer, args.out, args.rejected, args.fields, args.audio_field,
                            args.caption_field, args.id_field, writer_name=name)
    except ValueError as err:  # a bad argument, manifest, vocabulary or progress file: before any request
        print(f"agentcap data bank: {err}", file=sys.stderr)
        return 2
    print(summary(report), file=sys.stderr)
    if not report["complete"]:
        print(f"agentcap data bank: the writer stopped early ({report.get('error')}); rerun the same command "
              f"to ask the other {report['clips'] - report['clips_done']} clips", file=sys.stderr)
        return 1
    return 0


def summary(report: dict) -> str:
    return (f"agentcap data bank: {report['clips_done']} of {report['clips']} clips done "
            f"({report['asked']} asked now, {report['resumed']} before): {report['clips_kept']} clips with "
            f"{report['items_kept']} items kept in {report['out']}; {report['clips_rejected']} clips without "
            f"a valid item, {report['items_rejected']} items rejected in {report['rejected']}")
