"""A config file that holds no settings gets one plain sentence from every command (issue 26, case 5),
not ``AttributeError`` (plan) or LightningCLI's blank "Unexpected config" (fit)."""

from __future__ import annotations

import pytest

from agentcap.cli import main

COMMANDS = ["fit", "validate", "test", "predict", "caption", "evaluate", "export", "plan"]


def refused(command: str, config, tmp_path) -> str:
    extra = ["--out", str(tmp_path / "out")] if command == "export" else []
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--config", str(config), *extra])
    message = str(exit_info.value.code)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("command", COMMANDS)
def test_an_empty_config_is_one_sentence(tmp_path, command):
    config = tmp_path / "empty.yaml"
    config.write_bytes(b"")
    message = refused(command, config, tmp_path)
    assert message.startswith(f"agentcap {command}: config {config} is empty")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_config_that_is_not_a_mapping_is_one_sentence(tmp_path, command):
    config = tmp_path / "list.yaml"
    config.write_text("- model\n- trainer\n")
    message = refused(command, config, tmp_path)
    assert message.startswith(f"agentcap {command}: config {config} holds a list, not a mapping of settings")


@pytest.mark.parametrize("command", ["fit", "plan"])
def test_a_config_that_is_not_yaml_names_the_line(tmp_path, command):
    config = tmp_path / "broken.yaml"
    config.write_text("model:\n  run_dir: runs/x\n  stages: [1, 2\n")
    message = refused(command, config, tmp_path)
    assert message.startswith(f"agentcap {command}: {config}:") and "not valid YAML" in message
