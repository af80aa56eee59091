"""`agentcap data convert`: public release formats → agentcap manifests, every row checked.

The fixtures under tests/data/public/ are tiny files in each release's own layout, with rows that
are bad on purpose; the kept / refused counts below are counted by hand from those files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from agentcap.commands.data import data_command
from agentcap.core.manifests import ManifestError, check_audio, read_manifest
from agentcap.data.benchmark_rows import check_benchmark_row

PUBLIC = Path(__file__).parent / "data" / "public"

#: format → (input file, --root, extra arguments, kept, refused), counted by hand from the fixture.
CASES = {
    # aaa_30 (two caption rows → one clip), bbb_0 kept; ccc_10 missing, ddd empty caption,
    # ../outside_0.wav leaves the root, eee_5.wav is empty
    "audiocaps": ("audiocaps/train.csv", "audiocaps/audio", [], 2, 4),
    # birds, "rain, heavy" kept; missing.wav, a row with no caption, /etc/hostname (outside the root)
    "clotho": ("clotho/clotho_captions_development.csv", "clotho/audio", [], 2, 3),
    # 2219, Yabc(.wav → .flac) kept; empty caption, missing audio, repeated id 2219, a non-object
    "wavcaps": ("wavcaps/sb_final.json", "wavcaps/audio", [], 2, 4),
    # q1, q2 (answer in another case), q1#2 kept; answer not a choice, missing audio, one choice,
    # ../../secret.wav (outside the root)
    "mmau": ("mmau/mmau-test-mini.json", "mmau", [], 3, 4),
    # mmar-1, mmar-2, mmar-3 (answer given as a letter) kept; repeated id, no question, repeated choice
    "mmar": ("mmar/MMAR-meta.json", "mmar", [], 3, 3),
    # s1, s2 (audio as {"path"}, two choices, letter answer) kept; answer E of 4, undecodable audio, torn line
    "mmsu": ("mmsu/mmsu.jsonl", "mmsu", [], 2, 3),
    # a1, a2, a3, a6 kept; a4 past the movie's end, a5 ends first, a7 no features, a8 empty, a9 escapes
    "mad": ("mad/MAD_train.json", "mad", ["--features", "features"], 4, 5),
    # two kept; a non-numeric start, a movie without features
    "cmdad": ("cmdad/cmdad_train.csv", "cmdad", ["--features", "features", "--map", "movie=imdbid"], 2, 2),
    # two kept; zero length, far past the end
    "tvad": ("tvad/tvad_test.csv", "tvad", ["--features", "features"], 2, 2),
}


def convert(fmt: str, out: Path, capsys=None, **override) -> tuple[int, list[dict], list[dict]]:
    source, root, extra, _, _ = CASES[fmt]
    argv = ["convert", "--from", fmt, "--input", str(override.get("input", PUBLIC / source)),
            "--root", str(override.get("root", PUBLIC / root)), "--out", str(out), *override.get("extra", extra)]
    code = data_command(argv)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    refused_file = out.with_name(out.stem + ".refused.jsonl")
    refused = [json.loads(line) for line in refused_file.read_text().splitlines()] if refused_file.exists() else []
    return code, rows, refused


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_each_format_keeps_and_refuses_the_hand_counted_rows(fmt, tmp_path):
    source, _, _, kept, refused_count = CASES[fmt]
    code, rows, refused = convert(fmt, tmp_path / "out" / "m.jsonl")
    assert code == 0
    assert (len(rows), len(refused)) == (kept, refused_count), [r["reason"] for r in refused]
    for entry in refused:  # every reason names the input file and its line / record
        assert entry["reason"].startswith(str(PUBLIC / source)) and entry["where"] in entry["reason"]
    assert len({row["id"] for row in rows}) == len(rows)


def test_paths_that_leave_the_root_are_refused_by_name(tmp_path):
    escaped = {
        "audiocaps": "'../outside_0.wav' resolves to",
        "clotho": "'/etc/hostname' resolves to",
        "mmau": "'../../secret.wav' resolves to",
        "mad": "'features/../../escape.npy' resolves to",
    }
    for fmt, text in escaped.items():
        _, _, refused = convert(fmt, tmp_path / fmt / "m.jsonl")
        hits = [r["reason"] for r in refused if text in r["reason"]]
        assert len(hits) == 1 and "outside --root" in hits[0], (fmt, [r["reason"] for r in refused])


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "clotho"
    shutil.copytree(PUBLIC / "clotho", root)
    outside = tmp_path / "elsewhere.wav"
    shutil.copy(PUBLIC / "clotho" / "audio" / "birds.wav", outside)
    (root / "audio" / "link.wav").symlink_to(outside)
    (root / "audio" / "inner.wav").symlink_to(root / "audio" / "birds.wav")  # a link that stays inside is fine
    csv = root / "captions.csv"
    csv.write_text("file_name,caption_1\nlink.wav,A linked file.\ninner.wav,A file linked inside the root.\n")
    code, rows, refused = convert("clotho", tmp_path / "m.jsonl", input=csv, root=root / "audio")
    assert code == 0 and [r["id"] for r in rows] == ["inner"]
    assert len(refused) == 1 and "'link.wav' resolves to" in refused[0]["reason"]
    assert "outside --root" in refused[0]["reason"] and refused[0]["where"] == f"{csv}:2"


def test_caption_manifests_are_what_the_bank_builder_reads(tmp_path):
    out = tmp_path / "m.jsonl"
    _, rows, _ = convert("audiocaps", out)
    assert rows[0]["captions"] == ["A dog barks loudly nearby.", "A dog barks twice, then stops."]
    assert rows[0]["caption"] == rows[0]["captions"][0] and rows[0]["id"] == "aaa_30"
    loaded = read_manifest(str(out), {"audio": str, "caption": str})  # the bank builder's reader
    for row in loaded:  # every file decodes, to the duration recorded (the env's own check)
        assert check_audio(row, "audio", row["_where"]) == pytest.approx(row["duration"], abs=1e-3)


def test_benchmark_rows_pass_the_shared_validator(tmp_path):
    for fmt in ("mmau", "mmar", "mmsu"):
        out = tmp_path / f"{fmt}.jsonl"
        _, rows, _ = convert(fmt, out)
        loaded = read_manifest(str(out), check=check_benchmark_row)
        assert len(loaded) == len(rows) and all(r["benchmark"] == fmt for r in rows)
    mmar = [json.loads(line) for line in (tmp_path / "mmar.jsonl").read_text().splitlines()]
    assert [(r["answer"], r["answer_text"], r["task"], r["layer"]) for r in mmar] == [
        ("B", "Phone", "sound", "Signal Layer"), ("C", "Hanami", "mix-sound-speech", "Cultural Layer"),
        ("B", "No", "speech", "Semantic Layer")]
    mmau = [json.loads(line) for line in (tmp_path / "mmau.jsonl").read_text().splitlines()]
    assert [(r["id"], r["answer"], r["subcategory"]) for r in mmau] == [
        ("q1", "A", "Acoustic Source Inference"), ("q2", "B", "Vocal"), ("q1#2", "A", "Counting")]


def test_benchmark_validator_refuses_each_broken_field():
    good = {"id": "q", "audio": "a.wav", "question": "Q?", "choices": ["x", "y"], "answer": "B", "answer_text": "y",
            "benchmark": "mmau", "task": None, "category": None, "subcategory": None, "layer": None, "duration": 1.0}
    check_benchmark_row(good, "b.jsonl:1")
    for change, field in [({"answer": "C"}, "'answer'"), ({"answer_text": "x"}, "'answer_text'"),
                          ({"choices": ["x"] * 11}, "'choices'"), ({"duration": -1}, "'duration'"),
                          ({"layer": 3}, "'layer'"), ({"question": " "}, "'question'")]:
        with pytest.raises(ManifestError, match=rf"b\.jsonl:1: .*field {field}"):
            check_benchmark_row({**good, **change}, "b.jsonl:1")


def test_ad_clips_are_cut_numbered_and_given_context_in_time_order(tmp_path):
    out = tmp_path / "mad" / "train.jsonl"
    _, rows, _ = convert("mad", out)
    m1 = [r for r in rows if r["movie"] == "m1"]
    assert [(r["id"], r["position"]) for r in m1] == [("a1", 0), ("a3", 1), ("a2", 2)]  # by start time
    assert [r["context"] for r in m1] == [[], ["Ann opens the door."], ["Ann opens the door.", "She smiles."]]
    movie = np.load(PUBLIC / "mad" / "features" / "m1.npy")
    np.testing.assert_array_equal(np.load(out.parent / m1[2]["features"]), movie[12:20])  # 2.5–4.0 s at 5 fps
    _, rows, _ = convert("mad", out, extra=["--features", "features", "--context", "1"])
    assert [r["context"] for r in rows if r["movie"] == "m1"][2] == ["She smiles."]



def test_mad_features_from_one_h5_file_equal_the_npy_folder(tmp_path, capsys):
    """MAD releases its frame features as one .h5 file, a dataset per movie: the same clips come out."""
    h5py = pytest.importorskip("h5py")
    root = tmp_path / "mad"
    shutil.copytree(PUBLIC / "mad", root)
    with h5py.File(root / "features.h5", "w") as f:
        for npy in sorted((PUBLIC / "mad" / "features").glob("*.npy")):
            f.create_dataset(npy.stem, data=np.load(npy))
    from_npy, from_h5 = tmp_path / "npy" / "train.jsonl", tmp_path / "h5" / "train.jsonl"
    _, rows_npy, refused_npy = convert("mad", from_npy)
    _, rows_h5, refused_h5 = convert("mad", from_h5, root=root, extra=["--features", "features.h5"])
    assert [r["id"] for r in rows_h5] == [r["id"] for r in rows_npy] and len(rows_h5) == 4
    assert len(refused_h5) == len(refused_npy) == 5
    for a, b in zip(rows_npy, rows_h5):
        np.testing.assert_array_equal(np.load(from_npy.parent / a["features"]), np.load(from_h5.parent / b["features"]))
    shutil.copy(root / "features.h5", tmp_path / "outside.h5")  # a real file, outside the root
    code, rows, _ = convert("mad", tmp_path / "x" / "m.jsonl", root=root, extra=["--features", "../outside.h5"])
    assert code == 2 and rows == [] and "outside --root" in capsys.readouterr().err

@pytest.mark.slow  # importing the env (judges, transformers) takes seconds
def test_ad_manifests_load_in_the_adclip_env(tmp_path):
    from agentcap_envs.ad_clip import ADClipEnv

    out = tmp_path / "mad" / "train.jsonl"
    convert("mad", out)
    env = ADClipEnv(manifest=str(out))
    assert len(env.items) == 4
    movie = np.load(PUBLIC / "mad" / "features" / "m1.npy")
    obs, _ = env.reset(seed=0, options={"index": 2})  # a2: 2.5–4.0 s at 5 fps → frames 12 … 19
    np.testing.assert_array_equal(obs["media"]["features"], movie[12:20])
    for fmt in ("cmdad", "tvad"):
        target = tmp_path / fmt / "m.jsonl"
        convert(fmt, target)
        assert len(ADClipEnv(manifest=str(target)).items) == 2


def test_an_unchecked_csv_schema_asks_for_a_column_map(tmp_path, capsys):
    code, rows, _ = convert("cmdad", tmp_path / "m.jsonl", extra=["--features", "features"])
    assert code == 2 and rows == []
    assert "column(s) ['movie'] not in the header ['imdbid', 'start', 'end', 'text']" in capsys.readouterr().err
    code, _, _ = convert("cmdad", tmp_path / "m.jsonl", extra=["--features", "features", "--map", "film=imdbid"])
    assert code == 2 and "has no field(s) ['film']" in capsys.readouterr().err


def test_the_input_is_never_overwritten(tmp_path, capsys):
    source = tmp_path / "mmsu.jsonl"
    shutil.copy(PUBLIC / "mmsu" / "mmsu.jsonl", source)
    before = source.read_bytes()
    code = data_command(["convert", "--from", "mmsu", "--input", str(source), "--root", str(PUBLIC / "mmsu"),
                         "--out", str(source)])
    assert code == 2 and source.read_bytes() == before
    assert "is one of the input files" in capsys.readouterr().err


def test_console_reports_counts_and_first_reasons(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    convert("wavcaps", out)
    err = capsys.readouterr().err
    assert f"2 rows kept → {out}; 4 refused → {tmp_path / 'm.refused.jsonl'}" in err
    assert err.count("  refused: ") == 4 and "repeats an earlier row's id" in err


def test_data_bank_dispatches_lazily(tmp_path, monkeypatch, capsys):
    import agentcap.commands.data as data

    (tmp_path / "fake_bank.py").write_text("def bank_command(argv):\n    return 40 + len(argv)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(data, "BANK_COMMAND", "fake_bank:bank_command")
    assert data_command(["bank", "--manifest", "x.jsonl"]) == 42
    monkeypatch.setattr(data, "BANK_COMMAND", "no_such_module_here:bank_command")
    assert data_command(["bank"]) == 2 and "not available" in capsys.readouterr().err


def test_agentcap_data_is_a_registered_command(tmp_path):
    from agentcap.cli import COMMANDS, main

    assert COMMANDS["data"][0] == "agentcap.commands.data:data_command"
    source, root, extra, kept, _ = CASES["mmar"]
    out = tmp_path / "m.jsonl"
    with pytest.raises(SystemExit) as exit_:
        main(["data", "convert", "--from", "mmar", "--input", str(PUBLIC / source), "--root", str(PUBLIC / root),
              "--out", str(out)])
    assert exit_.value.code == 0 and len(out.read_text().splitlines()) == kept
    assert os.path.isfile(tmp_path / "m.refused.jsonl")


def test_decode_refuses_a_truncated_file_the_header_check_keeps(tmp_path):
    root = tmp_path / "audio"
    root.mkdir()
    import soundfile

    tone = np.sin(np.arange(6 * 16000) / 16000 * 2 * np.pi * 440).astype(np.float32) * 0.3
    soundfile.write(tmp_path / "whole.mp3", tone, 16000, format="MP3")
    # the first kilobyte of a 6 s MP3: its header still says 6 s, the decoder gives ~0.15 s
    (root / "cut.mp3").write_bytes((tmp_path / "whole.mp3").read_bytes()[:1000])
    csv = tmp_path / "captions.csv"
    csv.write_text("file_name,caption_1\ncut.mp3,A truncated recording.\n")
    code, rows, _ = convert("clotho", tmp_path / "header.jsonl", input=csv, root=root, extra=[])
    assert code == 0 and len(rows) == 1
    code, rows, refused = convert("clotho", tmp_path / "decoded.jsonl", input=csv, root=root, extra=["--decode"])
    assert code == 1 and rows == [] and "truncated or damaged" in refused[0]["reason"]
