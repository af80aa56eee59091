"""Commands that need no training answer without importing torch or Lightning (issue 35): `agentcap
envs`, `plan` and a fit refused for an unknown key. Checked by which modules a fresh process loaded,
not by timings (the machine is shared). `fit --help=full` and `--print_config` are Lightning's own
pages (jsonargparse reads the Trainer's signature): the first run renders them with Lightning, later
runs print the kept page (agentcap.commands.pages) without it, byte for byte, until an input changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentcap.commands import pages

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "lightning", "transformers")

RUN = r"""
import atexit, json, sys
heavy = {heavy!r}
atexit.register(lambda: print("MODULES " + json.dumps(sorted(m for m in heavy if m in sys.modules)), file=sys.stderr))
from agentcap.launcher import main
main(sys.argv[1:])
"""


def agentcap(*argv: str, cwd: Path = ROOT, env: dict | None = None) -> tuple[int, str, str, list[str]]:
    run = subprocess.run([sys.executable, "-c", RUN.format(heavy=HEAVY), *argv], cwd=cwd, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    lines = run.stderr.splitlines()
    loaded = json.loads(next(line for line in lines if line.startswith("MODULES "))[len("MODULES "):])
    err = "\n".join(line for line in lines if not line.startswith("MODULES "))
    return run.returncode, run.stdout, err, loaded


def test_envs_lists_the_builtin_ids_without_torch():
    code, out, err, loaded = agentcap("envs")
    assert code == 0, err
    assert "agentcap/ClozeCaption-v0" in out and "Dense, time-aware audio captioning" in out
    assert loaded == [], f"`agentcap envs` imported {loaded}"


def test_plan_reads_config_files_only():
    code, out, err, loaded = agentcap("plan", "--config", "configs/acecap.yaml", "--root", "tools/plan_models")
    assert code in (0, 2) and "captioner" in out, err
    assert loaded == [], f"`agentcap plan` imported {loaded}"
    # without --root the paper models are not found here: the stand-ins' folder is named
    code, _, err, loaded = agentcap("plan", "--config", "configs/acecap.yaml")
    assert code == 2 and "--root tools/plan_models" in err and loaded == [], err


def test_a_fit_with_an_unknown_key_is_refused_before_lightning_loads(tmp_path):
    code, _, err, loaded = agentcap("fit", "--config", "configs/demo/read.yaml", "--model.grup_size", "3")
    assert code == 2 and "did you mean '--model.group_size'?" in err and len(err.splitlines()) <= 3, err
    assert loaded == [], f"a refused fit imported {loaded}"
    typo = tmp_path / "typo.yaml"
    typo.write_text("trainer:\n  max_stepz: 3\n")
    code, _, err, loaded = agentcap("fit", "--config", "configs/demo/read.yaml", "--config", str(typo))
    assert code == 2 and "did you mean '--trainer.max_steps'?" in err and str(typo) in err and loaded == [], err


def test_every_shipped_config_passes_the_early_key_check():
    from agentcap.launcher import refuse_unknown_keys

    for config in sorted(ROOT.glob("configs/**/*.yaml")):
        refuse_unknown_keys(["fit", "--config", str(config)])  # raises SystemExit on a false refusal


def test_envs_says_when_a_module_failed_to_import_and_why(tmp_path):
    package = tmp_path / "mytask"
    package.mkdir()
    (package / "__init__.py").write_text("import not_a_real_dependency_35\n")
    code, _, err, _ = agentcap("envs", "mytask", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert code == 1 and "'mytask' failed to import" in err and "not_a_real_dependency_35" in err, err
    # the module:PATTERN form, a module not on the path: one line, not a traceback
    code, _, err, _ = agentcap("envs", "nothere_35:*", cwd=tmp_path)
    assert code == 1 and "importing 'nothere_35' failed: ModuleNotFoundError" in err and "Traceback" not in err, err


@pytest.mark.slow  # Lightning renders each page once (seconds; minutes on a loaded machine)
@pytest.mark.parametrize("argv", [("fit", "--help=full"),
                                  ("fit", "--config", "configs/demo/audiomap.yaml", "--print_config")])
def test_lightning_pages_are_kept_and_printed_again_without_lightning(tmp_path, argv):
    cache = {"AGENTCAP_CACHE": str(tmp_path)}
    code, first, err, loaded = agentcap(*argv, env=cache)
    assert code == 0 and "lightning" in loaded, err
    code, again, err, loaded = agentcap(*argv, env=cache)
    assert code == 0 and loaded == [], f"the kept page imported {loaded}: {err}"
    assert again == first and len(first.splitlines()) > 50


def test_a_page_is_kept_only_when_its_run_succeeds(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTCAP_CACHE", str(tmp_path))
    argv = ["fit", "--print_config"]
    with pytest.raises(SystemExit):
        with pages.recording(argv):
            print("model:\n  seed: 1")
            raise SystemExit(0)
    assert pages.lookup(argv) == "model:\n  seed: 1\n"
    refused = ["fit", "--model.grup_size", "3", "--print_config"]
    with pytest.raises(SystemExit):
        with pages.recording(refused):
            print("half a page")
            raise SystemExit(2)
    assert pages.lookup(refused) is None
    assert pages.wanted(argv) and pages.wanted(["fit", "--help=full"]) and not pages.wanted(["fit", "--help"])
    assert not pages.wanted(["envs", "--print_config"])
    monkeypatch.setenv("AGENTCAP_PAGE_CACHE", "0")
    assert not pages.wanted(argv)


def test_the_page_key_changes_with_every_input(tmp_path, monkeypatch):
    """Config bytes, a file the config names, the installed distributions, agentcap's sources, the
    terminal width, jsonargparse's / Lightning's variables, the command line: each a new key."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("model:\n  seed: 1\n")
    (tmp_path / "my.yaml").write_text("model:\n  seed: 1\n  env: {train: {manifest: base.yaml}}\n")
    (tmp_path / "pkg" / "agentcap").mkdir(parents=True)
    (tmp_path / "pkg" / "agentcap" / "module.py").write_text("x = 1\n")
    monkeypatch.setattr(pages, "SOURCES", tmp_path / "pkg")
    argv = ["fit", "--config", "my.yaml", "--print_config"]
    first = pages.key(argv)
    assert pages.key(argv) == first
    changes = [
        lambda: (tmp_path / "my.yaml").write_text("model:\n  seed: 2\n  env: {train: {manifest: base.yaml}}\n"),
        lambda: (tmp_path / "base.yaml").write_text("model:\n  seed: 22\n"),
        lambda: monkeypatch.setattr(pages, "_distributions", lambda: ["lightning-2.6.7.dist-info"]),
        lambda: (tmp_path / "pkg" / "agentcap" / "module.py").write_text("x = 22\n"),
        lambda: monkeypatch.setenv("COLUMNS", "123"),
        lambda: monkeypatch.setenv("JSONARGPARSE_DEFAULT_ENV", "true"),
    ]
    seen = {first}
    for change in changes:
        change()
        now = pages.key(argv)
        assert now not in seen
        seen.add(now)
    assert pages.key([*argv, "--trainer.max_steps", "3"]) not in seen
