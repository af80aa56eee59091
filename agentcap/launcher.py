"""The ``agentcap`` command's front door: ``--help``, the list of commands and typos are answered here
without importing torch or Lightning (seconds on a busy machine); everything else runs in ``agentcap.cli``.

``agentcap fit --help`` is a short page: agentcap's own options and the model's (read from the
sources of ``agentcap/cli.py`` and ``GRPOModule``, not imported); ``--help=full`` is jsonargparse's
page with Lightning's Trainer flags (~660 lines): that page and ``--print_config`` are rendered by
Lightning once and then printed from ``agentcap.commands.pages`` while their inputs are unchanged.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import re
import sys
import textwrap

from agentcap.commands import pages
from agentcap.commands.menu import COMMANDS, LIGHT, LIGHTNING, overview, refuse_unknown

HELP = ("-h", "--help")
FULL_HELP = "--help=full"
HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> None:
    from agentcap.commands.outputs import OutputBusy

    try:
        run_command(list(sys.argv[1:] if argv is None else argv))
    except OutputBusy as busy:  # a second writer of one --out: one line, exit 2 (a usage error)
        print(busy, file=sys.stderr)
        raise SystemExit(OutputBusy.exit_code) from None


def run_command(argv: list[str]) -> None:
    if not argv or argv[0] in HELP:
        print(overview(), file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    refuse_unknown(argv)
    name = argv[0]
    if name in LIGHTNING and any(arg in HELP for arg in argv[1:]):
        print(short_help(name))
        raise SystemExit(0)
    if name in COMMANDS and any(arg in HELP for arg in argv[1:]):  # the command's own argparse page
        module, function = COMMANDS[name][0].split(":")
        raise SystemExit(getattr(importlib.import_module(module), function)(argv[1:]))
    if name in LIGHT:  # envs, plan, data: no Lightning, no torch (agentcap.cli would import both)
        raise SystemExit(run_light(argv))
    if pages.wanted(argv):  # --help=full, --print_config: the page a first run printed, if nothing changed since
        page = pages.lookup(argv)  # its key covers every input of the key check below
        if page is not None:
            sys.stdout.write(page)
            raise SystemExit(0)
    if name in LIGHTNING:
        refuse_unknown_keys(argv)  # a typo'd key is refused before Lightning loads (seconds)
    from agentcap.cli import main as run

    with pages.recording(argv) if pages.wanted(argv) else contextlib.nullcontext():
        run(["--help" if arg == FULL_HELP else arg for arg in argv])


def refuse_unknown_keys(argv: list[str]) -> None:
    """An unknown ``model.*`` / ``trainer.*`` key, in a ``--config`` file or a flag, refused in two
    lines naming the nearest option, as ``agentcap.cli.SuggestingParser`` would, but from the sources
    of ``GRPOModule`` and Lightning's ``Trainer`` (read, not imported). Anything it cannot read is left to
    jsonargparse: this check only ever refuses a key neither signature has."""
    import difflib

    known = {"model": {a.split()[0].split(".", 1)[1] for a, _, _ in _model_options()}, "trainer": _trainer_options()}
    if not known["model"] or not known["trainer"]:
        return
    given: list[tuple[str, str, str]] = []  # (group, key, where)
    for i, arg in enumerate(argv):
        flag = arg.split("=", 1)[0]
        for group in known:
            if flag.startswith(f"--{group}."):
                given.append((group, flag[len(group) + 3 :].split(".")[0].rstrip("+"), "the command line"))
        path = arg.split("=", 1)[1] if arg.startswith("--config=") else (
            argv[i + 1] if arg in ("-c", "--config") and i + 1 < len(argv) else None)
        if path and os.path.isfile(path):
            from agentcap.resume.configs import MAX_CONFIG_BYTES

            if os.path.getsize(path) > MAX_CONFIG_BYTES:
                continue  # agentcap.cli refuses it by size, before any YAML reader sees it
            try:
                import yaml

                with open(path, encoding="utf-8") as handle:
                    document = yaml.safe_load(handle)
            except Exception:
                continue  # agentcap.cli names an unreadable file
            for group in known:
                section = document.get(group) if isinstance(document, dict) else None
                if isinstance(section, dict):
                    given += [(group, str(key), path) for key in section]
    for group, key, where in given:
        if key and key not in known[group]:
            options = [f"--{group}.{k}" for k in sorted(known[group])]
            near = difflib.get_close_matches(f"--{group}.{key}", options, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            print(f"agentcap {argv[0]}: error: {group} has no option {key!r} (--{group}.{key}, in {where}){hint}\n"
                  f"(its options: agentcap {argv[0]} --help)", file=sys.stderr)
            raise SystemExit(2)


def _trainer_options() -> set[str]:
    """The arguments of Lightning's ``Trainer.__init__``, read from its source (empty when not found)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("lightning")
        folder = list(spec.submodule_search_locations or [])[0] if spec is not None else None
        with open(os.path.join(folder, "pytorch", "trainer", "trainer.py"), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (ImportError, ValueError, IndexError, TypeError, OSError, SyntaxError):
        return set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    return {a.arg for a in [*f.args.args[1:], *f.args.kwonlyargs]}
    return set()


def run_light(argv: list[str]) -> int:
    """A command of :data:`LIGHT`, as ``agentcap.cli.main`` would run it (``--debug``, offline W&B,
    no transformers progress bars), without importing Lightning."""
    if "--debug" in argv:
        argv.remove("--debug")
        os.environ["AGENTCAP_DEBUG"] = "1"  # agentcap.cli.DEBUG
    os.environ.setdefault("WANDB_MODE", "offline" if not os.environ.get("WANDB_API_KEY") else "online")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers loads, if ever
    module, function = COMMANDS[argv[0]][0].split(":")
    return getattr(importlib.import_module(module), function)(argv[1:])


def short_help(command: str) -> str:
    """``agentcap fit --help``: agentcap's options and the model's, with their defaults and docs."""
    lines = [f"usage: agentcap {command} --config CONFIG [--model.KEY VALUE ...] [--trainer.KEY VALUE ...]", "",
             LIGHTNING[command], "", "options:"]
    own = [("-c, --config CONFIG", "", "A YAML config (repeatable; later files and flags override earlier ones)."),
           ("--print_config", "", "Print the resolved config and exit."),
           ("--seed_everything SEED", "", "Seed of torch, numpy and random (the configs set it)."),
           ("--debug", "", "Show the traceback of an error agentcap reports in one line (a refused manifest row, "
                           "a setting out of range, missing weights, a NaN)."),
           *_cli_options()]
    if command != "fit":
        own.append(("--ckpt_path PATH", "", "Evaluate this checkpoint instead of the run's newest."))
    lines += _format(own)
    lines += ["", "model options (--model.KEY; agentcap.training.module.GRPOModule):", *_format(_model_options()), "",
              f"Lightning's Trainer flags (--trainer.*) and every nested option: agentcap {command} {FULL_HELP}",
              "Shipped recipes: configs/ (agentcap fit --config configs/demo/read.yaml runs offline)."]
    return "\n".join(lines)


def _format(options: list[tuple[str, str, str]]) -> list[str]:
    out = []
    for flag, default, text in options:
        out.append(f"  {flag}" + (f"  (default: {default})" if default else ""))
        out += textwrap.wrap(text, 96, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return out


def _source(*parts: str) -> ast.Module:
    with open(os.path.join(HERE, *parts), encoding="utf-8") as handle:
        return ast.parse(handle.read())


def _cli_options() -> list[tuple[str, str, str]]:
    """The ``parser.add_argument`` calls of ``AgentcapCLI.add_arguments_to_parser`` (read, not imported)."""
    found = []
    for node in ast.walk(_source("cli.py")):
        if isinstance(node, ast.FunctionDef) and node.name == "add_arguments_to_parser":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument" and call.args:
                    keywords = {k.arg: k.value for k in call.keywords}
                    flag = ast.literal_eval(call.args[0])
                    kind = ast.unparse(keywords["type"]) if "type" in keywords else "VALUE"
                    choices = re.fullmatch(r"Literal\[(.*)\]", kind)
                    kind = "{" + choices.group(1).replace("'", "").replace(" ", "") + "}" if choices else kind.upper()
                    default = ast.unparse(keywords["default"]) if "default" in keywords else ""
                    text = ast.literal_eval(keywords["help"]) if "help" in keywords else ""
                    found.append((f"{flag} {kind}", default, text))
    return found


def _model_options() -> list[tuple[str, str, str]]:
    """``GRPOModule.__init__``'s arguments, defaults and the class docstring's ``Args:`` entries."""
    for node in ast.walk(_source("training", "module.py")):
        if isinstance(node, ast.ClassDef) and node.name == "GRPOModule":
            docs = _args_section(ast.get_docstring(node) or "")
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
            args = init.args.args[1:]
            defaults = [None] * (len(args) - len(init.args.defaults)) + list(init.args.defaults)
            return [(f"--model.{a.arg} {ast.unparse(a.annotation) if a.annotation else ''}".rstrip(),
                     "" if d is None else ast.unparse(d), docs.get(a.arg, "")) for a, d in zip(args, defaults)]
    return []


def _args_section(doc: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Args:`` section, continuation lines joined."""
    entries: dict[str, str] = {}
    current = None
    inside = False
    for line in doc.splitlines():
        if line.strip() == "Args:":
            inside = True
            continue
        if not inside:
            continue
        match = re.match(r"^ {4}(\w+): (.*)$", line)
        if match:
            current = match.group(1)
            entries[current] = match.group(2).strip()
        elif line.startswith(" " * 8) and current:
            entries[current] += " " + line.strip()
        elif line.strip():
            break
    return entries


if __name__ == "__main__":
    main()
