"""The offline toy worlds: deterministic, well-formed, and their gold data agrees with the media.

The demo configs and many other tests stand on these worlds, so a silent change in them (a gold
answer that is always "A", a context from the wrong movie, an audio file shorter than its row
says) would make every later result meaningless.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import read_jsonl

from agentcap_envs.toy import movie as movie_world
from agentcap_envs.toy import soundscapes as sound_world

TOOLS = Path(__file__).resolve().parents[1] / "tools"

SMALL_MOVIE = ["--train-movies", "3", "--val-movies", "1", "--test-movies", "1",
               "--clips-per-movie", "12", "--corpus-movies", "5"]
SMALL_SOUND = ["--train", "12", "--val", "4", "--test", "4"]


def _tree(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def movie_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("movie")
    movie_world.main(["--out", str(out), *SMALL_MOVIE])
    return out


@pytest.fixture(scope="module")
def sound_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sound")
    sound_world.main(["--out", str(out), *SMALL_SOUND, "--bad-examples"])
    return out


# --- toy movie ---------------------------------------------------------------------------------
def test_movie_is_deterministic(movie_dir: Path, tmp_path: Path) -> None:
    movie_world.main(["--out", str(tmp_path / "again"), *SMALL_MOVIE])
    first, second = _tree(movie_dir), _tree(tmp_path / "again")
    assert first.keys() == second.keys()
    assert [k for k in first if first[k] != second[k]] == []
    movie_world.main(["--out", str(tmp_path / "other"), *SMALL_MOVIE, "--seed", "1"])
    assert (tmp_path / "other" / "train.jsonl").read_bytes() != first["train.jsonl"]


def test_movie_rows_schema(movie_dir: Path) -> None:
    seen_movies: dict[str, str] = {}
    for split, movies in (("train", 3), ("val", 1), ("test", 1)):
        rows = read_jsonl(movie_dir / f"{split}.jsonl")
        assert len(rows) == movies * 12
        for row in rows:
            assert set(row) == {"id", "movie", "position", "duration", "features", "characters",
                                "ad", "context", "meta"}
            assert row["id"] == f"{row['movie']}-c{row['position']:03d}"
            assert row["features"] == f"features/{row['id']}.npy"
            assert 1.5 <= row["duration"] <= 6.0 and round(row["duration"], 1) == row["duration"]
            words = row["ad"].split()
            assert 4 <= len(words) <= 10 and row["ad"].endswith(".")
            assert row["characters"] and set(row["characters"]) <= set(movie_world.CAST)
            assert words[0] == row["characters"][0]
            assert all(name in row["ad"] for name in row["characters"])
            meta = row["meta"]
            assert f"the {meta['colour']} {meta['object']}" in row["ad"]
            assert meta["action"] in movie_world.ACTIONS
            features = np.load(movie_dir / row["features"], allow_pickle=False)
            assert features.shape == (8, 32) and features.dtype == np.float32
            assert seen_movies.setdefault(row["movie"], split) == split  # split by movie


def test_movie_context_is_previous_ads_of_same_movie(movie_dir: Path) -> None:
    for split in ("train", "val", "test"):
        by_movie: dict[str, list[dict]] = defaultdict(list)
        for row in read_jsonl(movie_dir / f"{split}.jsonl"):
            by_movie[row["movie"]].append(row)
        for rows in by_movie.values():
            rows.sort(key=lambda r: r["position"])
            assert [r["position"] for r in rows] == list(range(len(rows)))
            ads = [r["ad"] for r in rows]
            for row in rows:
                p = row["position"]
                assert row["context"] == ads[max(0, p - 3):p]
            assert rows[0]["context"] == []


def test_movie_story_is_coherent(movie_dir: Path) -> None:
    """Objects keep their colour within a movie and neighbouring clips share people or things."""
    rows = read_jsonl(movie_dir / "train.jsonl")
    colours: dict[tuple[str, str], set[str]] = defaultdict(set)
    shared = 0
    for before, after in zip(rows, rows[1:]):
        if before["movie"] == after["movie"]:
            shared += bool(set(before["characters"]) & set(after["characters"])
                           or before["meta"]["object"] == after["meta"]["object"])
    for row in rows:
        colours[(row["movie"], row["meta"]["object"])].add(row["meta"]["colour"])
    assert all(len(c) == 1 for c in colours.values())
    pairs = sum(a["movie"] == b["movie"] for a, b in zip(rows, rows[1:]))
    assert shared / pairs > 0.8


def test_movie_features_encode_content(movie_dir: Path) -> None:
    codebook = movie_world.Codebook(0, 32)
    for row in read_jsonl(movie_dir / "train.jsonl"):
        mean = np.load(movie_dir / row["features"]).mean(axis=0)
        truth = {"character": row["characters"][0], "action": row["meta"]["action"],
                 "object": row["meta"]["object"], "colour": row["meta"]["colour"]}
        for kind, value in truth.items():
            names = [n for k, n in codebook.vectors if k == kind]
            scores = [float(mean @ codebook[(kind, n)]) for n in names]
            assert names[int(np.argmax(scores))] == value, (row["id"], kind)


def test_movie_corpus_and_texts(movie_dir: Path) -> None:
    corpus = read_jsonl(movie_dir / "corpus.jsonl")
    assert len(corpus) == 5 * 11
    assert all(1 <= len(r["context"]) <= 3 and isinstance(r["ad"], str) for r in corpus)
    held_out = {r["ad"] for s in ("val", "test") for r in read_jsonl(movie_dir / f"{s}.jsonl")}
    texts = set((movie_dir / "texts.txt").read_text(encoding="utf-8").splitlines())
    assert {r["ad"] for r in corpus} <= texts and held_out <= texts


def test_movie_defaults_fit_budget(tmp_path: Path) -> None:
    counts = movie_world.main(["--out", str(tmp_path)])
    assert (counts["train"], counts["val"], counts["test"]) == (160, 40, 100)
    assert 1000 <= counts["corpus"] <= 5000
    assert _size(tmp_path) < 5e6


# --- toy soundscapes --------------------------------------------------------------------------
def test_soundscapes_are_deterministic(sound_dir: Path, tmp_path: Path) -> None:
    sound_world.main(["--out", str(tmp_path / "again"), *SMALL_SOUND, "--bad-examples"])
    first, second = _tree(sound_dir), _tree(tmp_path / "again")
    assert first.keys() == second.keys()
    assert [k for k in first if first[k] != second[k]] == []


def _sound_rows(root: Path) -> list[dict]:
    return [row for s in ("train", "val", "test") for row in read_jsonl(root / f"{s}.jsonl")]


def _gold_text(event: dict, attribute: str) -> str:
    if attribute == "count":
        return sound_world.COUNT_WORDS[event["count"]]
    return event[attribute]


def test_soundscape_rows_schema(sound_dir: Path) -> None:
    values = {"type": set(sound_world.TYPES), "pitch": set(sound_world.PITCHES),
              "loudness": set(sound_world.LOUDNESSES),
              "count": set(sound_world.COUNT_WORDS.values())}
    for row in _sound_rows(sound_dir):
        assert set(row) == {"id", "audio", "duration", "caption", "short_caption", "events",
                            "cloze", "mcq", "qa", "anchors"}
        assert row["audio"] == f"audio/{row['id']}.wav"
        events = row["events"]
        assert 1 <= len(events) <= 3 and len({e["type"] for e in events}) == len(events)
        end = 0.0
        for event in events:
            assert set(event) == {"type", "pitch", "loudness", "count", "start", "end"}
            assert end <= event["start"] < event["end"] <= row["duration"]  # time order, no overlap
            assert round(event["start"], 1) == event["start"]
            assert round(event["end"], 1) == event["end"]
            assert event["type"] in values["type"] and event["count"] in (1, 2, 3, 4)
            end = event["end"]
        sentences = [sound_world.SoundEvent(**e).sentence() for e in events]
        assert row["caption"] == " ".join(sentences)
        assert all(e["type"] in row["short_caption"] for e in events)
        assert row["short_caption"].endswith(" heard.")
        for bank in ("cloze", "mcq"):
            items = row[bank]
            assert len(items) == 4 * len(events)
            for item in items:
                meta = item["meta"]
                event = events[meta["event"]]
                assert meta["subject"] == event["type"]
                options = item["options"]
                assert len(options) == 5 and options[4] == "Not given"
                assert item["answer"] in "ABCD" and len(item["answer"]) == 1
                assert len(set(options[:4])) == 4 and set(options[:4]) <= values[meta["attribute"]]
                assert options["ABCD".index(item["answer"])] == _gold_text(event, meta["attribute"])
                if bank == "cloze":
                    assert item["passage"].count("___") == 1
                    filled = item["passage"].replace("___", _gold_text(event, meta["attribute"]))
                    assert filled in row["caption"]
                else:
                    assert item["passage"].endswith("?")
                    assert f"{event['start']:.1f} s" in item["passage"]
        assert len(row["qa"]) == 5 * len(events)
        assert {q["meta"]["attribute"] for q in row["qa"]} == {"pitch", "loudness", "count", "time", "event"}
        whole = [q["answer"] for q in row["qa"] if q["meta"]["attribute"] == "event"]
        assert " ".join(whole) == row["caption"]  # one whole-event answer per event, in time order
        assert all(q["question"].endswith("?") and q["answer"].endswith(".") for q in row["qa"])
        assert row["anchors"] == [
            {"event": f"the {e['loudness']} {e['pitch']} {e['type']}", "start": e["start"],
             "end": e["end"]} for e in events]


def test_gold_positions_spread_over_a_to_d(sound_dir: Path) -> None:
    for bank in ("cloze", "mcq"):
        answers = Counter(item["answer"] for row in _sound_rows(sound_dir) for item in row[bank])
        total = sum(answers.values())
        assert set(answers) == set("ABCD"), answers
        assert min(answers.values()) > 0.1 * total, answers


def test_audio_matches_rows(sound_dir: Path) -> None:
    for row in _sound_rows(sound_dir):
        info = soundfile.info(str(sound_dir / row["audio"]))
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert info.frames == round(row["duration"] * 16000)
        wave, _ = soundfile.read(str(sound_dir / row["audio"]))
        for event in row["events"]:  # every event is audible where its row says it is
            segment = wave[int(event["start"] * 16000):int(event["end"] * 16000)]
            assert np.abs(segment).max() > 0.04, (row["id"], event)


def test_texts_cover_every_string(sound_dir: Path) -> None:
    texts = set((sound_dir / "texts.txt").read_text(encoding="utf-8").splitlines())
    for row in _sound_rows(sound_dir):
        assert set(sound_world.row_texts(row)) <= texts


def test_bad_examples(sound_dir: Path, tmp_path: Path) -> None:
    path = sound_world.write_bad_examples(tmp_path)
    assert path == tmp_path / "bad.jsonl"
    rows = {row["id"]: row for row in read_jsonl(path)}
    assert list(rows) == ["bad-missing", "bad-empty", "bad-corrupt", "bad-gold-e", "bad-gold-z",
                          "bad-valid"]
    assert not (tmp_path / rows["bad-missing"]["audio"]).exists()
    assert (tmp_path / rows["bad-empty"]["audio"]).stat().st_size == 0
    with pytest.raises(Exception):
        soundfile.read(str(tmp_path / rows["bad-corrupt"]["audio"]))
    for letter in "EZ":
        row = rows[f"bad-gold-{letter.lower()}"]
        assert row["cloze"][0]["answer"] == letter and row["mcq"][0]["answer"] == letter
    valid = rows["bad-valid"]
    assert valid["broken"] is None and all(r["broken"] for k, r in rows.items() if k != "bad-valid")
    assert all(item["answer"] in "ABCD" for item in valid["cloze"] + valid["mcq"])
    reference, _ = soundfile.read(str(tmp_path / valid["audio"]))
    for row in read_jsonl(tmp_path / "formats.jsonl"):
        wave, rate = soundfile.read(str(tmp_path / row["audio"]))
        assert rate == 16000 and wave.shape == reference.shape
    flac, _ = soundfile.read(str(tmp_path / "audio" / "bad-valid.flac"))
    assert np.array_equal(flac, reference)  # lossless
    assert (sound_dir / "bad.jsonl").read_bytes() == path.read_bytes()


def test_soundscape_defaults_fit_budget(tmp_path: Path) -> None:
    counts = sound_world.main(["--out", str(tmp_path)])
    assert (counts["train"], counts["val"], counts["test"]) == (600, 30, 150)
    assert _size(tmp_path) < 120e6  # 16-bit mono wav, about 100 MB for the demo world
    durations = [row["duration"] for row in _sound_rows(tmp_path)]
    assert min(durations) == 2.0 and max(durations) >= 7.5  # room for a duration curriculum
    assert sum(d <= 3.0 for d in durations) > 0.25 * len(durations)


def test_cli_rejects_bad_sizes_and_prints_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        sound_world.main(["--out", str(tmp_path), "--min-duration", "1.0"])
    with pytest.raises(SystemExit):
        movie_world.main(["--out", str(tmp_path), "--clips-per-movie", "0"])
    scripts = (("make_toy_movie.py", SMALL_MOVIE), ("make_toy_soundscapes.py", SMALL_SOUND))
    for script, flags in scripts:
        done = subprocess.run([sys.executable, str(TOOLS / script), "--out", str(tmp_path / script),
                               *flags], capture_output=True, text=True, check=True)
        assert len(done.stdout.strip().splitlines()) == 1
