"""A public dataset, written here in its release format, goes `data convert` → `caption` → `evaluate`
with only the fields that format has (issue 35): a Clotho CSV (five captions per clip, no question
bank, no anchors) through the AudioMap task, an MMAU JSON (questions, no captions) through the
caption-as-evidence benchmark. Ids agree across `caption --audio`, manifests and predictions; the
caption metrics use every reference of an item, as pycocoevalcap does.
"""

from __future__ import annotations

import contextlib
import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest
import yaml

from agentcap.commands.caption import caption_command
from agentcap.commands.data import data_command
from agentcap.commands.evaluate import evaluate_command

CLIPS = {  # file → its captions (Clotho has five; one clip here has three, as partial releases do)
    "dog bark.wav": ["A dog barks twice near a house.", "A dog is barking loudly.", "Two sharp barks from a dog.",
                     "Someone's dog barks outside.", "A barking dog in the yard."],
    "rain.wav": ["Heavy rain falls on a roof.", "Rain pours down steadily on metal.", "Steady rain on a tin roof.",
                 "Water drums on the roof in a storm.", "It rains hard on a roof."],
    "engine.wav": ["A car engine idles and then revs.", "An engine starts and revs up.", "A motor runs, then revs."],
}


def _wav(path: Path, seconds: float, freq: float) -> None:
    t = np.arange(int(16000 * seconds)) / 16000
    samples = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1), handle.setsampwidth(2), handle.setframerate(16000)
        handle.writeframes(samples.tobytes())


@pytest.fixture
def public(tmp_path) -> Path:
    """A Clotho-format release (CSV + audio folder) and an MMAU-format JSON over the same clips."""
    audio = tmp_path / "clotho" / "audio"
    audio.mkdir(parents=True)
    for i, name in enumerate(CLIPS):
        _wav(audio / name, 1.0 + 0.5 * i, 220.0 * (i + 1))
    lines = ["file_name,caption_1,caption_2,caption_3,caption_4,caption_5"]
    for name, captions in CLIPS.items():
        lines.append(",".join(f'"{c}"' for c in [name, *captions, *[""] * (5 - len(captions))]))
    (tmp_path / "clotho" / "captions.csv").write_text("\n".join(lines) + "\n")
    mmau = [
        {"id": "m1", "audio_id": "./clotho/audio/dog bark.wav", "question": "Which animal is heard?",
         "choices": ["Dog", "Cat", "Cow"], "answer": "Dog", "task": "sound", "category": "Perception",
         "sub-category": "Animals"},
        {"id": "m2", "audio_id": "./clotho/audio/rain.wav", "question": "What is the weather?",
         "choices": ["Sunny", "Rain"], "answer": "Rain", "task": "sound", "category": "Perception",
         "sub-category": "Weather"},
        {"id": "m3", "audio_id": "./clotho/audio/engine.wav", "question": "What makes the sound?",
         "choices": ["An engine", "A bird"], "answer": "An engine", "task": "sound", "category": "Reasoning",
         "sub-category": "Source"},
    ]
    (tmp_path / "mmau.json").write_text(json.dumps(mmau))
    return tmp_path


def audiomap_config(run_dir: Path, world: Path) -> Path:
    """A tiny AudioMap system (untrained toy policy, rule examiners) on the toy soundscapes."""
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "logger": False},
        "model": {
            "run_dir": str(run_dir),
            "env": {"id": "agentcap/ClozeCaption-v0",
                    "kwargs": {"prompt": "compact", "examiner": "rule", "temporal_examiner": "rule"},
                    "train": {"manifest": str(world / "train.jsonl")},
                    "test": {"manifest": str(world / "test.jsonl")}},
            "agents": {"policy": {"toy": {"media": "audio", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                                          "intermediate_size": 32},
                                  "build_tokenizer_from": [str(world / "texts.txt")], "max_new_tokens": 8}},
            "stages": [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 1}],
        },
    }
    path = run_dir / "config.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run(command, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = command(argv)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
            err.write(str(exit.code if not isinstance(exit.code, int) else ""))
    return code, out.getvalue(), err.getvalue()


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(stdout: str) -> dict[str, str]:
    return {cells[0].strip(): cells[1].strip() for line in stdout.splitlines()
            if len(cells := line.split("|")) == 2}


@pytest.mark.slow  # loads a toy system three times, starts the PTB tokenizer's JVM
def test_clotho_and_mmau_go_convert_caption_evaluate(public, tmp_path, toy_soundscapes):
    config = audiomap_config(tmp_path / "run", toy_soundscapes)
    clotho = tmp_path / "clotho.jsonl"
    assert run(data_command, ["convert", "--from", "clotho", "--input", str(public / "clotho" / "captions.csv"),
                              "--root", str(public / "clotho" / "audio"), "--out", str(clotho)])[0] == 0
    items = jsonl(clotho)
    assert [i["id"] for i in items] == ["dog bark", "rain", "engine"]
    assert [len(i["captions"]) for i in items] == [5, 5, 3] and "cloze" not in items[0]

    # caption: the media is all inference needs (no 'cloze', no 'anchors' in a converted Clotho row)
    predictions = tmp_path / "clotho_captions.jsonl"
    code, _, err = run(caption_command, ["--config", str(config), "--untrained", "--manifest", str(clotho),
                                         "--out", str(predictions)])
    assert code == 0, err
    rows = jsonl(predictions)
    assert [r["id"] for r in rows] == ["dog bark", "rain", "engine"] and all(isinstance(r["caption"], str) for r in rows)
    # --audio names its rows by the file's stem, as convert names the clips
    from_audio = tmp_path / "audio_captions.jsonl"
    code, _, err = run(caption_command, ["--config", str(config), "--untrained", "--audio",
                                         str(public / "clotho" / "audio" / "rain.wav"), "--out", str(from_audio)])
    assert code == 0, err
    assert [r["id"] for r in jsonl(from_audio)] == ["rain"]

    # evaluate: the caption metrics against all 13 references; what cannot be computed is said
    code, out, err = run(evaluate_command, ["--predictions", str(predictions), "--config", str(config),
                                            "--manifest", str(clotho), "--no-meteor"])
    assert code == 0, err
    assert "caption metrics against 13 references of 3 items" in err
    assert "cloze_accuracy, esr (no 'cloze' question bank" in err and "tiou (3 of 3 items" in err
    cells = table(out)
    assert cells["esr"].startswith("skipped") and cells["tiou"].startswith("skipped")
    # the same ids through --audio predictions: found in the manifest
    code, out, err = run(evaluate_command, ["--predictions", str(from_audio), "--config", str(config),
                                            "--manifest", str(clotho), "--no-meteor"])
    assert code == 0, err

    # MMAU: questions, no captions; caption its clips from the benchmark manifest, then the benchmark
    mmau = tmp_path / "mmau.jsonl"
    assert run(data_command, ["convert", "--from", "mmau", "--input", str(public / "mmau.json"),
                              "--root", str(public), "--out", str(mmau)])[0] == 0
    mmau_captions = tmp_path / "mmau_captions.jsonl"
    code, _, err = run(caption_command, ["--config", str(config), "--untrained", "--manifest", str(mmau),
                                         "--out", str(mmau_captions)])
    assert code == 0, err
    assert [r["id"] for r in jsonl(mmau_captions)] == ["m1", "m2", "m3"]
    code, out, err = run(evaluate_command, ["--benchmark", str(mmau), "--predictions", str(mmau_captions),
                                            "--judge", "rule", "--out", str(tmp_path / "bench")])
    assert code == 0, err
    summary = json.loads((tmp_path / "bench" / "benchmark_summary.json").read_text())
    assert summary["failed_clips"] == 0 and summary["uncaptioned"] == 0 and summary["overall"]["count"] == 3
    print(out)
    # the MMAU manifest has no reference captions: caption metrics are refused in one line, naming the field
    code, _, err = run(evaluate_command, ["--predictions", str(mmau_captions), "--config", str(config),
                                          "--manifest", str(mmau), "--no-meteor"])
    assert code != 0 and "no field 'caption'" in err and "Traceback" not in err


def test_a_refused_manifest_row_in_evaluate_is_one_line(public, tmp_path, toy_soundscapes):
    config = audiomap_config(tmp_path / "run", toy_soundscapes)
    manifest = tmp_path / "broken.jsonl"
    manifest.write_text(json.dumps({"id": "x", "audio": str(public / "clotho" / "audio" / "gone.wav")}) + "\n")
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"id": "x", "caption": "a dog"}) + "\n")
    code, out, err = run(evaluate_command, ["--predictions", str(predictions), "--config", str(config),
                                            "--manifest", str(manifest), "--no-meteor"])
    assert code != 0 and "gone.wav" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow  # pycocoevalcap's PTB tokenizer runs in Java
def test_multi_reference_caption_metrics_equal_pycocoevalcap(public, tmp_path):
    """task_metrics on converted Clotho items (5, 5 and 3 references) equals pycocoevalcap's own
    pipeline (PTBTokenizer, Bleu(4), Rouge, Cider) fed every reference of each item."""
    import shutil

    if shutil.which("java") is None:
        pytest.skip("pycocoevalcap's PTBTokenizer needs Java")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from agentcap.evaluation.captioning import CaptionMetrics
    from agentcap.evaluation.tasks import task_metrics

    clotho = tmp_path / "clotho.jsonl"
    run(data_command, ["convert", "--from", "clotho", "--input", str(public / "clotho" / "captions.csv"),
                       "--root", str(public / "clotho" / "audio"), "--out", str(clotho)])
    items = jsonl(clotho)
    captions = ["A dog barks in a yard.", "Rain falls hard on a roof.", "An engine revs."]
    rows = [{"id": i["id"], "caption": c} for i, c in zip(items, captions)]

    class Env:  # the AudioMap task's reference field, no judges
        reference_field = "caption"

    with CaptionMetrics(meteor=False, bertscore=False) as metrics:
        ours = task_metrics(Env(), items, rows, metrics)
        single = metrics(captions, [[i["caption"]] for i in items])
    with contextlib.redirect_stdout(io.StringIO()):
        tokenizer = PTBTokenizer()
        gts = tokenizer.tokenize({k: [{"caption": c} for c in CLIPS[name]] for k, name in enumerate(CLIPS)})
        res = tokenizer.tokenize({k: [{"caption": c}] for k, c in enumerate(captions)})
        bleu, _ = Bleu(4).compute_score(gts, res)
    reference = {**{f"bleu{n + 1}": bleu[n] for n in range(4)}, "rouge_l": Rouge().compute_score(gts, res)[0],
                 "cider_d": Cider().compute_score(gts, res)[0]}
    print("multi-reference (ours | pycocoevalcap | first reference only):")
    for name, value in reference.items():
        print(f"  {name:8s} {ours[name]:.6f} | {value:.6f} | {single[name]:.6f}")
        assert ours[name] == pytest.approx(value, abs=1e-12), name
    assert ours["bleu4"] != pytest.approx(single["bleu4"])  # one reference alone scores differently
