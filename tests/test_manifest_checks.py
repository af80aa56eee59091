"""Every manifest field a task reads later is checked at load, as file:line: field (issue 11, case 7),
choice-valued arguments refuse a typo, and a finished episode cannot be stepped again (case 8). A bad
byte costs one row, a refused row keeps its id, and a load that refuses every row says why (issue 26)."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.core.manifests import ManifestError, NoUsableRows, SkipReport, read_manifest


def rows_of(world, split="train"):
    rows = [json.loads(line) for line in (world / f"{split}.jsonl").read_text().splitlines()]
    for row in rows:  # absolute paths: the manifest is rewritten elsewhere
        for key in ("audio", "features"):
            if key in row:
                row[key] = str(world / row[key])
    return rows


def write(tmp_path, rows):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["qa"][0].pop("answer"), r"m.jsonl:2: qa\[0\]: field 'answer' must be a non-empty string, got missing"),
        (lambda r: r.update(qa=[{"question": 3, "answer": "x"}]), r"m.jsonl:2: qa\[0\]: field 'question' .* got 3"),
        (lambda r: r.update(short_caption=7), r"m.jsonl:2: field 'short_caption' must be a non-empty string, got 7"),
        (lambda r: r.update(duration=-1.0), r"m.jsonl:2: field 'duration' must be a number of seconds ≥ 0, got -1.0"),
        (lambda r: r.update(duration="long"), r"m.jsonl:2: field 'duration' .* got 'long'"),
    ],
)
def test_evidence_game_rows_are_checked_at_load(tmp_path, toy_soundscapes, change, message):
    rows = rows_of(toy_soundscapes)[:2]
    assert rows[1].get("qa"), "the toy world gives warm-start QA pairs"
    change(rows[1])
    with pytest.raises(ManifestError, match=message):
        gym.make("agentcap/EvidenceGame-v0", manifest=write(tmp_path, rows))


def test_cloze_rows_are_checked_at_load(tmp_path, toy_soundscapes):
    rows = rows_of(toy_soundscapes)[:1]
    row = rows[0]
    row["anchors"] = [{"event": "a late bark", "start": 1.0, "end": row["duration"] + 5}]
    with pytest.raises(ManifestError, match=r"m.jsonl:1: anchors\[0\]: event 'a late bark' .* ends past the clip's end"):
        gym.make("agentcap/ClozeCaption-v0", manifest=write(tmp_path, rows))
    row = rows_of(toy_soundscapes)[0]
    row["cloze"][1]["passage"] = "A dog barks."
    with pytest.raises(ManifestError, match=r"m.jsonl:1: cloze\[1\]: field 'passage' has no blank"):
        gym.make("agentcap/ClozeCaption-v0", manifest=write(tmp_path, [row]))
    row = rows_of(toy_soundscapes)[0]
    row["duration"] = True
    with pytest.raises(ManifestError, match=r"m.jsonl:1: field 'duration' .* got True"):
        gym.make("agentcap/ClozeCaption-v0", manifest=write(tmp_path, [row]))


def test_ad_clip_duration_is_checked(tmp_path, toy_movie):
    rows = rows_of(toy_movie, "val")[:1]
    rows[0]["duration"] = -2
    with pytest.raises(ManifestError, match=r"m.jsonl:1: field 'duration' must be a number of seconds ≥ 0, got -2"):
        gym.make("agentcap/ADClip-v0", manifest=write(tmp_path, rows))


def test_on_error_typo_is_refused(tmp_path, toy_soundscapes):
    manifest = str(toy_soundscapes / "val.jsonl")
    with pytest.raises(ValueError, match=r"argument 'on_error' must be one of \['raise', 'skip'\], got 'skp'. Did you mean 'skip'\?"):
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest, on_error="skp")
    with pytest.raises(ValueError, match=r"argument 'mode' must be one of"):
        gym.make("agentcap/EvidenceGame-v0", manifest=manifest, mode="games")
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got 'Skip'"):
        read_manifest(manifest, on_error="Skip")


@pytest.mark.parametrize("env_id, world", [("agentcap/ADClip-v0", "toy_movie"), ("agentcap/ClozeCaption-v0", "toy_soundscapes")])
def test_a_finished_episode_cannot_be_stepped(env_id, world, request):
    env = gym.make(env_id, manifest=str(request.getfixturevalue(world) / "val.jsonl"), prompt="compact")
    env.reset(seed=0, options={"index": 0})
    _, _, terminated, _, _ = env.step("a dog barks")
    assert terminated
    with pytest.raises(RuntimeError, match="episode is over; call reset"):
        env.step("a second action")
    assert len(env.unwrapped.episode.actions) == 1
    env.reset(seed=0, options={"index": 0})
    env.step("again")  # a new episode steps as usual


def test_max_turns_follow_the_environment_bound(toy_soundscapes):
    from agentcap.rollout.driver import RolloutDriver

    manifest = str(toy_soundscapes / "val.jsonl")
    make = lambda: gym.make("agentcap/EvidenceGame-v0", manifest=manifest, budget=40, prompt="compact")  # noqa: E731
    driver = RolloutDriver(make, {})
    assert driver.scorer.unwrapped.max_actions == 83 and driver.max_turns == 83  # c0 + 40 × (Q, A) + stop + final
    with pytest.raises(ValueError, match="max_turns=64 is below EvidenceGameEnv's own bound of 83"):
        RolloutDriver(make, {}, max_turns=64).scorer


def test_a_non_utf8_byte_costs_only_its_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b", "x": "caf\xff"}\n{"id": "c"}\n')
    report = SkipReport()
    rows = read_manifest(str(path), {"id": str}, on_error="skip", max_skip_fraction=0.5, report=report)
    assert [r["id"] for r in rows] == ["a", "c"]
    assert report.skipped == [f"{path}:2: not valid UTF-8 (byte 0xff at column 22)"]
    assert report.ids == ["b"]  # read past the bad byte, so the refused row can still be matched
    with pytest.raises(ManifestError, match=r"m.jsonl:2: not valid UTF-8 \(byte 0xff at column 22\)"):
        read_manifest(str(path), {"id": str})


def test_refused_rows_keep_their_id_also_when_cached(tmp_path, toy_soundscapes):
    rows = rows_of(toy_soundscapes)[:3]
    rows[1]["duration"] = -1.0
    manifest = write(tmp_path, rows + ["not an object", {"no": "id"}])
    for _ in range(2):  # the second load comes from the cache
        env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest, on_error="skip", max_skip_fraction=0.9).unwrapped
        assert env.skipped.ids == [rows[1]["id"], None, None] and len(env.skipped.skipped) == 3


def test_every_row_refused_names_the_first_reasons_and_the_count(tmp_path, toy_soundscapes):
    rows = rows_of(toy_soundscapes)  # 6 rows, all refused: the first 5 are shown
    assert len(rows) == 6
    for row in rows:
        row["duration"] = -1.0
    manifest = write(tmp_path, rows)
    with pytest.raises(NoUsableRows) as caught:
        gym.make("agentcap/ClozeCaption-v0", manifest=manifest, on_error="skip", max_skip_fraction=1.0)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{manifest}: all 6 rows are refused; the first 5:"
    assert lines[1:] == [f"  {manifest}:{n}: field 'duration' must be a number of seconds ≥ 0, got -1.0" for n in range(1, 6)]
    assert caught.value.report.ids == [r["id"] for r in rows] and len(caught.value.report.skipped) == 6


@pytest.mark.slow  # LightningCLI parses and builds the environment
def test_fit_on_a_refused_row_prints_the_message_not_a_traceback(tmp_path, toy_movie, make_read_config, capsys,
                                                                 monkeypatch):
    """A refused manifest row ends `agentcap fit` with its file:line message and exit 2; `--debug`
    gives the traceback instead."""
    from agentcap.cli import main

    monkeypatch.setenv("AGENTCAP_DEBUG", "")  # off; main sets it on --debug, and the test restores it

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "movie": "m", "position": 0, "duration": 1.0}\n')  # no features, no ad
    config = make_read_config(tmp_path / "run", toy_movie, [{"name": "e", "kind": "evaluate", "split": "val"}])
    argv = ["fit", "--config", str(config), "--model.env.val.manifest", str(bad)]
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"agentcap: {bad}:1:") and "Traceback" not in err
    with pytest.raises(ManifestError, match="bad.jsonl:1"):
        main([*argv, "--debug"])


# --- streamed manifests (issue 34, case 11) ---------------------------------------------------------
def counted_manifest(tmp_path, rows: int, bad: dict[int, str]) -> str:
    """``rows`` lines ``{"id": "r<n>"}``; line n of ``bad`` (1-based) is replaced by its text."""
    path = tmp_path / "big.jsonl"
    path.write_text("".join(bad.get(n, f'{{"id": "r{n}"}}') + "\n" for n in range(1, rows + 1)))
    return str(path)


def test_a_limit_reads_only_the_rows_it_needs(tmp_path):
    """`--limit 10` of a 200,000-row manifest checks 10 rows: a torn line past them is never read
    (without the limit it is refused), and the rows are not all checked first."""
    manifest = counted_manifest(tmp_path, 200_000, {25: '{"id": "torn'})
    checked = []
    rows = read_manifest(manifest, {"id": str}, check=lambda row, where: checked.append(where), limit=10)
    assert [r["id"] for r in rows] == [f"r{n}" for n in range(1, 11)]
    assert checked == [f"{manifest}:{n}" for n in range(1, 11)]
    with pytest.raises(ManifestError, match=r"big\.jsonl:25: not valid JSON"):
        read_manifest(manifest, {"id": str})
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        read_manifest(manifest, limit=0)


def test_rows_refused_before_the_limit_are_refused_or_counted_as_without_it(tmp_path):
    manifest = counted_manifest(tmp_path, 1000, {3: '{"id": 3}', 7: "not json", 900: "{"})
    with pytest.raises(ManifestError, match=r"big\.jsonl:3: field 'id' must be str, got 3"):
        read_manifest(manifest, {"id": str}, limit=10)
    report = SkipReport()
    rows = read_manifest(manifest, {"id": str}, on_error="skip", max_skip_fraction=0.5, report=report, limit=10)
    assert len(rows) == 10 and rows[-1]["id"] == "r12"  # ten usable rows: lines 1–12 less the two refused
    assert report.total == 12 and len(report.skipped) == 2  # line 900 was never read
    assert report.skipped[0].startswith(f"{manifest}:3: ") and report.skipped[1].startswith(f"{manifest}:7: ")
    with pytest.raises(ManifestError, match=r"1 of 5 rows are unusable \(more than max_skip_fraction=0\.1\)"):
        read_manifest(manifest, {"id": str}, on_error="skip", limit=4)  # the share of the rows read


def test_audio_is_decoded_when_used_not_at_load(tmp_path, toy_soundscapes, monkeypatch):
    """Loading an audio task reads each clip's header; the samples are decoded (and checked) when an
    item is used. `first_rows` (caption / evaluate --limit) makes the environment read a prefix."""
    from agentcap.core import manifests
    from agentcap.core.env import first_rows

    decodes = []
    monkeypatch.setattr(manifests, "_WAVEFORMS", type(manifests._WAVEFORMS)())  # clips earlier tests decoded
    for name in ("decoded_duration", "_decode_audio"):
        real = getattr(manifests, name)
        monkeypatch.setattr(manifests, name, lambda *a, _real=real, _name=name, **k: decodes.append(_name) or _real(*a, **k))
    rows = rows_of(toy_soundscapes)
    for row in rows:
        row.pop("duration", None)
    manifest = write(tmp_path, rows)
    env = gym.make("agentcap/ClozeCaption-v0", manifest=manifest, prompt="compact").unwrapped
    assert len(env.items) == len(rows) and decodes == []  # headers only
    assert env.items[0]["duration"] > 0  # from the header
    env.reset(options={"index": 0})
    assert decodes == ["_decode_audio"]  # the item used, and only it
    with first_rows(2):
        limited = gym.make("agentcap/EvidenceGame-v0", manifest=manifest, prompt="compact").unwrapped
    assert [i["id"] for i in limited.items] == [r["id"] for r in rows[:2]]
    decoded = gym.make("agentcap/ClozeCaption-v0", manifest=manifest, prompt="compact", audio_check="decode").unwrapped
    assert decodes.count("decoded_duration") == len(rows)  # another check: not the header-checked rows cached
    assert decoded.items[0] is not env.items[0]


def test_caption_limit_stops_reading_at_its_items(tmp_path, toy_soundscapes):
    """`agentcap caption --limit 1`: a torn line past the first row is never read (without the limit,
    it is an error row and the exit says so)."""
    from test_caption_robustness import caption_command, cloze_config

    manifest = write(tmp_path, rows_of(toy_soundscapes, "test"))
    with open(manifest, "a", encoding="utf-8") as handle:
        handle.write('{"id": "torn\n')
    config = cloze_config(tmp_path, toy_soundscapes)
    out = tmp_path / "out.jsonl"
    assert caption_command(["--config", config, "--manifest", manifest, "--out", str(out), "--limit", "1"]) == 0
    assert [json.loads(line).get("error") for line in out.read_text().splitlines()] == [None]
    assert caption_command(["--config", config, "--manifest", manifest, "--out", str(out)]) == 1
    errors = [row["error"] for row in map(json.loads, out.read_text().splitlines()) if row.get("error")]
    assert len(errors) == 1 and f"{manifest}:4: not valid JSON" in errors[0]
