"""The `agentcap` command: shipped configs parse, bad input is refused with a clear message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentcap.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml"))


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentcap.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("config", CONFIGS)
def test_every_shipped_config_parses(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / config), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "model:" in capsys.readouterr().out


def test_shipped_configs_start_with_their_command():
    for config in CONFIGS:
        head = (ROOT / config).read_text().splitlines()[:6]
        assert any("agentcap fit --config" in line for line in head), config


def test_unknown_key_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / "configs/demo/read.yaml"), "--model.grup_size", "3", "--print_config"])
    assert exit_info.value.code != 0
    assert "grup_size" in capsys.readouterr().err


def test_wrong_type_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / "configs/demo/read.yaml"), "--model.group_size", "many"])
    assert exit_info.value.code != 0
    assert "group_size" in capsys.readouterr().err


def test_group_size_must_divide_the_batch(tmp_path, toy_movie, make_read_config, capsys):
    config = make_read_config(tmp_path, toy_movie, [{"name": "e", "kind": "evaluate", "split": "val"}])
    with pytest.raises(SystemExit) as exit_info:  # a one-line refusal (ConfigError), exit 2
        main(["fit", "--config", str(config), "--model.group_size", "3"])
    assert exit_info.value.code == 2
    assert "--model.group_size (3) must divide --model.rollout_batch_size (8)" in capsys.readouterr().err


@pytest.mark.slow  # `agentcap fit` in a subprocess
def test_paper_recipe_fails_fast_naming_the_demo():
    result = run_cli("fit", "--config", "configs/read.yaml")
    assert result.returncode == 2
    assert "Qwen/Qwen3-VL-8B-Instruct" in result.stderr
    assert "configs/demo/read.yaml" in result.stderr


@pytest.mark.slow  # a subprocess importing every environment (test_envs_command_lists_the_builtins runs in process)
def test_envs_lists_the_builtins():
    result = run_cli("envs")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    for env_id in ("agentcap/ADClip-v0", "agentcap/ClozeCaption-v0", "agentcap/EvidenceGame-v0"):
        assert sum(line.startswith(env_id) for line in lines) == 1, result.stdout


def test_envs_command_lists_the_builtins(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["envs"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for env_id in ("agentcap/ADClip-v0", "agentcap/ClozeCaption-v0", "agentcap/EvidenceGame-v0"):
        assert sum(line.startswith(env_id) for line in lines) == 1, lines


def test_help_lists_every_subcommand_and_each_help_works(capsys):
    from agentcap.cli import COMMANDS

    for argv in (["--help"], *([name, "--help"] for name in ("fit", *COMMANDS))):
        with pytest.raises(SystemExit) as exit_info:
            main(list(argv))
        assert exit_info.value.code in (0, None), argv
        out = capsys.readouterr().out
        assert "usage:" in out, argv
        if argv == ["--help"]:
            for name in ("fit", "validate", "test", "predict", *COMMANDS):
                assert f"    {name} " in out, name


@pytest.mark.slow  # a Trainer fit
def test_main_with_argv_does_not_warn_about_the_command_line(tmp_path, toy_movie, make_read_config, capsys, monkeypatch):
    """`main(argv)` passes argv as LightningCLI's args; the test runner's own sys.argv must not leak in."""
    import warnings

    config = make_read_config(tmp_path, toy_movie, [{"name": "e", "kind": "evaluate", "split": "val"}])
    # validate refuses a run without a checkpoint, so `fit` is the command here and sys.argv says otherwise
    monkeypatch.setattr(sys, "argv", ["agentcap", "validate", "--config", str(config)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", "--config", str(config)])
    messages = [str(w.message) for w in caught]
    assert not any("command line" in m for m in messages), messages
    assert not any("no optimizer" in m or "eval mode" in m for m in messages), messages
    assert sys.argv == ["agentcap", "validate", "--config", str(config)]


def test_help_is_short_and_imports_neither_torch_nor_lightning():
    """`agentcap --help`, `fit --help` and every command's `--help` answer from agentcap.launcher alone (timing:
    tools/bench_help.py); `fit --help` is agentcap's and the model's options, not 661 lines of Trainer flags."""
    from agentcap.commands.menu import COMMANDS

    probe = (
        "import contextlib, io, sys\n"
        "from agentcap.launcher import main\n"
        "from agentcap.commands.menu import COMMANDS\n"
        "for argv in (['--help'], ['fit', '--help'], ['validate', '-h'], *([c, '--help'] for c in COMMANDS)):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "    print(len(out.getvalue().splitlines()), 'usage:' in out.getvalue())\n"
        "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    *pages, imported = result.stdout.strip().splitlines()
    assert imported == "[]"
    assert len(pages) == 3 + len(COMMANDS) and all(page.endswith("True") for page in pages)
    assert int(pages[1].split()[0]) < 150


def test_fit_help_names_the_model_options_and_the_full_page(capsys):
    from agentcap.launcher import main as launch

    with pytest.raises(SystemExit) as exit_info:
        launch(["fit", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--model.group_size int  (default: 4)" in out and "G, rollouts per item." in out
    assert "--resume {auto,anyway,fresh}" in out and "--help=full" in out and "--trainer.max_epochs" not in out
    with pytest.raises(SystemExit):
        launch(["fit", "--help=full"])
    assert "--trainer.max_epochs" in capsys.readouterr().out


def test_unknown_flag_or_config_key_names_the_nearest_option(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  grup_size: 3\n")
    for extra in (["--model.grup_size", "3"], ["--config", str(typo)]):
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", str(ROOT / "configs/demo/read.yaml"), *extra, "--print_config"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "grup_size" in err and "did you mean '--model.group_size'?" in err, err
        assert len(err.strip().splitlines()) <= 3, err  # not the 600 lines of usage
