"""The names of the ``agentcap`` commands and the messages about them (help overview, typos), without
heavy imports: ``agentcap.launcher`` answers ``--help`` from here, ``agentcap.cli`` runs the commands."""

from __future__ import annotations

import difflib
import re
import sys
import textwrap

#: Subcommands outside LightningCLI: name → ("module:function" taking argv, returning an exit code;
#: the one-line help ``agentcap --help`` lists). Add a command by adding a line.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("agentcap.commands.envs:envs_command", "List the registered agentcap environments."),
    "caption": ("agentcap.commands.caption:caption_command", "Caption clips or audio files with a trained system."),
    "evaluate": ("agentcap.commands.evaluate:evaluate_command",
                 "The papers' metrics (BLEU, METEOR, ROUGE-L, CIDEr, R@k/N, …) for a run or predictions."),
    "export": ("agentcap.commands.export:export_command", "Write each trained agent as a save_pretrained folder."),
    "plan": ("agentcap.commands.plan:plan_command", "Memory per rank and stage of a config, from config.json files alone."),
    "data": ("agentcap.commands.data:data_command", "Convert public datasets to manifests (convert); build question banks (bank)."),
    "assemble": ("agentcap.commands.assemble:assemble_command", "Build the offline audio LM (Whisper tiny.en encoder + SmolLM2) as a save_pretrained folder."),
}

#: Commands that need neither Lightning nor torch to start: ``agentcap.launcher`` runs them itself,
#: without importing ``agentcap.cli`` (which imports Lightning: seconds, tens on a busy machine).
LIGHT = ("envs", "plan", "data")

#: LightningCLI's subcommands, as agentcap runs them.
LIGHTNING = {
    "fit": "Train through the model's schedule of stages; re-running continues from the run's newest checkpoint.",
    "validate": "Evaluate the run's newest checkpoint on the val split (summary.json).",
    "test": "Evaluate the run's newest checkpoint on the test split (summary.json).",
    "predict": "Caption the test split with the run's newest checkpoint (<run_dir>/predictions.jsonl).",
}

def refuse_unknown(argv: list[str]) -> None:
    """An unknown command is refused in one line naming the nearest one (``fti`` → ``fit``)."""
    name = argv[0] if argv else "-"
    if not name.startswith("-") and name not in LIGHTNING and name not in COMMANDS:
        near = difflib.get_close_matches(name, [*LIGHTNING, *COMMANDS], n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        print(f"agentcap: unknown command {name!r}{hint} (commands: {', '.join([*LIGHTNING, *COMMANDS])})",
              file=sys.stderr)
        raise SystemExit(2)


def did_you_mean(message: str, options: list[str]) -> str:
    """``"; did you mean '--model.group_size'?"`` for the unknown flags or config keys a jsonargparse
    error names (``unrecognized arguments: --model.grup_size 3``, ``Group 'model' does not accept
    option 'grup_size'``), or ``""``."""
    wrong = []
    found = re.search(r"unrecognized arguments: (.*)", message)
    if found:
        wrong += [word.split("=", 1)[0] for word in found.group(1).split() if word.startswith("--")]
    wrong += [f"--{group}.{key}" for group, key in re.findall(r"Group '([^']+)' does not accept option '([^']+)'", message)]
    hints = [near[0] for name in wrong if (near := difflib.get_close_matches(name, options, n=1, cutoff=0.6))]
    return f"; did you mean {', '.join(map(repr, hints))}?" if hints else ""


def overview() -> str:
    """``agentcap --help``."""
    rows = [*LIGHTNING.items(), *((name, help) for name, (_, help) in COMMANDS.items())]
    width = max(len(name) for name, _ in rows) + 2
    lines = ["usage: agentcap COMMAND [options]", "", "Captioning agents trained with reinforcement learning.", "",
             "commands:"]
    for name, help in rows:
        wrapped = textwrap.wrap(help, 96 - width - 4) or [""]
        lines.append(f"  {name:<{width}}{wrapped[0]}")
        lines += [" " * (width + 2) + more for more in wrapped[1:]]
    lines += ["", "agentcap COMMAND --help: that command's options (fit --help=full: every Trainer flag too)."]
    return "\n".join(lines)
