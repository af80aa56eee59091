"""Shared fixtures: small deterministic toy worlds and tiny run configs, built once per session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402

# Tiny models on a shared 2-core machine: one intra-op thread is many times faster than two
# threads contending (measured: small matmuls 8 ms vs 31 us).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toy_movie(tmp_path_factory) -> Path:
    from agentcap_envs.toy import movie

    out = tmp_path_factory.mktemp("toy_movie")
    movie.main(
        ["--out", str(out), "--train-movies", "2", "--val-movies", "1", "--test-movies", "1",
         "--clips-per-movie", "6", "--corpus-movies", "10"]
    )
    return out


@pytest.fixture(scope="session")
def toy_soundscapes(tmp_path_factory) -> Path:
    from agentcap_envs.toy import soundscapes

    out = tmp_path_factory.mktemp("toy_soundscapes")
    soundscapes.main(
        ["--out", str(out), "--train", "6", "--val", "3", "--test", "3", "--bad-examples"]
    )
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def sound_rows(toy_soundscapes) -> list[dict]:
    """The small toy soundscape world's training rows, as the generator wrote them."""
    return read_jsonl(toy_soundscapes / "train.jsonl")


def read_config(run_dir: Path, world: Path, stages: list[dict], **model) -> Path:
    """A tiny READ run: a 1-layer toy policy on the toy movie world, CSV logging."""
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir)}},
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        "checkpoint_every": 2,
        "model": {
            "run_dir": str(run_dir),
            "env": {
                "id": "agentcap/ADClip-v0",
                "kwargs": {"prompt": "compact"},
                "train": {"manifest": str(world / "train.jsonl")},
                "val": {"manifest": str(world / "val.jsonl")},
                "test": {"manifest": str(world / "test.jsonl")},
            },
            "agents": {
                "policy": {
                    "toy": {"media": "features", "feature_dim": 32, "hidden_size": 32, "num_layers": 1,
                            "num_heads": 2, "intermediate_size": 64},
                    "build_tokenizer_from": [str(world / "texts.txt")],
                    "max_new_tokens": 12,
                    "lr": 1e-3,
                }
            },
            "group_size": 4,
            "rollout_batch_size": 8,
            "minibatch_size": 8,
            "sft_batch_size": 4,
            "eval_limit": 4,
            "stages": stages,
            **model,
        },
    }
    path = run_dir / "config.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def make_read_config():
    return read_config


def game_config(run_dir: Path, world: Path, stages: list[dict], trainer: dict | None = None,
                new_tokens: tuple[int, int, int] = (6, 10, 6), **model) -> Path:
    """A tiny ACE-Cap run: three 1-layer toy agents on the toy soundscapes, rule examiner, CSV logging.
    ``new_tokens``: the Captioner's, Composer's and Instruct's ``max_new_tokens``."""
    toy = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    texts = [str(world / "texts.txt")]

    def agent(media: str, tokens: int) -> dict:
        return {"toy": {"media": media, **toy}, "build_tokenizer_from": texts, "max_new_tokens": tokens, "lr": 1e-3}

    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "enable_model_summary": False,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir)}},
            **(trainer or {}),
        },
        "checkpoint_every": 100,
        "model": {
            "run_dir": str(run_dir),
            "env": {
                "id": "agentcap/EvidenceGame-v0",
                "kwargs": {"prompt": "compact", "budget": 2, "examiner": "rule"},
                "train": {"manifest": str(world / "train.jsonl")},
                "val": {"manifest": str(world / "val.jsonl")},
                "test": {"manifest": str(world / "test.jsonl")},
            },
            "agents": {"captioner": agent("audio", new_tokens[0]), "composer": agent("none", new_tokens[1]),
                       "instruct": agent("audio", new_tokens[2])},
            "group_size": 2, "rollout_batch_size": 4, "minibatch_size": 3, "sft_batch_size": 2, "eval_limit": 2,
            "stages": stages,
            **model,
        },
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def make_game_config():
    return game_config


class CountingExaminer:
    """Forwards to a real examiner and records every batch of (text, question) pairs it is sent."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def answer(self, captions, questions):
        self.calls.append(list(zip(captions, questions)))
        return self.inner.answer(captions, questions)
