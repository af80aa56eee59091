"""AudioMap's ClozeCaption environment, driven with hand-written captions on the toy soundscapes.

The rule examiners are exact judges on the toy world's templated captions, so every reward below
is computed by hand from AudioMap Eq. 3 (ESR: +1 / −0.5 / −1, mean over the cloze bank), Eq. 5
(ECTR: tIoU per anchor) and Eq. 7 (weighted sum; R(1) has no ECTR term).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import soundfile
from conftest import CountingExaminer, read_jsonl

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.core.manifests import ManifestError
from agentcap.judges.rule import RuleExaminer
from agentcap.rewards.functional.cloze import answer_scores, curriculum_weights
from agentcap_envs.cloze_caption import PROMPTS
from agentcap_envs.toy import soundscapes

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "agentcap/ClozeCaption-v0"
RATE = 16_000


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def env(toy_soundscapes):
    return gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact")


def _index(rows: list[dict], events: int) -> int:
    """The first training row with exactly ``events`` events (the seeded world has both kinds)."""
    found = [i for i, r in enumerate(rows) if len(r["events"]) == events]
    assert found, f"the toy world has no row with {events} event(s)"
    return found[0]


def _play(env, index: int, caption: str):
    env.reset(options={"index": index})
    return env.step(caption)


def _wrong(value: str, choices) -> str:
    """A value of the same attribute that is neither ``value`` nor a phrase containing it."""
    return next(c for c in choices if c != value and value not in c and c not in value)


# --- observation --------------------------------------------------------------------------------
def test_observation_is_the_waveform_at_16k_mono(env, sound_rows):
    for index, row in enumerate(sound_rows):
        obs, info = env.reset(options={"index": index})
        assert info["index"] == index
        assert obs["agent"] == "policy"
        assert obs["messages"] == [{"role": "user", "content": PROMPTS["compact"]}]
        assert set(obs["media"]) == {"waveform"}
        wave = obs["media"]["waveform"]
        assert isinstance(wave, np.ndarray) and wave.dtype == np.float32 and wave.ndim == 1
        assert len(wave) == round(row["duration"] * RATE)
        assert np.abs(wave).max() > 0.01  # events are audible, not silence
        assert env.observation_space.contains(obs)


def test_other_rates_and_stereo_become_16k_mono(toy_soundscapes, tmp_path):
    import torch
    import torchaudio.functional as AF

    valid = read_jsonl(toy_soundscapes / "bad.jsonl")[-1]
    assert valid["id"] == "bad-valid"
    original, rate = soundfile.read(str(toy_soundscapes / "audio" / "bad-valid.wav"), dtype="float32")
    assert rate == RATE
    resampled = AF.resample(torch.from_numpy(original), RATE, 22_050).numpy()
    stereo = np.stack([resampled, np.zeros_like(resampled)], axis=1)  # left = signal, right = silence
    soundfile.write(str(tmp_path / "stereo.wav"), stereo, 22_050, subtype="FLOAT")
    manifest = _write(tmp_path / "stereo.jsonl", [{**valid, "audio": str(tmp_path / "stereo.wav")}])

    env = gymnasium.make(ENV_ID, manifest=str(manifest), prompt="compact")
    wave = env.reset(options={"index": 0})[0]["media"]["waveform"]
    assert wave.dtype == np.float32 and wave.ndim == 1 and len(wave) == 3 * RATE
    # mono is the channel mean: half the signal, back at 16 kHz
    assert np.corrcoef(wave, original)[0, 1] > 0.98
    assert np.abs(wave).max() == pytest.approx(np.abs(original).max() / 2, rel=0.1)

    short = gymnasium.make(ENV_ID, manifest=str(manifest), prompt="compact", max_seconds=1.0)
    assert len(short.reset(options={"index": 0})[0]["media"]["waveform"]) == RATE


def test_flac_and_ogg_load(toy_soundscapes):
    wav = soundfile.read(str(toy_soundscapes / "audio" / "bad-valid.wav"), dtype="float32")[0]
    env = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "formats.jsonl"), prompt="compact")
    assert [item["id"] for item in env.unwrapped.items] == ["bad-valid-flac", "bad-valid-ogg"]
    flac = env.reset(options={"index": 0})[0]["media"]["waveform"]
    ogg = env.reset(options={"index": 1})[0]["media"]["waveform"]
    assert len(flac) == len(wav) == 3 * RATE
    np.testing.assert_array_equal(flac, wav)  # lossless
    assert abs(len(ogg) - len(wav)) <= 1
    n = min(len(ogg), len(wav))
    assert np.corrcoef(ogg[:n], wav[:n])[0, 1] > 0.9  # lossy, but the same clip


# --- rewards --------------------------------------------------------------------------------------
def test_gold_caption_gets_full_marks(env, sound_rows):
    for index, row in enumerate(sound_rows):
        obs, reward, terminated, truncated, info = _play(env, index, row["caption"])
        assert terminated and not truncated
        assert info["agent"] == "policy" and info["action_kind"] == "caption"
        assert info["rewards"]["esr"] == 1.0  # every blank answered with the gold option
        assert info["rewards"]["ectr"] >= 0.99  # the gold times, read back exactly
        assert info["rewards"]["length"] == 1.0
        assert reward == pytest.approx(1.0 * 1.0 + 1.0 * info["rewards"]["ectr"] + 0.1 * 1.0)
        assert info["utilities"] == [reward]
        assert [a.kind for a in info["episode"].actions] == ["caption"]


def test_empty_caption_gets_omission_penalty_and_no_temporal_credit(toy_soundscapes, env):
    obs, reward, terminated, _, info = _play(env, 0, "")
    assert terminated
    assert info["rewards"] == {"esr": -0.5, "ectr": 0.0, "length": 0.0, "count": 0.0}
    assert reward == -0.5
    milder = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact", r_abs=-0.25)
    assert _play(milder, 0, "")[4]["rewards"]["esr"] == -0.25


@pytest.mark.parametrize("events", [1, 3])
def test_wrong_attribute_costs_r_neg_on_that_question(env, sound_rows, events):
    index = _index(sound_rows, events)
    row = sound_rows[index]
    first = row["events"][0]
    wrong = _wrong(first["pitch"], soundscapes.PITCHES)
    old = f"a {first['loudness']} {first['pitch']} {first['type']}"
    assert row["caption"].count(old) == 1
    caption = row["caption"].replace(old, f"a {first['loudness']} {wrong} {first['type']}")

    bank = env.unwrapped.items[index]["_questions"]
    letters = RuleExaminer().answer([caption] * len(bank), bank)
    per_question = answer_scores(letters, [q.answer for q in bank]).tolist()
    pitch_of_first = [k for k, q in enumerate(bank) if q.meta == {"event": 0, "subject": first["type"], "attribute": "pitch"}]
    assert len(pitch_of_first) == 1
    assert per_question[pitch_of_first[0]] == -1.0  # a conflicting claim: r_neg
    assert letters[pitch_of_first[0]] == "ABCD"[bank[pitch_of_first[0]].options.index(wrong)]
    assert sum(s == 1.0 for s in per_question) == len(bank) - 1  # everything else still right

    info = _play(env, index, caption)[4]
    L = 4 * events
    assert info["rewards"]["esr"] == pytest.approx(((L - 1) * 1.0 + (-1.0)) / L)  # 1 → 0.5, 3 → 10/12
    assert info["rewards"]["ectr"] >= 0.99  # times untouched
    assert info["rewards"]["length"] == 1.0


def test_reward_is_the_weighted_sum_R1_then_R2(toy_soundscapes, sound_rows):
    index = _index(sound_rows, 1)
    row = sound_rows[index]
    event = row["events"][0]
    start, end = event["start"], event["end"]
    middle = f"{(start + end) / 2:.2f}"
    caption = row["caption"].replace(f"to {end:.1f} s", f"to {middle} s")
    assert caption != row["caption"]
    expected_ectr = (float(middle) - start) / (end - start)  # the prediction is the gold's first half

    r1 = curriculum_weights(step=0, switch_step=10, esr=1.0, ectr=0.5, length=0.2)
    r2 = curriculum_weights(step=10, switch_step=10, esr=1.0, ectr=0.5, length=0.2)
    assert r1 == {"esr": 1.0, "ectr": 0.0, "length": 0.2} and r2["ectr"] == 0.5
    results = {}
    for name, weights in (("R1", r1), ("R2", r2)):
        env = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact", weights=weights)
        _, reward, _, _, info = _play(env, index, caption)
        results[name] = (reward, info["rewards"])
    (reward1, parts1), (reward2, parts2) = results["R1"], results["R2"]
    assert parts1 == parts2  # the same components are computed and logged in both stages
    assert parts1["esr"] == 1.0 and parts1["length"] == 1.0
    assert parts1["ectr"] == pytest.approx(expected_ectr, abs=1e-6)
    assert reward1 == pytest.approx(1.0 * 1.0 + 0.2 * 1.0)
    assert reward2 == pytest.approx(1.0 * 1.0 + 0.5 * expected_ectr + 0.2 * 1.0)

    only_esr = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact", weights={"esr": 2.0})
    assert _play(only_esr, index, caption)[1] == pytest.approx(2.0)  # a weight left out counts 0
    with pytest.raises(ValueError, match="ecrt"):
        gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), weights={"esr": 1.0, "ecrt": 1.0})


def test_an_invented_event_costs_the_count_term_only_when_it_is_weighted(toy_soundscapes, sound_rows):
    """R_count (ours): the gold caption times every event; one more timed sentence lowers count, which
    enters the reward only with a ``count`` weight (the paper's rewards stay as they were)."""
    index = _index(sound_rows, 1)
    row = sound_rows[index]
    invented = row["caption"] + " From 9.0 s to 9.5 s, a trumpet plays."
    m = len(row["anchors"])
    for weights, extra in (({"esr": 1.0, "length": 0.2}, 0.0), ({"esr": 1.0, "length": 0.2, "count": 1.0}, 1.0)):
        env = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact", weights=weights)
        _, gold_reward, _, _, gold = _play(env, index, row["caption"])
        _, reward, _, _, info = _play(env, index, invented)
        assert gold["rewards"]["count"] == 1.0 and info["rewards"]["count"] == pytest.approx(m / (m + 1))
        assert gold_reward - reward == pytest.approx(
            gold["rewards"]["esr"] - info["rewards"]["esr"] + 0.2 * (gold["rewards"]["length"] - info["rewards"]["length"])
            + extra * (1 - m / (m + 1)))


def test_batched_score_equals_per_episode_scores(toy_soundscapes, sound_rows):
    env = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact", defer_scoring=True)
    counter = env.unwrapped._examiner = CountingExaminer(RuleExaminer())
    one = _index(sound_rows, 1)
    plays = [(0, sound_rows[0]["caption"]), (1, ""), (2, sound_rows[2]["short_caption"]), (one, sound_rows[one]["caption"]),
             (one, sound_rows[one]["caption"]), (3, "A beep at 1 s.")]
    episodes = []
    for index, caption in plays:
        obs, reward, terminated, _, info = _play(env, index, caption)
        assert terminated and reward == 0.0 and "score" not in info  # scoring deferred to the batch
        episodes.append(info["episode"])
    batch = env.unwrapped.score(episodes)
    assert len(counter.calls) == 1  # one examiner call for the whole batch
    sent = counter.calls[0]
    assert len(sent) == len(set(sent))  # the repeated (caption, question) pairs went once
    banks = {i: len(env.unwrapped.items[i]["_questions"]) for i, _ in plays}
    assert len(sent) == sum(banks[i] for i, _ in plays) - banks[one]
    for episode, together in zip(episodes, batch):
        alone = env.unwrapped.score([episode])[0]
        assert together.reward == pytest.approx(alone.reward, abs=1e-6)
        assert together.components == pytest.approx(alone.components, abs=1e-6)
        assert together.utilities == pytest.approx(alone.utilities, abs=1e-6)
    assert batch[3].reward == batch[4].reward


# --- bad input ------------------------------------------------------------------------------------
BAD_ROWS = {
    "bad-missing": ("field 'audio'", "bad-missing.wav", "not found"),
    "bad-empty": ("field 'audio'", "bad-empty.wav", "empty"),
    "bad-corrupt": ("field 'audio'", "bad-corrupt.wav", "unreadable"),
    "bad-gold-e": ("cloze[0]", "field 'answer'", "'E'"),
    "bad-gold-z": ("cloze[0]", "field 'answer'", "'Z'"),
}


@pytest.mark.parametrize("bad_id", sorted(BAD_ROWS))
def test_bad_row_raises_naming_file_line_field_value(toy_soundscapes, bad_id):
    bad = {r["id"]: r for r in read_jsonl(toy_soundscapes / "bad.jsonl")}
    manifest = _write(toy_soundscapes / f"one-{bad_id}.jsonl", [bad["bad-valid"], bad[bad_id]])  # bad row on line 2
    with pytest.raises(ManifestError) as caught:
        gymnasium.make(ENV_ID, manifest=str(manifest), on_error="raise")
    message = str(caught.value)
    assert f"{manifest}:2" in message
    for fragment in BAD_ROWS[bad_id]:
        assert fragment in message, (fragment, message)


def test_bad_anchors_are_refused_at_load(toy_soundscapes, sound_rows):
    cases = [([], "field 'anchors' is empty"),
             ([{"event": "a beep", "start": "soon", "end": 1.0}], "anchors[0]: field 'start'"),
             ([{"event": "a beep", "start": 2.0, "end": 1.0}], "anchors[0]: fields 'start'/'end'"),
             (["a beep at 1 s"], "anchors[0]")]
    for anchors, fragment in cases:
        manifest = _write(toy_soundscapes / "bad-anchors.jsonl", [{**sound_rows[0], "anchors": anchors}])
        with pytest.raises(ManifestError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as caught:
            gymnasium.make(ENV_ID, manifest=str(manifest))
        assert f"{manifest}:1" in str(caught.value)


def test_skip_drops_and_counts_bad_rows(toy_soundscapes, sound_rows):
    bad = read_jsonl(toy_soundscapes / "bad.jsonl")
    manifest = _write(toy_soundscapes / "mixed.jsonl", sound_rows + bad)
    env = gymnasium.make(ENV_ID, manifest=str(manifest), prompt="compact", on_error="skip", max_skip_fraction=0.5)
    kept = [item["id"] for item in env.unwrapped.items]
    assert kept == [r["id"] for r in sound_rows] + ["bad-valid"]
    report = env.unwrapped.skipped
    assert report.total == len(sound_rows) + len(bad) == 12
    assert len(report.skipped) == 5 and report.fraction == pytest.approx(5 / 12)
    for line, bad_id in enumerate(r["id"] for r in bad if r["broken"]):
        assert f"{manifest}:{len(sound_rows) + line + 1}" in report.skipped[line]
    assert "bad-missing.wav" in report.skipped[0] and "'Z'" in report.skipped[4]
    obs, _ = env.reset(options={"index": len(kept) - 1})
    assert len(obs["media"]["waveform"]) == 3 * RATE  # what was kept still plays

    with pytest.raises(ManifestError, match="max_skip_fraction=0.1"):
        gymnasium.make(ENV_ID, manifest=str(manifest), on_error="skip")


# --- supervised warm start and inference ------------------------------------------------------------
def test_demonstrations_are_the_gold_caption(env, sound_rows):
    item = env.unwrapped.items[0]
    demos = env.unwrapped.demonstrations(item)
    assert len(demos) == 1
    obs, target = demos[0]
    assert target == sound_rows[0]["caption"]
    reset_obs = env.reset(options={"index": 0})[0]
    assert obs["agent"] == reset_obs["agent"] == "policy"
    assert obs["messages"] == reset_obs["messages"]
    np.testing.assert_array_equal(obs["media"]["waveform"], reset_obs["media"]["waveform"])


def test_question_turns_beside_the_caption_answer_from_the_same_audio(toy_soundscapes, sound_rows):
    """demo_qa / demo_absent: after the gold caption, question turns on the same waveform — gold answers
    about subjects the clip holds, "not heard" about ones it lacks, in the split's question forms for
    that subject — drawn the same way every time."""
    manifest = str(toy_soundscapes / "train.jsonl")
    env = gymnasium.make(ENV_ID, manifest=manifest, prompt="compact", demo_qa=2, demo_absent=1.0).unwrapped
    forms: dict[str, set[str]] = {}
    for q in (q for row in sound_rows for q in row["qa"]):
        forms.setdefault(q["meta"]["subject"], set()).add(q["question"])
    absent = 0
    for item, row in zip(env.items, sound_rows):
        demos = env.demonstrations(item)
        assert demos[0][1] == row["caption"]
        gold = {(q["question"], q["answer"]) for q in row["qa"]}
        held = {q["meta"]["subject"] for q in row["qa"]}
        turns = demos[1:]
        present = [t for t in turns if not t[1].endswith(" is not heard.")]
        assert len(present) == min(2, len(held))
        for observation, target in turns:
            assert observation["agent"] == "policy"
            text = observation["messages"][0]["content"]
            assert text.startswith("Question : ") and text.endswith("\nAnswer from the audio .")
            question = text.removeprefix("Question : ").split("\n")[0]
            if target.endswith(" is not heard."):
                subject = target.removeprefix("The ").removesuffix(" is not heard.")
                assert subject not in held and question in forms[subject]
                absent += 1
            else:
                assert (question, target) in gold
            np.testing.assert_array_equal(observation["media"]["waveform"], demos[0][0]["media"]["waveform"])
        assert [t for _, t in env.demonstrations(item)] == [t for _, t in demos], "drawn by the item"
    assert absent, "no toy clip was asked about a subject it lacks"
    # off by default: the caption alone, as before
    plain = gymnasium.make(ENV_ID, manifest=manifest, prompt="compact").unwrapped
    assert [t for _, t in plain.demonstrations(plain.items[0])] == [sound_rows[0]["caption"]]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="demo_qa must be an int >= 0"):
            gymnasium.make(ENV_ID, manifest=manifest, demo_qa=bad)
    with pytest.raises(ValueError, match="demo_absent must be a number >= 0"):
        gymnasium.make(ENV_ID, manifest=manifest, demo_qa=1, demo_absent=-0.5)
    with pytest.raises(ValueError, match="set demo_qa >= 1"):
        gymnasium.make(ENV_ID, manifest=manifest, demo_absent=1.0)
    # demo_caption=False: the same question turns, without the caption before them
    answers_only = gymnasium.make(ENV_ID, manifest=manifest, prompt="compact", demo_qa=2, demo_absent=1.0,
                                  demo_caption=False).unwrapped
    for item in env.items:
        assert [t for _, t in answers_only.demonstrations(item)] == [t for _, t in env.demonstrations(item)[1:]]
    with pytest.raises(ValueError, match="demo_caption=False.*set demo_qa >= 1"):
        gymnasium.make(ENV_ID, manifest=manifest, demo_caption=False)


def test_a_question_s_words_do_not_give_its_answer_away():
    """Over a split, each question form is asked of clips that hold its subject about as often as of
    clips that lack it (demo_absent = 1), however rare the subject; the speaker, on every clip, is
    never asked as absent. One form for every absent subject taught the form, not the audio."""
    from agentcap_envs.audio_qa import BalancedQuestions

    draw = random.Random(0)
    items = []
    for i in range(10000):
        qa = [{"question": q, "answer": "says hi", "meta": {"subject": "woman"}}
              for q in ("What does the woman say?", "When does the woman speak?", "What happens when the woman speaks?")]
        for subject, share in (("bell", 0.08), ("chime", 0.2), ("paper", 0.5)):
            if draw.random() < share:
                qa += [{"question": f"When is the {subject} heard?", "answer": f"The {subject} is heard at 1 s.",
                        "meta": {"subject": subject}},
                       {"question": f"What happens with the {subject}?", "answer": f"A {subject} sounds.",
                        "meta": {"subject": subject}}]
        items.append({"id": f"c{i}", "qa": qa})
    turns = BalancedQuestions(items, per_clip=1, absent_ratio=1.0)
    counts: dict[str, list[int]] = {}  # question -> [present, absent]
    for item in items:
        for question, answer in turns.turns(item):
            counts.setdefault(question, [0, 0])[answer.endswith(" is not heard.")] += 1
    for question, (present, absent) in counts.items():
        if "woman" in question:
            assert absent == 0 and present > 0, question
        else:
            assert present > 100 and 0.8 < absent / present < 1.25, (question, present, absent)


def test_question_turns_refuse_a_malformed_qa_field(toy_soundscapes, sound_rows, tmp_path):
    """With question turns on, a row whose 'qa' the turns cannot read is refused at load naming the row
    and the pair; without them, the field is not read."""
    rows = [dict(r) for r in sound_rows]
    rows[1]["qa"] = [{"question": "When is it heard?"}]
    for r in rows:
        r["audio"] = str(toy_soundscapes / r["audio"])
    path = _write(tmp_path / "bad_qa.jsonl", rows)
    with pytest.raises(ManifestError, match=r"bad_qa\.jsonl:2: qa\[0\]: field 'answer' must be a non-empty string, got missing"):
        gymnasium.make(ENV_ID, manifest=str(path), demo_qa=1)
    gymnasium.make(ENV_ID, manifest=str(path))  # captions only: the field is not read
    bare = [{k: v for k, v in r.items() if k != "qa"} for r in sound_rows]
    for r in bare:
        r["audio"] = str(toy_soundscapes / r["audio"])
    unnamed = gymnasium.make(ENV_ID, manifest=str(_write(tmp_path / "no_qa.jsonl", bare)), demo_qa=1, demo_absent=1).unwrapped
    with pytest.raises(ValueError, match="meta.subject"):
        unnamed.demonstrations(unnamed.items[0])


def test_unlabelled_audio_is_captioned_without_a_score(toy_soundscapes, env):
    item = env.unwrapped.item_from_audio(str(toy_soundscapes / "audio" / "train-0001.wav"))
    env.reset(options={"item": item})
    obs, reward, terminated, _, info = env.step("A beep at 1 s.")
    assert terminated and math.isnan(reward)
    assert info["utilities"] == [None] and info["rewards"] == {}
    assert info["score"].extras == {"unlabelled": 1.0}


def test_items_handed_over_directly_are_scored_like_manifest_rows(toy_soundscapes, sound_rows):
    items = [{**row, "audio": str(toy_soundscapes / row["audio"])} for row in sound_rows[:2]]  # no manifest: absolute paths
    env = gymnasium.make(ENV_ID, items=items, prompt="compact")
    for index, row in enumerate(sound_rows[:2]):
        _, reward, terminated, _, info = _play(env, index, row["caption"])
        assert terminated and info["rewards"]["esr"] == 1.0 and info["rewards"]["length"] == 1.0
    assert _play(env, 0, "")[4]["rewards"]["esr"] == -0.5
