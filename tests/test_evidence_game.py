"""ACE-Cap's EvidenceGame environment, driven with hand-written turns on the toy soundscapes.

The rule examiner is an exact judge on the toy world's templated texts, so the G2P scores (Eq. 2–3)
and the LOOP-GRPO utilities (Eq. 12, 14–16) of a scripted game are computed by hand here. Scripted
texts avoid attribute words in questions: the rule examiner (toy only) reads every sentence that
names the subject, questions included.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from conftest import CountingExaminer, read_jsonl

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.core.manifests import ManifestError
from agentcap.judges.evidence import serialize_evidence
from agentcap.judges.questions import sentences
from agentcap.judges.rule import RuleExaminer
from agentcap_envs.evidence_game import PROMPTS, parse_composer_action
from agentcap_envs.toy import soundscapes

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "agentcap/EvidenceGame-v0"
RATE = 16_000
COMPACT = PROMPTS["compact"]




@pytest.fixture(scope="module")
def one(sound_rows) -> int:
    """Index of the first training clip with a single event: its MCQ bank is type, pitch, loudness,
    count of that event (L = 4), which keeps the hand computations short."""
    found = [i for i, r in enumerate(sound_rows) if len(r["events"]) == 1]
    assert found, "the toy world has no single-event clip"
    assert [q["meta"]["attribute"] for q in sound_rows[found[0]]["mcq"]] == ["type", "pitch", "loudness", "count"]
    return found[0]


@pytest.fixture(scope="module")
def make(toy_soundscapes):
    def make(**kwargs):
        kwargs.setdefault("manifest", str(toy_soundscapes / "train.jsonl"))
        return gymnasium.make(ENV_ID, prompt="compact", examiner="rule", **kwargs)

    return make


def _play(env, index: int, actions: list[str]):
    """Step a whole scripted episode; returns the observations seen before each action and the
    last step's (reward, terminated, info)."""
    obs, _ = env.reset(options={"index": index})
    seen = []
    for k, action in enumerate(actions):
        seen.append(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        assert not truncated
        assert terminated == (k == len(actions) - 1), f"episode ended={terminated} after action {k}: {action!r}"
    return seen, reward, info


def _script(row: dict) -> dict[str, str]:
    """Turns about the single event of ``row`` whose G2P is easy to compute by hand."""
    event = row["events"][0]
    kind, pitch, count = event["type"], event["pitch"], soundscapes.COUNT_WORDS[event["count"]]
    return {
        "c0": f"A {kind} is heard.",  # type right; pitch, loudness, count not given
        "ask_pitch": f"ASK: What is the pitch of the {kind}?",
        "pitch": f"The {kind} has a {pitch} pitch.",
        "ask_count": f"ASK: How many times does the {kind} sound?",
        "count": f"The {kind} sounds {count}.",
        "ask_kind": "ASK: What kind of sound is it?",
        "kind": f"It is a {kind}.",  # nothing new: c0 already names the type
        "final": f"A {pitch} {kind} is heard.",  # keeps the pitch, drops the count
        "wrong_pitch": f"The {kind} has a {'low' if pitch != 'low' else 'mid'} pitch.",
    }


# --- turn order and observations -------------------------------------------------------------
def test_turn_order_and_who_gets_the_audio(make, sound_rows, one):
    env, s, row = make(budget=2), _script(sound_rows[one]), sound_rows[one]
    actions = [s["c0"], s["ask_pitch"], s["pitch"], s["ask_count"], s["count"], s["final"]]
    seen, reward, info = _play(env, one, actions)
    assert [o["agent"] for o in seen] == ["captioner", "composer", "instruct", "composer", "instruct", "composer"]
    episode = info["episode"]
    assert [(a.agent, a.kind) for a in episode.actions] == [
        ("captioner", "caption"), ("composer", "question"), ("instruct", "answer"),
        ("composer", "question"), ("instruct", "answer"), ("composer", "final"),
    ]
    for obs in seen:
        assert env.observation_space.contains(obs)
        if obs["agent"] == "composer":
            assert obs["media"] == {}  # the Composer never hears the audio
            text = obs["messages"][-1]["content"]
            assert row["caption"] not in text and s["c0"] in text  # c0 and the QA history, no gold
        else:
            wave = obs["media"]["waveform"]
            assert wave.dtype == np.float32 and wave.ndim == 1 and len(wave) == round(row["duration"] * RATE)
    composer_texts = [o["messages"][-1]["content"] for o in seen if o["agent"] == "composer"]
    assert composer_texts[0].endswith(COMPACT["compose"]) and composer_texts[1].endswith(COMPACT["compose"])
    assert composer_texts[2].endswith(COMPACT["finalize"])  # after the K-th answer: finalise
    instruct = seen[4]["messages"][-1]["content"]
    assert s["pitch"] in instruct and "How many times" in instruct  # history, then the question
    assert instruct.endswith(COMPACT["answer"])
    with pytest.raises(RuntimeError, match="over"):
        env.unwrapped.advance(episode, "one more")


def test_ready_stops_with_a_stop_action_and_stop_utility(make, sound_rows, one):
    env, s = make(budget=4, stop_cost=0.1), _script(sound_rows[one])
    seen, reward, info = _play(env, one, [s["c0"], s["ask_pitch"], s["pitch"], "READY", s["final"]])
    assert seen[-1]["messages"][-1]["content"].endswith(COMPACT["finalize"])
    kinds = [a.kind for a in info["episode"].actions]
    assert kinds == ["caption", "question", "answer", "stop", "final"]
    u = info["utilities"]
    assert len(u) == len(kinds) and u[0] is None and u[2] is None
    assert u[3] == pytest.approx(u[4] - 0.1 * 1)  # Eq. 15: u^S = b − c_S·T, Eq. 16: u^F = b
    assert info["score"].extras["forced"] == 0.0 and info["score"].extras["questions"] == 1.0


def test_budget_forces_finalisation_without_a_stop_action(make, sound_rows, one):
    env, s = make(budget=1, stop_cost=0.1), _script(sound_rows[one])
    seen, reward, info = _play(env, one, [s["c0"], s["ask_pitch"], s["pitch"], s["final"]])
    assert seen[-1]["agent"] == "composer" and seen[-1]["messages"][-1]["content"].endswith(COMPACT["finalize"])
    kinds = [a.kind for a in info["episode"].actions]
    assert kinds == ["caption", "question", "answer", "final"] and "stop" not in kinds
    assert info["score"].extras["forced"] == 1.0 and info["score"].extras["questions"] == 1.0
    u = info["utilities"]
    assert u[0] is None and u[2] is None and isinstance(u[1], float)
    assert u[3] == info["score"].extras["utility_final"]  # the final keeps u^F = b, no stop cost

    seen, reward, info = _play(make(budget=0), one, [s["c0"], s["final"]])  # K = 0: straight to the final
    assert [o["agent"] for o in seen] == ["captioner", "composer"]
    assert seen[1]["messages"][-1]["content"].endswith(COMPACT["finalize"])
    assert [a.kind for a in info["episode"].actions] == ["caption", "final"]
    assert info["score"].extras["forced"] == 1.0 and info["utilities"][0] is None


def test_zero_questions(make, sound_rows, one):
    env, s = make(budget=4, stop_cost=0.1, preserve_weight=0.5), _script(sound_rows[one])
    seen, reward, info = _play(env, one, [s["c0"], "READY", s["c0"]])
    assert [a.kind for a in info["episode"].actions] == ["caption", "stop", "final"]
    score = info["score"]
    assert score.extras["questions"] == 0.0 and score.extras["forced"] == 0.0
    r0 = (1 - 0.5 * 3) / 4  # type right, three omissions
    assert score.components == pytest.approx({"g2p_c0": r0, "g2p_evidence": r0, "g2p_final": r0})
    assert info["utilities"] == [None, 0.0, 0.0]  # b = 0 (nothing gained), c_S·0 = 0
    assert reward == r0


def test_two_identical_questions_each_cost_c_Q(make, sound_rows, one):
    env, s = make(budget=4, question_cost=0.05), _script(sound_rows[one])
    actions = [s["c0"], s["ask_pitch"], s["pitch"], s["ask_pitch"], s["pitch"], "READY", s["final"]]
    seen, reward, info = _play(env, one, actions)
    u = info["utilities"]
    kinds = [a.kind for a in info["episode"].actions]
    questions = [u[k] for k, kind in enumerate(kinds) if kind == "question"]
    # removing either copy leaves the other: r^E − r^E_{−t} = 0, so u^Q = −c_Q for both (Eq. 12)
    assert questions == pytest.approx([-0.05, -0.05])
    assert info["score"].components["g2p_evidence"] == pytest.approx((2 - 0.5 * 2) / 4)


# --- malformed Composer actions --------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("ASK: What is the pitch?", ("question", "What is the pitch?", False)),
    ("ASK : What is the pitch?", ("question", "What is the pitch?", False)),
    ("  ask what is the pitch", ("question", "what is the pitch", False)),
    ("What is the pitch?", ("question", "What is the pitch?", True)),
    ("Askew beeps?", ("question", "Askew beeps?", True)),  # ASK must be a whole word
    ("", ("stop", "", False)),
    ("   \n", ("stop", "", False)),
    ("READY", ("stop", "", False)),
    ("ready.", ("stop", "", False)),
    ("Ready to write the caption", ("stop", "", False)),
    ("ASK:", ("stop", "", True)),
])
def test_parse_composer_action(text, expected):
    assert parse_composer_action(text) == expected


def test_malformed_actions_in_a_game(make, sound_rows, one):
    env, s = make(budget=4), _script(sound_rows[one])
    bare = s["ask_pitch"].removeprefix("ASK: ")
    seen, reward, info = _play(env, one, [s["c0"], bare, s["pitch"], "", s["final"]])
    assert seen[2]["agent"] == "instruct"
    assert f"Question : {bare}" in seen[2]["messages"][-1]["content"]  # asked verbatim
    assert [a.kind for a in info["episode"].actions] == ["caption", "question", "answer", "stop", "final"]
    assert info["episode"].state["qa"] == [(bare, s["pitch"])]
    assert info["score"].extras["malformed"] == 1.0  # the bare question; an empty action is a plain stop
    assert info["score"].extras["forced"] == 0.0


# --- LOOP-GRPO utilities, by hand -------------------------------------------------------------
def test_loop_utilities_of_a_scripted_game(make, sound_rows, one):
    c_q, c_s, lam = 0.05, 0.1, 0.5
    env = make(budget=4, question_cost=c_q, stop_cost=c_s, preserve_weight=lam)
    s = _script(sound_rows[one])
    actions = [s["c0"], s["ask_pitch"], s["pitch"], s["ask_count"], s["count"], s["ask_kind"], s["kind"],
               "READY", s["final"]]
    seen, reward, info = _play(env, one, actions)

    # G2P over the bank (type, pitch, loudness, count): +1 right, −0.5 not given (Eq. 2–3)
    r0 = (1 - 0.5 - 0.5 - 0.5) / 4  # c0 names the type only                          = −0.125
    r_e = (1 + 1 - 0.5 + 1) / 4  # E adds pitch and count                                 =  0.625
    r_minus = [(1 - 0.5 - 0.5 + 1) / 4,  # without the pitch answer                        =  0.25
               (1 + 1 - 0.5 - 0.5) / 4,  # without the count answer                        =  0.25
               r_e]  # without "It is a <type>": nothing lost
    r_f = (1 + 1 - 0.5 - 0.5) / 4  # the final keeps the pitch, drops the count            =  0.25
    u_q = [r_e - r - c_q for r in r_minus]  # Eq. 12                                       = [0.325, 0.325, −0.05]
    b = (r_f - r0) + lam * (min(r_e, r_f) - r0)  # Eq. 14                                  =  0.5625
    u_s = b - c_s * 3  # Eq. 15                                                            =  0.2625
    assert u_q == pytest.approx([0.325, 0.325, -0.05]) and b == pytest.approx(0.5625)

    score = info["score"]
    assert reward == pytest.approx(r_f)
    assert score.components == pytest.approx({"g2p_c0": r0, "g2p_evidence": r_e, "g2p_final": r_f})
    assert info["utilities"] == pytest.approx([None, u_q[0], None, u_q[1], None, u_q[2], None, u_s, b])
    extras = score.extras
    assert extras["acc_c0"] == pytest.approx(1 / 4)
    assert extras["acc_evidence"] == pytest.approx(3 / 4)
    assert extras["acc_final"] == pytest.approx(2 / 4)
    assert extras["retention_gap"] == pytest.approx(3 / 4 - 2 / 4)  # Δ_ret = Acc(E) − Acc(c^F)
    assert extras["utility_final"] == pytest.approx(b)
    assert (extras["questions"], extras["forced"], extras["malformed"]) == (3.0, 0.0, 0.0)


def test_wrong_answer_has_negative_question_utility(make, sound_rows, one):
    env, s = make(budget=1), _script(sound_rows[one])
    seen, reward, info = _play(env, one, [s["c0"], s["ask_pitch"], s["wrong_pitch"], s["final"]])
    r_e = (1 - 1 - 0.5 - 0.5) / 4  # a conflicting pitch is −1
    r0 = (1 - 0.5 * 3) / 4
    assert info["score"].components["g2p_evidence"] == pytest.approx(r_e)
    assert info["utilities"][1] == pytest.approx(r_e - r0)  # c_Q = 0


# --- captioner and instruct modes --------------------------------------------------------------
def test_captioner_mode_ends_after_c0(make, sound_rows, one):
    env = make(mode="captioner")
    counter = env.unwrapped._examiner = CountingExaminer(RuleExaminer())
    s = _script(sound_rows[one])
    seen, reward, info = _play(env, one, [s["c0"]])
    assert seen[0]["agent"] == "captioner" and len(seen[0]["media"]["waveform"]) > 0
    r0 = (1 - 0.5 * 3) / 4
    assert reward == pytest.approx(r0) and info["utilities"] == pytest.approx([r0])  # Eq. 22
    assert info["rewards"] == pytest.approx({"g2p_c0": r0})
    assert info["score"].extras == pytest.approx({"acc_c0": 0.25})
    assert len(counter.calls) == 1 and [t for t, _ in counter.calls[0]] == [s["c0"]] * 4  # only c0 is judged


def test_harvest_then_instruct_replay(make, sound_rows, one):
    game = make(budget=2, defer_scoring=True)
    s = _script(sound_rows[one])
    _, _, info = _play(game, one, [s["c0"], s["ask_pitch"], s["pitch"], s["ask_count"], s["count"], s["final"]])
    _, _, ready_first = _play(game, one, [s["c0"], "READY", s["final"]])
    items = game.unwrapped.harvest([info["episode"], ready_first["episode"]])
    assert [(i["c0"], i["history"], i["question"]) for i in items] == [
        (s["c0"], [], s["ask_pitch"].removeprefix("ASK: ")),
        (s["c0"], [[s["ask_pitch"].removeprefix("ASK: "), s["pitch"]]], s["ask_count"].removeprefix("ASK: ")),
    ]

    replay = make(manifest=None, items=items, mode="instruct")
    r_before = (1 - 0.5 * 3) / 4  # ser(c0): type only
    for answer, r_after in ((s["pitch"], (1 + 1 - 0.5 - 0.5) / 4),
                            (s["wrong_pitch"], (1 - 1 - 0.5 - 0.5) / 4),
                            ("I cannot tell.", r_before)):
        seen, reward, done = _play(replay, 0, [answer])  # one answer ends the episode
        assert seen[0]["agent"] == "instruct" and len(seen[0]["media"]["waveform"]) > 0
        assert reward == pytest.approx(r_after - r_before)  # Eq. 23
        assert done["utilities"] == pytest.approx([r_after - r_before])
        assert done["rewards"] == pytest.approx({"g2p_before": r_before, "g2p_after": r_after})
        assert [a.kind for a in done["episode"].actions] == ["answer"]

    # the replayed state is the game's: history then question, as the Instruct model saw it in the game
    obs, _ = replay.reset(options={"index": 1})
    game.reset(options={"index": one})
    for action in [s["c0"], s["ask_pitch"], s["pitch"], s["ask_count"]]:
        in_game = game.step(action)[0]
    assert obs["messages"] == in_game["messages"]
    np.testing.assert_array_equal(obs["media"]["waveform"], in_game["media"]["waveform"])
    seen, reward, done = _play(replay, 1, [s["count"]])
    with_pitch = (1 + 1 - 0.5 - 0.5) / 4
    assert reward == pytest.approx((1 + 1 - 0.5 + 1) / 4 - with_pitch)

    with pytest.raises(ValueError, match="question"):
        make(mode="instruct")  # plain manifest sound_rows are not harvested replay items


# --- batched, deduplicated judging ------------------------------------------------------------
def test_one_examiner_call_per_batch_and_each_pair_once(make, sound_rows, one):
    env = make(budget=2, defer_scoring=True)
    counter = env.unwrapped._examiner = CountingExaminer(RuleExaminer())
    s = _script(sound_rows[one])
    other = next(i for i, r in enumerate(sound_rows) if len(r["events"]) > 1)
    plays = [
        (one, [s["c0"], "READY", s["final"]]),
        (one, [s["c0"], "READY", s["final"]]),  # the same rollout again
        (one, [s["c0"], s["ask_pitch"], s["pitch"], "READY", s["c0"]]),
        (other, [s["c0"], "READY", s["final"]]),  # same texts, another item: another bank
    ]
    episodes = [_play(env, index, actions)[2]["episode"] for index, actions in plays]
    assert counter.calls == []  # nothing judged while stepping with defer_scoring
    batch = env.unwrapped.score(episodes)
    assert len(counter.calls) == 1
    sent = counter.calls[0]
    assert len(sent) == len(set(sent))
    ser0 = serialize_evidence(s["c0"], [])
    ser1 = serialize_evidence(s["c0"], [(s["ask_pitch"].removeprefix("ASK: "), s["pitch"])])
    L_one, L_other = len(sound_rows[one]["mcq"]), len(sound_rows[other]["mcq"])
    # item `one`: c0, ser(c0) (E of games 1–2 and E^{-1} of game 3), c^F, ser(c0, q, a); item `other`: 3 texts
    assert {t for t, q in sent if q in env.unwrapped.items[one]["_questions"]} == {s["c0"], ser0, s["final"], ser1}
    assert len(sent) == 4 * L_one + 3 * L_other
    for episode, together in zip(episodes, batch):
        alone = env.unwrapped.score([episode])[0]
        assert together.reward == alone.reward and together.components == alone.components
        assert together.utilities == alone.utilities and together.extras == alone.extras
    assert len(counter.calls) == 1 + len(episodes)


def test_items_sharing_an_id_keep_their_own_banks(make, sound_rows, one):
    loaded = make().unwrapped.items
    other = next(i for i, r in enumerate(sound_rows) if len(r["events"]) > 1)
    twins = [dict(loaded[one]), {**loaded[other], "id": loaded[one]["id"]}]  # e.g. two merged datasets
    env = make(manifest=None, items=twins, budget=2, defer_scoring=True)
    s = _script(sound_rows[one])
    episodes = [_play(env, k, [s["c0"], "READY", s["final"]])[2]["episode"] for k in range(2)]
    batch = env.unwrapped.score(episodes)
    alone = [env.unwrapped.score([e])[0] for e in episodes]
    assert [b.components for b in batch] == [a.components for a in alone]
    assert batch[0].components["g2p_c0"] == pytest.approx((1 - 0.5 * 3) / 4)
    assert batch[1].components["g2p_c0"] != batch[0].components["g2p_c0"]  # the other bank: L = 4 · events


# --- supervised warm start ---------------------------------------------------------------------
@pytest.mark.parametrize("budget, demo_questions, agents", [
    (2, None, ["captioner", "composer", "instruct", "composer", "instruct", "composer"]),
    (4, 1, ["captioner", "composer", "instruct", "composer", "composer"]),
    (1, 3, ["captioner", "composer", "instruct", "composer"]),  # never more questions than K
    (4, 0, ["captioner", "composer", "composer"]),
])
def test_demonstrations_replay_as_a_game(make, sound_rows, one, budget, demo_questions, agents):
    env = make(budget=budget, demo_questions=demo_questions)
    item, row = env.unwrapped.items[one], sound_rows[one]
    demos = env.unwrapped.demonstrations(item)
    assert [o["agent"] for o, _ in demos] == agents
    asked = agents.count("instruct")
    targets = [t for _, t in demos]
    expected = [row["short_caption"]]
    for pair in row["qa"][:asked]:
        expected += [f"ASK : {pair['question']}", pair["answer"]]
    expected += ["READY"] if asked < budget else []
    expected += [row["caption"]]
    assert targets == expected
    # every demonstration is exactly what the game shows that role at that point
    obs, _ = env.reset(options={"index": one})
    for k, (demo_obs, target) in enumerate(demos):
        assert demo_obs["agent"] == obs["agent"] and demo_obs["messages"] == obs["messages"]
        assert set(demo_obs["media"]) == set(obs["media"])
        obs, reward, terminated, _, info = env.step(target)
        assert terminated == (k == len(demos) - 1)
    assert [a.kind for a in info["episode"].actions][-1] == "final"


def test_shuffled_demonstrations_are_seeded_by_the_item_and_spread_over_events(make, sound_rows):
    env = make(budget=4, demo_questions=3, demo_order="shuffled").unwrapped
    asked = lambda item: [t.removeprefix("ASK : ") for o, t in env.demonstrations(item) if t.startswith("ASK")]
    gold = {i: [q["question"] for q in sound_rows[i]["qa"]] for i in range(len(sound_rows))}
    for i, item in enumerate(env.items):
        questions = asked(item)
        assert questions == asked(item), "the same item must always show the same questions"
        assert len(questions) == min(3, len(gold[i])) and set(questions) <= set(gold[i])
    # over the items, questions about later events are demonstrated too (the manifest order never does)
    events = {q["meta"]["event"] for i, item in enumerate(env.items) for q in sound_rows[i]["qa"]
              if q["question"] in asked(item)}
    assert len(events) > 1
    with pytest.raises(ValueError, match="demo_order"):
        make(demo_order="random")


def test_dense_c0_demonstrates_the_gold_caption_and_needs_no_question_for_it(make, sound_rows):
    env = make(budget=2, demo_questions="needed", demo_c0="dense").unwrapped
    for i, item in enumerate(env.items):
        targets = [t for _, t in env.demonstrations(item)]
        assert targets[0] == sound_rows[i]["caption"] != sound_rows[i]["short_caption"]
        # c0 already holds every fact the bank asks about: the Composer is shown to stop at once
        assert targets[1:] == ["READY", sound_rows[i]["caption"]]
    with pytest.raises(ValueError, match="demo_c0.*'long'"):
        make(demo_c0="long")


def test_own_c0_demonstrates_mending_the_captioners_caption(make, sound_rows, one):
    """demo_c0="own": the Composer's c0 is the Captioner's harvested caption, the question the one that
    mends it most, the final caption the gold one; the Captioner is still shown the gold caption."""
    s = _script(sound_rows[one])
    captioner = make(mode="captioner", defer_scoring=True)
    _, _, info = _play(captioner, one, [s["c0"]])
    [harvested] = captioner.unwrapped.harvest([info["episode"]])
    assert harvested["c0"] == s["c0"] and harvested["id"] == sound_rows[one]["id"]

    env = make(manifest=None, items=[harvested], budget=1, demo_questions="needed", demo_c0="own").unwrapped
    demos = env.demonstrations(env.items[0])
    assert [o["agent"] for o, _ in demos] == ["captioner", "composer", "instruct", "composer"]
    assert demos[0][1] == sound_rows[one]["caption"]
    assert s["c0"] in demos[1][0]["messages"][0]["content"]  # the Composer reads the harvested c0
    needed = env.needed_questions(env.items[0], s["c0"])
    assert needed and demos[1][1] == "ASK : " + sound_rows[one]["qa"][needed[0]]["question"]
    assert demos[-1][1] == sound_rows[one]["caption"]
    # an item that was not harvested is refused naming it and the stage setting that harvests it
    plain = make(demo_c0="own").unwrapped
    with pytest.raises(ValueError, match=rf"{sound_rows[0]['id']}.*no 'c0'"):
        plain.demonstrations(plain.items[0])


def test_absent_demonstrations_teach_the_instruct_to_say_not_heard(make, sound_rows, toy_soundscapes):
    """demo_absent: after the game's turns, Instruct turns that ask about subjects the clip lacks (in
    the split's own question words), answered "not heard"; the game's turns are unchanged."""
    plain = make(budget=1, demo_questions=1, demo_order="shuffled").unwrapped
    env = make(budget=1, demo_questions=1, demo_order="shuffled", demo_absent=2).unwrapped
    subjects: dict[str, str] = {}  # each subject's first question in the split
    for q in (q for row in sound_rows for q in row["qa"]):
        subjects.setdefault(q["meta"]["subject"], q["question"])
    added = 0
    for item, row in zip(env.items, sound_rows):
        game = [(o["agent"], a) for o, a in plain.demonstrations(item)]
        demos = env.demonstrations(item)
        assert [(o["agent"], a) for o, a in demos[: len(game)]] == game
        held = {q["meta"]["subject"] for q in row["qa"]}
        extra = demos[len(game):]
        assert len(extra) == min(2, len(set(subjects) - held))
        for observation, answer in extra:
            subject = answer.removeprefix("The ").removesuffix(" is not heard.")
            assert observation["agent"] == "instruct" and subject in set(subjects) - held
            assert f"Question : {subjects[subject]}\n" in observation["messages"][0]["content"]
            assert "waveform" in observation["media"]
        assert [a for _, a in env.demonstrations(item)[len(game):]] == [a for _, a in extra]  # drawn by the item
        added += len(extra)
    assert added, "no toy clip lacks a subject of its split"
    with pytest.raises(ValueError, match="demo_absent"):
        make(demo_absent=-1)
    # a split whose QA pairs name no subject cannot say what a clip lacks: refused naming the field
    bare = {**sound_rows[0], "audio": str(toy_soundscapes / sound_rows[0]["audio"]), "qa": [{"question": q["question"], "answer": q["answer"]} for q in sound_rows[0]["qa"]]}
    unnamed = make(manifest=None, items=[bare], budget=1, demo_questions=1, demo_absent=1).unwrapped
    with pytest.raises(ValueError, match="meta.subject"):
        unnamed.demonstrations(unnamed.items[0])


def test_absent_questions_can_take_every_form_the_subject_is_asked_in(make, sound_rows):
    """demo_absent_forms="all": an absent subject is asked in words drawn from the forms its present
    questions take in the split, so the words alone do not say "not heard"; "first" keeps one form."""
    forms: dict[str, set[str]] = {}
    for q in (q for row in sound_rows for q in row["qa"]):
        forms.setdefault(q["meta"]["subject"], set()).add(q["question"])
    assert any(len(f) > 1 for f in forms.values()), "no toy subject is asked in two forms"
    asked: dict[str, dict[str, set[str]]] = {"first": {}, "all": {}}
    for mode in asked:
        env = make(budget=1, demo_questions=0, demo_absent=3, demo_absent_forms=mode).unwrapped
        plain = make(budget=1, demo_questions=0).unwrapped
        for item in env.items:
            for observation, answer in env.demonstrations(item)[len(plain.demonstrations(item)):]:
                subject = answer.removeprefix("The ").removesuffix(" is not heard.")
                question = observation["messages"][0]["content"].split("Question : ")[1].split("\n")[0]
                assert question in forms[subject]
                asked[mode].setdefault(subject, set()).add(question)
    assert all(len(f) == 1 for f in asked["first"].values())
    assert any(len(f) > 1 for f in asked["all"].values())
    with pytest.raises(ValueError, match="'demo_absent_forms' must be one of \\['first', 'all'\\], got 'every'"):
        make(demo_absent=1, demo_absent_forms="every")


def test_supported_final_states_only_what_c0_and_the_answers_hold(make, sound_rows):
    """demo_final="supported": the final-caption target is c0 mended by the answers (a missing event
    inserted at its time, a wrong sentence replaced), never the gold caption's unasked facts."""
    i = next((i for i, r in enumerate(sound_rows) if len(r["events"]) >= 3), None)
    assert i is not None, "the toy world has no clip of three events"
    row = sound_rows[i]
    first, second, third = sentences(row["caption"])[:3]
    kind = row["events"][0]["type"]
    wrong = first.replace(f" {row['events'][0]['pitch']} {kind}", f" {'low' if row['events'][0]['pitch'] != 'low' else 'mid'} {kind}")
    assert wrong != first
    env = make(budget=1, demo_questions="needed", demo_final="supported").unwrapped
    item = env.items[i]
    # a missing event goes in at its place in time
    assert env.supported_final(item, f"{first} {third}", [("What is the second sound like?", second)]) == \
        f"{first} {second} {third}"
    # a sentence the answer contradicts is replaced, not kept beside it
    assert env.supported_final(item, f"{wrong} {third}", [("What is the first sound like?", first)]) == f"{first} {third}"
    # an answer with no time and nothing to replace is appended; an answer G2P does not reward leaves c0 as it is
    pitch = next(q["answer"] for q in row["qa"] if q["question"] == f"What is the pitch of the {kind}?")
    mended = env.supported_final(item, third, [("?", pitch)])
    assert mended == f"{third} {pitch}"
    assert env.supported_final(item, row["caption"], [("?", pitch)]) == row["caption"]
    # the warm-up's last target is that caption, built from the demonstrated c0 and answer alone
    demos = env.demonstrations(item)
    c0 = env.demo_first_caption(item)
    asked = demos[1][1].removeprefix("ASK : ")
    answer = next(q["answer"] for q in row["qa"] if q["question"] == asked)
    assert demos[-1][1] == env.supported_final(item, c0, [(asked, answer)])
    assert set(sentences(demos[-1][1])) <= set(sentences(c0)) | {answer}
    with pytest.raises(ValueError, match="demo_final"):
        make(demo_final="invented")


def test_needed_demonstrations_ask_one_question_per_event_then_stop(make, sound_rows):
    env = make(budget=4, demo_questions="needed").unwrapped
    counts = set()
    for i, item in enumerate(env.items):
        targets = [t for _, t in env.demonstrations(item)]
        asked = [t.removeprefix("ASK : ") for t in targets if t.startswith("ASK")]
        whole = [q["question"] for q in sound_rows[i]["qa"] if q["meta"]["attribute"] == "event"]
        assert asked == whole, "one whole-event question per event, in time order, and nothing else"
        assert targets[-2:] == ["READY", sound_rows[i]["caption"]]  # 1-3 events < K = 4: a sampled stop
        counts.add(len(asked))
    assert len(counts) > 1, "the toy world must vary the evidence a clip needs"
    # the greedy choice stops at the budget: with K = 1 every clip asks one question and is forced
    short = make(budget=1, demo_questions="needed").unwrapped
    assert all(sum(t.startswith("ASK") for _, t in short.demonstrations(item)) == 1 for item in short.items)
    with pytest.raises(ValueError, match="demo_questions"):
        make(demo_questions="all")


@pytest.mark.parametrize("mode", ["random", "padded"])
def test_random_demonstrations_ask_a_count_that_ignores_the_clip(make, sound_rows, mode):
    env = make(budget=4, demo_questions=mode).unwrapped
    needed = make(budget=4, demo_questions="needed").unwrapped
    counts_by_events: dict[int, set[int]] = {}
    for i, item in enumerate(env.items):
        targets = [t for _, t in env.demonstrations(item)]
        assert targets == [t for _, t in env.demonstrations(item)], "the same item must always show the same count"
        asked = [t.removeprefix("ASK : ") for t in targets if t.startswith("ASK")]
        assert 0 <= len(asked) <= 4 and ("READY" in targets) == (len(asked) < 4)
        # the needed questions come first, then the clip's other gold questions (redundant evidence)
        first = [t.removeprefix("ASK : ") for t in (t for _, t in needed.demonstrations(item)) if t.startswith("ASK")]
        gold = [q["question"] for q in sound_rows[i]["qa"]]
        assert asked == (first + [q for q in gold if q not in first])[: len(asked)]
        if mode == "padded":  # never fewer than the needed ones: every fact of the final caption was asked
            assert len(asked) >= len(first)
        counts_by_events.setdefault(len(sound_rows[i]["events"]), set()).add(len(asked))
    # clips with the same number of events get different counts: the count does not follow the clip
    assert any(len(c) > 1 for c in counts_by_events.values())


def test_episode_extras_count_events_and_extra_questions(make, sound_rows):
    env = make(budget=4)
    index = next(i for i, r in enumerate(sound_rows) if len(r["events"]) == 1)
    s = _script(sound_rows[index])
    actions = [s["c0"], "ASK : a", "x", "ASK : b", "y", "READY", s["final"]]
    _, _, info = _play(env, index, actions)
    extras = env.unwrapped.score([info["episode"]])[0].extras
    assert extras["events"] == 1.0 and extras["questions"] == 2.0 and extras["extra_questions"] == 1.0


def test_demonstration_c0_falls_back_to_the_first_gold_sentence(make, sound_rows):
    env = make()
    index = next(i for i, r in enumerate(sound_rows) if len(r["events"]) > 1)
    item = {k: v for k, v in env.unwrapped.items[index].items() if k != "short_caption"}
    c0 = env.unwrapped.demonstrations(item)[0][1]
    assert c0 == sound_rows[index]["caption"].split(". ")[0] + "."  # "1.4 s" does not end the sentence


# --- bad input and inference ------------------------------------------------------------------
def test_gold_E_in_the_mcq_bank_is_refused(make, toy_soundscapes):
    bad = {r["id"]: r for r in read_jsonl(toy_soundscapes / "bad.jsonl")}
    manifest = toy_soundscapes / "game-gold-e.jsonl"
    manifest.write_text(json.dumps(bad["bad-gold-e"]) + "\n", encoding="utf-8")
    with pytest.raises(ManifestError, match=r"mcq\[0\]: field 'answer' is 'E'") as caught:
        make(manifest=str(manifest))
    assert f"{manifest}:1" in str(caught.value)
    manifest.write_text(json.dumps(bad["bad-corrupt"]) + "\n", encoding="utf-8")
    with pytest.raises(ManifestError, match="field 'audio'.*bad-corrupt.wav"):
        make(manifest=str(manifest))


def test_unlabelled_audio_plays_without_a_score(make, toy_soundscapes):
    env = make(budget=1)
    item = env.unwrapped.item_from_audio(str(toy_soundscapes / "audio" / "train-0001.wav"))
    env.reset(options={"item": item})
    for action in ["A beep is heard.", "ASK: How loud is the beep?", "It is loud.", "A loud beep."]:
        obs, reward, terminated, _, info = env.step(action)
    assert terminated and math.isnan(reward)
    assert info["utilities"] == [None] * 4 and info["score"].extras == {"unlabelled": 1.0}


def test_rollout_driver_plays_and_scores_through_other_env_instances(make, sound_rows, one):
    """The driver steps a pool of envs and scores every episode with the first one (one batch)."""
    import torch

    from agentcap.agents.generation import Generation
    from agentcap.rollout.driver import RolloutDriver

    s = _script(sound_rows[one])

    class Scripted:
        def __init__(self, replies):
            self.replies = replies

        def generate(self, observations, greedy, batch_size, seeds=None, old_logprobs=True):
            out = []
            for obs in observations:
                text = self.replies(obs["messages"][-1]["content"])
                out.append(Generation(torch.zeros(1, dtype=torch.long), text=text, old_logprobs=torch.zeros(1)))
            return out

    def compose(history):
        if history.endswith(COMPACT["finalize"]):
            return s["final"]
        return s["ask_pitch"] if s["pitch"] not in history else "READY"

    agents = {"captioner": Scripted(lambda _: s["c0"]), "composer": Scripted(compose),
              "instruct": Scripted(lambda _: s["pitch"])}
    driver = RolloutDriver(lambda: make(budget=2, defer_scoring=True), agents)
    batch = driver.run(indices=[one], group_size=2)
    assert len(driver.envs) == 2 and batch.turns == [5, 5]
    for score in batch.scores:
        assert score.components == pytest.approx({"g2p_c0": -0.125, "g2p_evidence": 0.25, "g2p_final": 0.25})
    composer = batch.spans_of("composer")
    for t in range(2):
        mine = [sp for sp in composer if sp.trajectory == t]
        assert [sp.kind for sp in mine] == ["question", "stop", "final"]
        # u^Q = 0.25 − (−0.125); b = (0.25 + 0.125) + 1.0·(0.25 + 0.125); u^S = u^F = b (c_S = 0)
        assert [sp.utility for sp in mine] == pytest.approx([0.375, 0.75, 0.75])
    assert batch.spans_of("instruct") == [] and batch.spans_of("captioner") == []  # frozen roles: no utility


def test_rule_examiner_does_not_read_questions_as_evidence():
    """A question that names an attribute value is not a claim (ACE-Cap: questions are non-assertive)."""
    from agentcap.judges.evidence import serialize_evidence
    from agentcap.judges.questions import Question
    from agentcap.judges.rule import RuleExaminer

    question = Question("How loud is the buzz?", ("very soft", "soft", "loud", "very loud", "Not given"), "C",
                        {"subject": "buzz", "attribute": "loudness"})
    asked = serialize_evidence("A buzz is heard.", [("Is the buzz loud or very soft?", "I cannot tell.")])
    answered = serialize_evidence("A buzz is heard.", [("How loud is the buzz?", "The buzz is loud.")])
    assert RuleExaminer().answer([asked, answered], [question, question]) == ["E", "C"]
