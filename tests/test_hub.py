"""Hub ids for model fields (resolved through an HF cache laid out on disk, offline) and manifests
that are Hugging Face datasets (parquet written by ``datasets``, a save_to_disk folder)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import soundfile
import torch

from agentcap.agents.agent import AgentConfig, build_agent
from agentcap.agents.hub import MissingWeightsError, is_hub_id, resolve_model
from agentcap.agents.tiny import build_tiny
from agentcap.commands.plan import plan
from agentcap.core.manifests import ManifestError, SkipReport, check_audio, read_manifest

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An HF cache holding ``acme/tiny-lm`` as ``snapshot_download`` lays it out; network off."""
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny-lm"
    parts = build_tiny("qwen2")
    parts.model.save_pretrained(repo / "snapshots" / REV)
    parts.tokenizer.save_pretrained(repo / "snapshots" / REV)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # relative paths in the tests are tmp_path's
    return cache, parts.model


def test_agent_loads_from_a_hub_id_in_the_cache(hub_cache):
    cache, saved = hub_cache
    agent = build_agent("policy", AgentConfig(model="acme/tiny-lm"))
    assert type(agent.model) is type(saved)
    for (name, mine), theirs in zip(agent.model.state_dict().items(), saved.state_dict().values()):
        assert torch.equal(mine, theirs), name
    assert resolve_model("acme/tiny-lm@main", "x") == str(cache / "models--acme--tiny-lm" / "snapshots" / REV)


def test_missing_id_offline_names_the_id_and_the_cache(hub_cache):
    cache, _ = hub_cache
    with pytest.raises(MissingWeightsError) as info:
        build_agent("policy", AgentConfig(model="acme/absent-lm"))
    message = str(info.value)
    assert "agents.policy.model" in message and "'acme/absent-lm'" in message
    assert str(cache) in message and "HF_HUB_OFFLINE=1" in message


def test_a_hub_that_does_not_resolve_reads_the_cache_at_once(hub_cache, monkeypatch):
    """No network (the host does not resolve): the cache answers, and a missing id is named in well under
    the ~20 s huggingface_hub spends retrying."""
    import time

    cache, _ = hub_cache
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    start = time.perf_counter()
    assert resolve_model("acme/tiny-lm", "x") == str(cache / "models--acme--tiny-lm" / "snapshots" / REV)
    with pytest.raises(MissingWeightsError, match=r"'acme/absent-lm' .*hub\.invalid does not resolve"):
        resolve_model("acme/absent-lm", "agents.policy.model")
    assert time.perf_counter() - start < 5


def test_a_folder_wins_over_an_id_of_the_same_spelling(hub_cache, tmp_path):
    (tmp_path / "acme" / "tiny-lm").mkdir(parents=True)
    assert not is_hub_id("acme/tiny-lm") and resolve_model("acme/tiny-lm", "x") == "acme/tiny-lm"
    assert not is_hub_id("./acme/x") and not is_hub_id("a/b/c") and is_hub_id("Qwen/Qwen2.5-Omni-7B")


def test_plan_reads_a_hub_ids_config_from_the_cache(hub_cache, tmp_path):
    config = {"trainer": {"devices": 1}, "model": {"agents": {"policy": {"model": "acme/tiny-lm"}},
                                                   "stages": [{"name": "e", "kind": "evaluate"}]}}
    rows = plan(config, str(tmp_path / "no-stand-ins"))
    assert rows and rows[0]["total"] > 0
    config["model"]["agents"]["policy"]["model"] = "acme/absent-lm"
    with pytest.raises(MissingWeightsError, match="acme/absent-lm"):
        plan(config, str(tmp_path / "no-stand-ins"))


# --- manifests from Hugging Face datasets ------------------------------------------------------
ROWS = [
    {"id": "a", "text": "a dog barks", "file": "clips/a.wav"},
    {"id": "b", "text": 7, "file": "clips/b.wav"},  # caption not a string: refused by name
    {"id": "c", "text": "rain falls", "file": "clips/c.wav"},
]
NEEDS = {"caption": str, "audio": str}


def _parquet(tmp_path) -> str:
    path = tmp_path / "train.parquet"
    table = datasets.Dataset.from_list([{**r, "text": str(r["text"]) if r["id"] != "b" else None} for r in ROWS])
    table.to_parquet(str(path))
    return str(path)


def test_parquet_rows_are_mapped_and_checked_like_jsonl(tmp_path):
    path = _parquet(tmp_path)
    manifest = f"{path}?map=caption:text,audio:file"
    with pytest.raises(ManifestError, match=r"train\.parquet\?map=caption:text,audio:file:row 1: field 'caption' must be str, got None"):
        read_manifest(manifest, NEEDS)
    report = SkipReport()
    rows = read_manifest(manifest, NEEDS, on_error="skip", max_skip_fraction=0.5, report=report)
    assert [r["id"] for r in rows] == ["a", "c"] and report.ids == ["b"] and report.total == 3
    assert rows[0]["caption"] == "a dog barks" and rows[0]["audio"] == "clips/a.wav" and "text" not in rows[0]
    assert rows[0]["_manifest"] == path  # media paths resolve against the parquet file's folder


def test_save_to_disk_folder_with_splits_and_a_task_check(tmp_path):
    folder = tmp_path / "ds"
    good = [{"id": "a", "caption": "x", "audio": "a.wav"}, {"id": "b", "caption": "y", "audio": "b.wav"}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(good), "test": datasets.Dataset.from_list(good[:1])}).save_to_disk(folder)

    def no_b(row, where):
        if row["id"] == "b":
            raise ManifestError(f"{where}: field 'id': 'b' is banned")

    with pytest.raises(ManifestError, match="pick a split"):
        read_manifest(str(folder), NEEDS)
    assert [r["id"] for r in read_manifest(f"{folder}?split=test", NEEDS)] == ["a"]
    with pytest.raises(ManifestError, match=r"ds\?split=train:row 1: field 'id': 'b' is banned"):
        read_manifest(f"{folder}?split=train", NEEDS, check=no_b)
    with pytest.raises(ManifestError, match=r"no split 'dev' \(the dataset has \['train', 'test'\]\)"):
        read_manifest(f"{folder}?split=dev", NEEDS)


def test_bad_options_and_columns_are_named(tmp_path):
    path = _parquet(tmp_path)
    with pytest.raises(ManifestError, match=r"unknown option\(s\) \['columns'\]"):
        read_manifest(f"{path}?columns=caption:text", NEEDS)
    with pytest.raises(ManifestError, match=r"map names column\(s\) \['words'\] the dataset lacks"):
        read_manifest(f"{path}?map=caption:words", NEEDS)
    with pytest.raises(ManifestError, match="must be FIELD:COLUMN"):
        read_manifest(f"{path}?map=caption", NEEDS)
    with pytest.raises(ManifestError, match="options are for Hugging Face datasets"):
        read_manifest(str(tmp_path / "train.jsonl") + "?split=x", NEEDS)


def test_audio_column_bytes_become_a_checked_file(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    wav = tmp_path / "tone.wav"
    soundfile.write(wav, np.sin(np.arange(8000) / 5).astype(np.float32), 8000)
    clip = {"bytes": wav.read_bytes(), "path": "tone.wav"}  # the audio lives inside the parquet file
    wav.unlink()
    table = datasets.Dataset.from_dict({"caption": ["a tone"], "audio": [clip]})
    table = table.cast_column("audio", datasets.Audio())  # as the Hub stores it (decoded on access)
    table.to_parquet(str(tmp_path / "a.parquet"))
    [row] = read_manifest(str(tmp_path / "a.parquet"), NEEDS)
    assert row["audio"].startswith(str(tmp_path / "cache")) and check_audio(row, "audio", row["_where"]) == 1.0


def test_hub_dataset_offline_names_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ManifestError, match=r"hf://acme/nothing-here\?split=train: cannot load the dataset 'acme/nothing-here'"):
        read_manifest("hf://acme/nothing-here?split=train", NEEDS)
