"""The real-speech world (agentcap_envs.real.speech): Asterisk voice prompts and freedesktop sound
effects mixed into AudioMap / ACE-Cap clips, read through the actual environments.

Needs the Debian assets that tools/setup.sh unpacks into .assets/ (or installed under /usr/share);
without them every test here is skipped with the one-line reason the locator gives.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import soundfile

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap_envs.real import assets, speech

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--max-clips", "6", "--seed", "0"]

try:
    RECORDINGS, TRANSCRIPTS, EFFECTS = assets.recordings_dir(), assets.transcripts_file(), assets.effects_dir()
except assets.AssetError as error:  # pragma: no cover - depends on the machine
    pytest.skip(str(error), allow_module_level=True)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("real_speech")
    counts = speech.main(["--out", str(out), *SMALL])
    assert counts["train"] == counts["val"] == counts["test"] == 6
    return out


@pytest.fixture(scope="module")
def rows(world) -> dict[str, list[dict]]:
    return {split: _read(world / f"{split}.jsonl") for split in ("train", "val", "test")}


# --- the build ----------------------------------------------------------------------------------
def test_rebuild_is_byte_identical_and_the_seed_matters(world, tmp_path):
    again = tmp_path / "again"
    speech.main(["--out", str(again), *SMALL])
    names = sorted(str(p.relative_to(world)) for p in world.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file())
    assert {"train.jsonl", "val.jsonl", "test.jsonl", "benchmark.jsonl", "texts.txt", "ATTRIBUTION.txt"} <= set(names)
    match, mismatch, errors = filecmp.cmpfiles(world, again, names, shallow=False)
    assert not mismatch and not errors
    other = tmp_path / "other"
    speech.main(["--out", str(other), "--max-clips", "2", "--seed", "1"])
    assert (other / "train.jsonl").read_bytes() != (world / "train.jsonl").read_bytes()[: len((other / "train.jsonl").read_bytes())]


def test_splits_are_disjoint_by_recording_and_sentence(rows):
    table = assets.transcripts()
    recordings = speech.load_recordings(RECORDINGS, table, 0.5, 6.0)
    splits = speech.split_recordings(recordings, 0, 0.1, 0.2)
    keys = {split: {s.key for s in sources} for split, sources in splits.items()}
    texts = {split: {s.text.lower() for s in sources} for split, sources in splits.items()}
    assert sum(len(k) for k in keys.values()) == len(recordings) == len(set().union(*keys.values()))
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not keys[a] & keys[b] and not texts[a] & texts[b]
    # the written clips use only their own split's recordings, with the transcripts the package gives
    for split, split_rows in rows.items():
        for row in split_rows:
            for event in row["events"]:
                if event["type"] == "speech":
                    assert event["source"] in keys[split]
                    assert event["transcript"] == speech.clean_transcript(table[event["source"]])


def test_clips_are_16k_mono_within_limits(world, rows):
    for row in (r for split in rows.values() for r in split):
        info = soundfile.info(str(world / row["audio"]))
        assert (info.samplerate, info.channels, info.subtype) == (16_000, 1, "PCM_16")
        assert info.frames == round(row["duration"] * 16_000) and row["duration"] <= 10.0
        kinds = [e["type"] for e in row["events"]]
        assert 1 <= kinds.count("speech") <= 2 and kinds.count("effect") <= 2
        spans = [(e["onset"], e["offset"]) for e in row["events"]]
        assert spans == sorted(spans) and all(a < b for a, b in spans)
        assert all(b1 < a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # no overlap, a gap between


def test_events_are_where_the_sound_is(world, rows):
    """Energy check: every event's span is loud, every gap between events is the noise floor, and
    each utterance starts within its first 0.1 s."""
    for row in (r for split in rows.values() for r in split):
        wave, rate = soundfile.read(str(world / row["audio"]), dtype="float64")
        inside = np.zeros(len(wave), bool)
        for event in row["events"]:
            a, b = round(event["onset"] * rate), round(event["offset"] * rate)
            inside[a:b] = True
            span = wave[a:b]
            assert np.sqrt(np.mean(span ** 2)) > 0.01, (row["id"], event)
            if event["type"] == "speech":
                head = wave[a:a + rate // 10]
                assert np.abs(head).max() > 0.01, (row["id"], event)
        assert np.sqrt(np.mean(wave[~inside] ** 2)) < 0.003, row["id"]


def test_gold_text_quotes_the_transcripts_in_time_order(rows):
    for row in (r for split in rows.values() for r in split):
        at = 0
        for event in row["events"]:
            needle = f'"{event["transcript"]}"' if event["type"] == "speech" else event["label"]
            found = row["caption"].find(needle, at)
            assert found >= 0, (row["caption"], needle)
            at = found
        for bank in ("cloze", "mcq"):
            assert row[bank] and all(q["options"][4] == "Not given" and q["answer"] in "ABCD" for q in row[bank])
        assert all("___" in q["passage"] for q in row["cloze"])
        assert {q["meta"]["attribute"] for q in row["cloze"]} >= {"word", "onset"}


# --- through the environments ------------------------------------------------------------------
def test_cloze_caption_env_gives_the_gold_caption_full_marks(world, rows):
    from agentcap.testing import check_env

    env = gymnasium.make("agentcap/ClozeCaption-v0", manifest=str(world / "train.jsonl"), prompt="compact",
                         examiner="rule", temporal_examiner="rule")
    assert len(env.unwrapped.items) == len(rows["train"])
    for index, row in enumerate(rows["train"]):
        obs, _ = env.reset(options={"index": index})
        assert len(obs["media"]["waveform"]) == round(row["duration"] * 16_000)
        _, reward, terminated, _, info = env.step(row["caption"])
        assert terminated
        assert info["rewards"]["esr"] == 1.0, row["id"]
        assert info["rewards"]["ectr"] >= 0.99, row["id"]
        assert info["rewards"]["length"] == 1.0
        env.reset(options={"index": index})
        assert env.step("")[4]["rewards"]["esr"] == -0.5  # nothing said: every item "Not given"
    check_env(env, policy=lambda obs: rows["train"][0]["caption"])


def test_evidence_game_env_with_gold_answers(world, rows):
    from agentcap.testing import check_env

    env = gymnasium.make("agentcap/EvidenceGame-v0", manifest=str(world / "train.jsonl"), prompt="compact",
                         examiner="rule", budget=4)
    for index, row in enumerate(rows["train"]):
        asks = [q for q in row["qa"] if q["meta"]["attribute"] == "event"]
        assert len(asks) == len(row["events"]) <= 4
        env.reset(options={"index": index})
        env.step(row["short_caption"])
        for pair in asks:
            env.step(f"ASK: {pair['question']}")
            env.step(pair["answer"])
        if len(asks) < 4:
            env.step("READY")
        _, reward, terminated, _, info = env.step(row["caption"])
        assert terminated, row["id"]
        assert info["score"].extras["acc_evidence"] == 1.0 and info["score"].extras["acc_final"] == 1.0, row["id"]
        assert info["score"].extras["acc_c0"] < 1.0  # the draft names the sounds, not what was said
        demos = env.unwrapped.demonstrations(env.unwrapped.items[index])
        assert demos[0][1] == row["short_caption"] and demos[-1][1] == row["caption"]
    check_env(env, policy=lambda obs: "READY")


def test_benchmark_rows_pass_the_benchmark_loader(world, rows):
    from agentcap.evaluation.benchmark import read_benchmark

    questions = read_benchmark(str(world / "benchmark.jsonl"))
    test_ids = {row["id"] for row in rows["test"]}
    assert {q["id"].rsplit("-q", 1)[0] for q in questions} == test_ids
    assert {q["category"] for q in questions} >= {"speech content", "sound events", "temporal order"}
    assert all(Path(q["_clip"]).is_file() and "Not given" not in q["choices"] for q in questions)
    by_id = {row["id"]: row for row in rows["test"]}
    for q in questions:
        if q["subcategory"] == "sentence":
            spoken = [e["transcript"] for e in by_id[q["id"].rsplit("-q", 1)[0]]["events"] if e["type"] == "speech"]
            assert q["answer_text"] in spoken


# --- bad assets and rows ---------------------------------------------------------------------------
def _small_assets(tmp_path: Path) -> Path:
    """A copy of a dozen usable recordings."""
    table = assets.transcripts()
    folder = tmp_path / "recordings"
    folder.mkdir()
    names = [n for n in sorted(table) if "/" not in n and (RECORDINGS / f"{n}.wav").is_file()
             and speech.clean_transcript(table[n]) and len(table[n].split()) > 2][:40]
    for name in names:
        shutil.copy(RECORDINGS / f"{name}.wav", folder / f"{name}.wav")
    return folder


def test_undecodable_or_missing_recording_is_one_line_naming_it(tmp_path):
    folder = _small_assets(tmp_path)
    victim = sorted(folder.glob("*.wav"))[3]
    victim.write_bytes(b"JUNK" + bytes(range(256)) * 8)
    with pytest.raises(SystemExit) as raised:
        speech.main(["--out", str(tmp_path / "w"), "--max-clips", "1", "--recordings", str(folder)])
    message = str(raised.value)
    assert "\n" not in message and str(victim) in message and "cannot decode" in message

    victim.unlink()
    victim.symlink_to(tmp_path / "nowhere.wav")  # listed, but the file is gone
    with pytest.raises(SystemExit) as raised:
        speech.main(["--out", str(tmp_path / "w"), "--max-clips", "1", "--recordings", str(folder)])
    message = str(raised.value)
    assert "\n" not in message and victim.stem in message and "not found" in message


def test_missing_assets_name_the_apt_command(tmp_path):
    with pytest.raises(SystemExit) as raised:
        speech.main(["--out", str(tmp_path / "w"), "--recordings", str(tmp_path / "none")])
    assert "\n" not in str(raised.value) and str(tmp_path / "none") in str(raised.value)
    with pytest.raises(SystemExit) as raised:
        speech.main(["--out", str(tmp_path / "w"), "--transcripts", str(tmp_path / "none.txt.gz")])
    message = str(raised.value)
    assert "\n" not in message and "none.txt.gz" in message and "apt-get download asterisk-core-sounds-en" in message


def test_a_deleted_clip_is_named_by_its_row_when_loaded(world, tmp_path):
    from agentcap.core.manifests import ManifestError

    copy = tmp_path / "world"
    shutil.copytree(world, copy)
    first = _read(copy / "val.jsonl")[2]
    (copy / first["audio"]).unlink()
    with pytest.raises(ManifestError) as raised:
        gymnasium.make("agentcap/ClozeCaption-v0", manifest=str(copy / "val.jsonl"), prompt="compact")
    assert first["audio"].split("/")[-1] in str(raised.value) and "val.jsonl:3" in str(raised.value)
