"""The real-speech recipes (configs/real/*.yaml) run as written, at their smallest: the pretrained
audio LM (and SmolLM2 for ACE-Cap's Composer) on a --max-clips world, one step of each kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


# Each test runs a whole recipe's smallest setting with the 171M audio LM (both: about 5 min on two
# cores, 4.1 GB), so they are opt-in (AGENTCAP_RECIPE_TESTS=1); CI covers one SFT and one GRPO step of
# the same model in tests/test_audio_lm.py.
pytestmark = pytest.mark.skipif(os.environ.get("AGENTCAP_RECIPE_TESTS") != "1",
                                reason="whole real recipes (about 5 min on 2 cores): set AGENTCAP_RECIPE_TESTS=1")
WARM_START = "runs/real/audiomap-sft/export/policy"  # configs/real/audiomap-sft.yaml's run, exported


@pytest.fixture(scope="module")
def small_world(tmp_path_factory) -> Path:
    speech = pytest.importorskip("agentcap_envs.real.speech")
    try:
        from agentcap.agents import audio_lm
        from agentcap.agents.gguf import cached_smollm2

        audio_lm.cached_audio_lm(), cached_smollm2()
    except Exception as err:  # noqa: BLE001 - the assets of tools/setup.sh are missing
        pytest.skip(f"the assembled audio LM / SmolLM2 are not available: {err}")
    out = tmp_path_factory.mktemp("real_small")
    try:
        speech.main(["--out", str(out), "--max-clips", "4", "--seed", "0"])
    except (FileNotFoundError, SystemExit) as err:
        pytest.skip(f"the real-speech assets are not unpacked (tools/setup.sh): {err}")
    return out


def smallest(recipe: str, world: Path, run_dir: Path, stages: list[dict]) -> Path:
    """The recipe with its data in ``world``, one item per batch, and ``stages``; a role that starts
    from AudioMap's warm start starts from the assembled model here (the warm start is an hour's run)."""
    from agentcap.agents.audio_lm import cached_audio_lm

    config = yaml.safe_load((ROOT / "configs" / "real" / recipe).read_text())
    model = config["model"]
    for agent in model["agents"].values():
        if agent.get("model") == WARM_START:
            agent["model"] = str(cached_audio_lm())
    for split in ("train", "val", "test"):
        model["env"][split] = {"manifest": str(world / f"{split}.jsonl")}
    model["benchmark"] = {**model["benchmark"], "path": str(world / "benchmark.jsonl"), "limit": 3}
    model["run_dir"] = str(run_dir)
    for agent in model["agents"].values():
        agent["max_new_tokens"] = min(agent.get("max_new_tokens", 64), 8)
    model.update(group_size=2, rollout_batch_size=2, sft_batch_size=1, eval_limit=1, stages=stages)
    config["trainer"].update(enable_progress_bar=False, enable_model_summary=False, logger={
        "class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir)}})
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def fit(config: Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config)], cwd=ROOT,
                            capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((config.parent / "summary.json").read_text())


@pytest.mark.slow  # `agentcap fit` of the 171M audio LM: an SFT step, a GRPO step, an evaluation
def test_real_audiomap_recipe_takes_an_sft_and_a_grpo_step(small_world, tmp_path):
    # the GRPO recipe starts from the warm start's export; here both steps run on the assembled model
    warm = yaml.safe_load((ROOT / "configs/real/audiomap-sft.yaml").read_text())["model"]
    grpo = yaml.safe_load((ROOT / "configs/real/audiomap.yaml").read_text())["model"]
    assert grpo["agents"]["policy"]["model"] == f"{warm['run_dir']}/export/policy" == WARM_START
    config = smallest("audiomap-sft.yaml", small_world, tmp_path / "run", [
        {"name": "sft", "kind": "sft", "agent": "policy", "steps": 1, "lr": 1e-3},
        {"name": "grpo_r2", "kind": "grpo", "agent": "policy", "steps": 1},
        {"name": "after_grpo", "kind": "evaluate", "split": "test"},
    ])
    result = fit(config)["after_grpo"]
    assert {"esr", "ectr", "wer", "benchmark/accuracy"} <= set(result), sorted(result)


@pytest.mark.slow  # three agents (two adapters on one audio LM, SmolLM2 text-only): warm-ups, a Composer GRPO step, S1
def test_real_acecap_recipe_takes_sft_and_a_grpo_step(small_world, tmp_path):
    agents = yaml.safe_load((ROOT / "configs/real/acecap.yaml").read_text())["model"]["agents"]
    assert agents["captioner"]["model"] == WARM_START and agents["instruct"]["share_base_with"] == "captioner"
    config = smallest("acecap.yaml", small_world, tmp_path / "run", [
        {"name": "sft_captioner", "kind": "sft", "agent": "captioner", "steps": 1, "lr": 1e-3},
        {"name": "sft_instruct", "kind": "sft", "agent": "instruct", "steps": 1, "lr": 1e-3},
        {"name": "sft_composer", "kind": "sft", "agent": "composer", "steps": 1, "lr": 1e-3},
        {"name": "composer_warmup", "kind": "grpo", "agent": "composer", "steps": 1},
        {"name": "S1", "kind": "evaluate", "split": "test"},
    ])
    result = fit(config)["S1"]
    assert {"g2p_final", "questions", "benchmark/accuracy"} <= set(result), sorted(result)
