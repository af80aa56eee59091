"""Every audio check that passes at load also decodes: zero frames, truncated MP3s and files cut
at ``max_seconds`` are named, never passed on silently (issue 11, cases 1, 3 and 8). Only the part
kept at ``max_seconds`` is decoded and held in memory (issue 26)."""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import soundfile

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.core.manifests import (
    AudioDecodeError,
    ManifestError,
    TruncationWarning,
    check_audio,
    decoded_duration,
    load_audio,
)

RATE = 16000


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("audio")
    soundfile.write(out / "whole.mp3", tone(6.0), RATE, format="MP3")
    soundfile.write(out / "whole.ogg", tone(6.0), RATE, format="OGG", subtype="VORBIS")
    soundfile.write(out / "zero.wav", np.zeros(0, np.float32), RATE)
    # the first kilobyte of a 6 s MP3: its header still says 6 s, the decoder gives ~0.15 s
    (out / "truncated.mp3").write_bytes((out / "whole.mp3").read_bytes()[:1000])
    soundfile.write(out / "long.wav", tone(10.0), RATE)
    soundfile.write(out / "sixty.mp3", tone(60.0), RATE, format="MP3")
    soundfile.write(out / "sixty.flac", tone(60.0), RATE, format="FLAC")
    for name in ("sixty.mp3", "sixty.flac"):  # the first half of a 60 s file; the header still says 60 s
        whole = (out / name).read_bytes()
        (out / f"half_{name}").write_bytes(whole[: len(whole) // 2])
    return out


def test_whole_mp3_and_vorbis_decode_to_their_header_length(files):
    for name in ("whole.mp3", "whole.ogg"):
        assert decoded_duration(str(files / name)) == pytest.approx(6.0, abs=0.05)
        assert len(load_audio(str(files / name), RATE)) == pytest.approx(6 * RATE, abs=0.05 * RATE)


def test_truncated_mp3_is_refused_naming_both_lengths(files):
    assert soundfile.info(str(files / "truncated.mp3")).duration == pytest.approx(6.0)  # what the header claims
    with pytest.raises(AudioDecodeError, match=r"m.jsonl:3: field 'audio'.*truncated.mp3.*decodes to \d+ frames.*header says 96000"):
        check_audio({"audio": str(files / "truncated.mp3")}, "audio", "m.jsonl:3")


def test_zero_frame_wav_is_refused_at_load(files):
    assert soundfile.info(str(files / "zero.wav")).frames == 0  # opens fine: the old check let it through
    with pytest.raises(ManifestError, match=r"m.jsonl:1: field 'audio'.*zero.wav.*has no audio frames"):
        check_audio({"audio": str(files / "zero.wav")}, "audio", "m.jsonl:1")


def manifest_with(tmp_path, toy_soundscapes, audio: str, **fields) -> str:
    row = json.loads((toy_soundscapes / "train.jsonl").read_text().splitlines()[0])
    row.update(audio=audio, **fields)
    row.pop("duration", None)
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


def test_duration_is_the_decoded_length(tmp_path, toy_soundscapes, files):
    """``audio_check: decode``: every clip decoded at load, the duration is the decoded length."""
    env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest_with(tmp_path, toy_soundscapes, str(files / "whole.mp3")),
                   audio_check="decode")
    assert env.unwrapped.items[0]["duration"] == pytest.approx(6.0, abs=0.05)
    with pytest.raises(AudioDecodeError, match="m.jsonl:1"):
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest_with(tmp_path, toy_soundscapes, str(files / "truncated.mp3")),
                 audio_check="decode")


def test_a_truncated_file_is_refused_when_used_naming_the_row(tmp_path, toy_soundscapes, files):
    """The default ``audio_check: header`` reads the header at load (no decoding: issue 34 case 11);
    what only decoding finds is refused when the item is used, naming file, row and field."""
    env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest_with(tmp_path, toy_soundscapes, str(files / "truncated.mp3")))
    assert env.unwrapped.items[0]["duration"] == pytest.approx(6.0)  # the header's claim, until it is decoded
    with pytest.raises(AudioDecodeError, match=r"m\.jsonl:1: field 'audio': audio file '.*truncated\.mp3' decodes to \d+ frames"):
        env.reset(options={"index": 0})


def test_clips_longer_than_max_seconds_are_counted_in_a_warning(tmp_path, toy_soundscapes, files):
    manifest = manifest_with(tmp_path, toy_soundscapes, str(files / "long.wav"))
    with pytest.warns(TruncationWarning, match=r"1 of 1 clips are longer than max_seconds=2.0 .*longest 10.0 s"):
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest, max_seconds=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncationWarning)
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest, max_seconds=30.0)


def test_raw_audio_items_are_checked_like_manifest_rows(tmp_path, toy_soundscapes, files):
    env = gym.make("agentcap/ClozeCaption-v0", manifest=str(toy_soundscapes / "val.jsonl")).unwrapped
    assert env.item_from_audio(str(files / "whole.ogg"))["duration"] == pytest.approx(6.0, abs=0.05)
    for name, problem in (("zero.wav", "no audio frames"), ("missing.wav", "not found")):
        with pytest.raises(ManifestError, match=problem):
            env.item_from_audio(str(files / name))
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(ManifestError, match="is empty"):
        env.item_from_audio(str(tmp_path / "empty.wav"))


def test_only_the_kept_part_is_decoded(files):
    half = str(files / "half_sixty.flac")  # decodes fine for ~25 s, then the FLAC decoder loses sync
    with pytest.raises(ManifestError, match="half_sixty.flac"):
        load_audio(half, RATE)  # all of it: the damage is reached
    assert len(load_audio(half, RATE, max_seconds=5.0)) == 5 * RATE  # the first 5 s never reach it
    # resampling only the kept part gives the samples that resampling the whole file and cutting gave
    import torch
    import torchaudio.functional as AF

    whole = AF.resample(torch.from_numpy(tone(60.0)), RATE, 22050)[: 5 * 22050].numpy()
    np.testing.assert_allclose(load_audio(str(files / "sixty.flac"), 22050, max_seconds=5.0), whole, atol=1e-4)


@pytest.mark.parametrize("name", ["half_sixty.mp3", "half_sixty.flac"])
def test_a_damaged_tail_past_max_seconds_is_still_refused(files, name):
    assert soundfile.info(str(files / name)).frames == 60 * RATE
    with pytest.raises(AudioDecodeError, match=rf"m.jsonl:2: field 'audio'.*{name}.*decodes to at most \d+ frames.*header says 960000"):
        check_audio({"audio": str(files / name)}, "audio", "m.jsonl:2", max_seconds=5.0)
    assert check_audio({"audio": str(files / "sixty.mp3")}, "audio", "m.jsonl:2", max_seconds=5.0) == pytest.approx(60.0, abs=0.05)


def test_a_file_truncated_inside_max_seconds_names_the_decoded_length(files):
    with pytest.raises(AudioDecodeError, match=r"decodes to 4\d{5} frames \(2\d\.\d+ s\) but its header says 960000"):
        check_audio({"audio": str(files / "half_sixty.mp3")}, "audio", "m.jsonl:2", max_seconds=45.0)
    with pytest.raises(AudioDecodeError, match=r"half_sixty.mp3.*decodes to 4\d{5} frames .*header says 960000"):
        load_audio(str(files / "half_sixty.mp3"), RATE, where="m.jsonl:2", max_seconds=45.0)


@pytest.mark.slow  # two fresh interpreters that import torch
def test_peak_memory_follows_max_seconds_not_the_file(tmp_path):
    """A 50 MB WAV (26 min) cut at 30 s: decoding it whole took 214 MB more (623 MB resampled)."""
    spec = importlib.util.spec_from_file_location("bench", Path(__file__).parents[1] / "tools" / "bench_audio_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = bench.sparse_wav(str(tmp_path / "long.wav"), 50_000_000)
    assert soundfile.info(path).frames == (50_000_000 - 44) // 2
    # 22.05 kHz: resampled (torch's first convolution alone costs ~30 MB, whatever the length)
    for kind, rate, bound in (("load", RATE, 30e6), ("load", 22050, 100e6), ("check", RATE, 5e6)):
        row = bench.measure(kind, path, rate, 30.0)
        assert row["kept_bytes"] == 30 * rate * 4
        assert row["peak_increase"] < bound, (kind, rate, row)


def test_caption_audio_warns_for_files_longer_than_max_seconds(tmp_path, toy_soundscapes, files):
    from test_caption_robustness import caption_command, cloze_config

    soundfile.write(tmp_path / "short.wav", tone(1.0), RATE)
    config = cloze_config(tmp_path, toy_soundscapes, max_seconds=2.0)
    with pytest.warns(TruncationWarning, match=r"ClozeCaptionEnv --audio: 1 of 2 clips are longer than max_seconds=2.0 .*longest 10.0 s"):
        code = caption_command(["--config", config, "--audio", str(files / "long.wav"), str(tmp_path / "short.wav"),
                                "--out", str(tmp_path / "out.jsonl")])
    assert code == 0


# --- non-finite and out-of-range samples (issue 34 case 4) -------------------------------------------
@pytest.fixture(scope="module")
def bad_samples(tmp_path_factory):
    """Float WAVs whose samples are NaN, Inf or absurdly large (from 0.5 s on), and two that are fine:
    a float file running hot (peak 1.5) and a full-scale 16-bit one."""
    out = tmp_path_factory.mktemp("samples")
    for name, value in (("nan", np.nan), ("inf", np.inf), ("huge", 1e6)):
        wave = tone(1.0)
        wave[RATE // 2 :: 97] = value
        soundfile.write(out / f"{name}.wav", wave, RATE, subtype="FLOAT")
    stereo = np.stack([tone(1.0), tone(1.0)], axis=1)
    stereo[RATE // 2, 1] = np.nan  # one channel, one frame
    soundfile.write(out / "nan_stereo.wav", stereo, RATE, subtype="FLOAT")
    soundfile.write(out / "hot.wav", tone(1.0) * 5.0, RATE, subtype="FLOAT")  # peak 1.5
    soundfile.write(out / "full.wav", np.sign(tone(1.0)), RATE, subtype="PCM_16")
    return out


@pytest.mark.parametrize("name, problem", [("nan", r"non-finite samples \(NaN or Inf\) from 0\.500 s"),
                                           ("inf", r"non-finite samples \(NaN or Inf\) from 0\.500 s"),
                                           ("nan_stereo", r"non-finite samples \(NaN or Inf\) from 0\.500 s"),
                                           ("huge", r"samples of magnitude up to 1e\+06 from 0\.500 s, beyond ±4")])
def test_non_finite_or_out_of_range_samples_are_refused_naming_the_file(bad_samples, name, problem):
    path = str(bad_samples / f"{name}.wav")
    with pytest.raises(AudioDecodeError, match=rf"m.jsonl:4: field 'audio': audio file '.*/{name}\.wav' has {problem}"):
        check_audio({"audio": path}, "audio", "m.jsonl:4")
    with pytest.raises(AudioDecodeError, match=rf"{name}\.wav' has {problem}"):
        check_audio({"audio": path}, "audio", "m.jsonl:4", max_seconds=0.8)  # inside the kept part
    with pytest.raises(AudioDecodeError, match=rf"clip: audio file '.*/{name}\.wav' has {problem}"):
        load_audio(path, RATE, "clip")


def test_loud_float_and_full_scale_integer_files_pass(bad_samples):
    for name in ("hot.wav", "full.wav"):
        assert check_audio({"audio": str(bad_samples / name)}, "audio", "m.jsonl:1") == pytest.approx(1.0)
        assert len(load_audio(str(bad_samples / name), RATE)) == RATE


def test_bad_samples_are_refused_at_load_in_caption_evaluate_and_fit(tmp_path, toy_soundscapes, bad_samples, capsys):
    """``caption --audio``: an error row naming the file, exit 1. A manifest row (what ``fit`` and
    ``evaluate`` load through the environment): refused naming the manifest line, the field and the
    file, at load with ``audio_check: decode``, when the item is used by default."""
    from test_caption_robustness import caption_command, cloze_config

    good = sorted((toy_soundscapes / "audio").glob("test-*.wav"))[0]
    files = [str(good), str(bad_samples / "nan.wav"), str(bad_samples / "huge.wav")]
    out = tmp_path / "captions.jsonl"
    code = caption_command(["--config", cloze_config(tmp_path, toy_soundscapes), "--audio", *files, "--out", str(out)])
    assert code == 1
    errors = sorted(r["error"] for r in map(json.loads, out.read_text().splitlines()) if r.get("error"))
    assert len(errors) == 2 and "huge.wav' has samples of magnitude" in errors[0]
    assert "nan.wav' has non-finite samples" in errors[1]
    assert "1 captioned, 2 failed, 0 skipped" in capsys.readouterr().err

    rows = [json.loads(line) for line in (toy_soundscapes / "val.jsonl").read_text().splitlines()[:3]]
    for row in rows:
        row["audio"] = str(toy_soundscapes / row["audio"])
    rows[1]["audio"] = str(bad_samples / "inf.wav")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    refusal = r"m\.jsonl:2: field 'audio': audio file '.*/inf\.wav' has non-finite"
    with pytest.raises(ManifestError, match=refusal):
        gym.make("agentcap/ClozeCaption-v0", manifest=str(manifest), audio_check="decode")
    env = gym.make("agentcap/ClozeCaption-v0", manifest=str(manifest), on_error="skip", max_skip_fraction=0.5,
                   audio_check="decode").unwrapped
    assert len(env.items) == 2
    # the default reads headers at load (issue 34 case 11): the row is refused when it is used, as named
    env = gym.make("agentcap/ClozeCaption-v0", manifest=str(manifest)).unwrapped
    assert len(env.items) == 3
    env.reset(options={"index": 0})
    with pytest.raises(ManifestError, match=refusal):
        env.reset(options={"index": 1})


# --- bad audio found when used, under on_error: skip ---------------------------------------------------
def _manifest_with_bad_row(tmp_path, toy_soundscapes, bad: Path) -> tuple[str, list[dict]]:
    """Four val-like rows whose second row's audio is ``bad`` (found only when decoded: at use)."""
    rows = [json.loads(line) for line in (toy_soundscapes / "train.jsonl").read_text().splitlines()[:4]]
    for row in rows:
        row["audio"] = str(toy_soundscapes / row["audio"])
    rows[1]["audio"] = str(bad)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(manifest), rows


class _Captioner:
    """A scripted policy: the same caption for every observation (no model)."""

    def generate(self, observations, greedy, batch_size, seeds=None, old_logprobs=True):
        import torch

        from agentcap.agents.generation import Generation

        return [Generation(torch.zeros(1, dtype=torch.long), text="a bird sings", old_logprobs=torch.zeros(1))
                for _ in observations]


def test_a_row_unusable_when_used_is_skipped_named_once_and_counted(tmp_path, toy_soundscapes, bad_samples, capsys):
    """``on_error: skip``: the row whose audio fails at use (NaN / Inf samples) is named once on stderr
    (file:line, field, reason), every rollout of its group takes the next usable row instead (the same
    one, whatever order the environments meet it in), the split's ``skipped_rows`` counts it, and an
    evaluation leaves it out; ``on_error: raise`` stops with the named error as before."""
    from agentcap.core import unusable
    from agentcap.core.schedule import Stage
    from agentcap.evaluation.rollouts import evaluate_rollouts
    from agentcap.rollout.splits import EnvConfig, Splits

    manifest, rows = _manifest_with_bad_row(tmp_path, toy_soundscapes, bad_samples / "inf.wav")
    refusal = r"m\.jsonl:2: field 'audio': audio file '.*/inf\.wav' has non-finite samples"
    with pytest.raises(ManifestError, match=refusal):
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest).unwrapped.reset(options={"index": 1})

    spec = EnvConfig(id="agentcap/ClozeCaption-v0", kwargs={"on_error": "skip", "max_skip_fraction": 0.3},
                     train={"manifest": manifest})
    splits = Splits(spec, {"policy": _Captioner()}, generation_batch_size=4, seed=0)
    driver = splits.driver("train", Stage(name="grpo", kind="grpo", agent="policy"))
    assert splits.skipped_rows == {"train": 0}  # headers only at load: nothing found yet
    capsys.readouterr()
    batch = driver.run(indices=[1, 3], group_size=2, seed=5)
    assert [e.item["id"] for e in batch.episodes] == [rows[2]["id"]] * 2 + [rows[3]["id"]] * 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "skipped when used" in line]
    assert len(lines) == 1 and re.search(refusal, lines[0]) and "(on_error: skip)" in lines[0]
    assert splits.skipped_rows == {"train": 1} and list(unusable.found(manifest)) == [f"{manifest}:2"]
    driver.run(indices=[1], group_size=2, seed=6)  # marked: passed by without decoding or a new line
    assert "skipped when used" not in capsys.readouterr().err and splits.skipped_rows == {"train": 1}

    evaluated: list[dict] = []
    evaluate_rollouts(driver, None, chunk=4, greedy=True, seed=0, rows=evaluated)
    assert [r["id"] for r in evaluated] == [rows[i]["id"] for i in (0, 2, 3)]  # left out, not replaced


def test_rows_unusable_when_used_may_not_pass_max_skip_fraction(tmp_path, toy_soundscapes, bad_samples):
    manifest, _ = _manifest_with_bad_row(tmp_path, toy_soundscapes, bad_samples / "nan.wav")
    env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest, on_error="skip").unwrapped  # 0.1 of 4 rows
    with pytest.raises(ManifestError, match=r"m\.jsonl: 1 of 4 rows are unusable \(1 found when used\), more than "
                                            r"max_skip_fraction=0\.1; the last: .*m\.jsonl:2: field 'audio'"):
        env.reset(options={"index": 1})
