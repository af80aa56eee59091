"""``agentcap data``: ``convert`` a public dataset release to an agentcap manifest, or build a
question ``bank`` for one (convert → bank → fit; see docs/data.md).

    agentcap data convert --from clotho --input clotho_captions_development.csv \\
        --root clotho/development --out data/clotho/train.jsonl
    agentcap data bank --manifest data/clotho/train.jsonl --out data/clotho/train.bank.jsonl …
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

#: ``agentcap data bank`` lives in its own module, imported only when used.
BANK_COMMAND = "agentcap.commands.bank:bank_command"

#: How many refusal reasons the console shows (all of them are in ``*.refused.jsonl``).
SHOWN_REASONS = 5


def data_command(argv: list[str]) -> int:
    """``agentcap data {convert,bank} …``: dispatch to the subcommand."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: agentcap data {convert,bank} ...\n\n"
              "  convert  a public dataset release (AudioCaps, Clotho, WavCaps, MMAU, MMAR, MMSU, MAD, CMD-AD,\n"
              "           TV-AD) to an agentcap manifest; `agentcap data convert --help`\n"
              "  bank     write a validated cloze / MCQ question bank for a caption manifest")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "convert":
        return convert_command(rest)
    if name == "bank":
        module, function = BANK_COMMAND.split(":")
        try:
            command = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as err:
            print(f"agentcap data bank: not available in this install ({err})", file=sys.stderr)
            return 2
        return command(rest)
    print(f"agentcap data: unknown subcommand {name!r}; expected convert or bank", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    from agentcap.data.convert import ADAPTERS

    parser = argparse.ArgumentParser(
        prog="agentcap data convert",
        description="Convert a public dataset release to an agentcap manifest. Every row is checked; refused "
                    "rows and their reasons go to <out>.refused.jsonl. See docs/data.md for each format.",
    )
    parser.add_argument("--from", dest="fmt", required=True, choices=sorted(ADAPTERS), help="the release's format")
    parser.add_argument("--input", required=True, nargs="+", help="the release's metadata file(s) (CSV / JSON)")
    parser.add_argument("--root", required=True,
                        help="folder the audio / feature files are under; paths may not leave it")
    parser.add_argument("--out", required=True, help="the manifest to write (JSONL); never one of the inputs")
    parser.add_argument("--map", default=None,
                        help="rename source columns: field=column,… (e.g. movie=imdbid,text=ad for a CMD-AD CSV)")
    parser.add_argument("--audio-name", default=None,
                        help="audio file name template over the row's fields, relative to --root "
                             "(audiocaps: {youtube_id}_{start_time}.wav; wavcaps: {stem}.flac)")
    parser.add_argument("--features", default=None,
                        help="MAD / CMD-AD / TV-AD: per-movie frame features under --root, a folder of "
                             "<movie>.npy or an .h5 file with a dataset per movie")
    parser.add_argument("--fps", type=float, default=5.0, help="frames per second of --features (MAD: 5)")
    parser.add_argument("--context", type=int, default=3, help="previous ADs kept as a clip's context (READ: 3)")
    parser.add_argument("--decode", action="store_true",
                        help="decode every audio file (refuses truncated ones now; slower than reading headers)")
    return parser


def convert_command(argv: list[str]) -> int:
    """Exit 0 when rows were kept, 1 when every row was refused, 2 on a usage error."""
    from agentcap.data.convert import Options, adapter
    from agentcap.commands.outputs import lock_output
    from agentcap.data.convert.common import check_outputs, parse_map, refused_path, write_jsonl

    args = build_parser().parse_args(argv)
    prog = "agentcap data convert"
    try:
        missing = [path for path in args.input if not os.path.isfile(path)]
        if missing:
            raise ValueError(f"--input: file(s) not found: {missing}")
        if not os.path.isdir(args.root):
            raise ValueError(f"--root: {args.root} is not a folder")
        if args.fps <= 0 or args.context < 0:
            raise ValueError(f"--fps must be > 0 and --context >= 0, got {args.fps} and {args.context}")
        check_outputs(args.out, args.input)
        options = Options(root=args.root, out=args.out, columns=parse_map(args.map), audio_name=args.audio_name,
                          features=args.features, fps=args.fps, context=args.context, decode=args.decode)
        result = adapter(args.fmt)(list(args.input), options)
    except ValueError as err:  # ManifestError is one: a header or a whole file that cannot be read
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    refusals = refused_path(args.out)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        held = lock_output(prog, "--out", args.out)  # a second converter writing the same --out is refused
    except SystemExit as refused:
        print(refused, file=sys.stderr)
        return 2
    try:
        write_jsonl(args.out, result.rows)
        write_jsonl(refusals, result.refused)
    finally:
        os.remove(args.out + ".partial")  # the empty lock file, removed while held
        os.close(held)
    print(f"{prog} --from {args.fmt}: {len(result.rows)} rows kept → {args.out}; "
          f"{len(result.refused)} refused → {refusals}", file=sys.stderr)
    for entry in result.refused[:SHOWN_REASONS]:
        print(f"  refused: {entry['reason']}", file=sys.stderr)
    if len(result.refused) > SHOWN_REASONS:
        print(f"  … {len(result.refused) - SHOWN_REASONS} more in {refusals}", file=sys.stderr)
    print(json.dumps({"kept": len(result.rows), "refused": len(result.refused)}))
    return 0 if result.rows else 1
