"""ACE-Cap: the Composer–Instruct evidence game."""

from __future__ import annotations

import os
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agentcap.core.env import CaptionEnv
from agentcap.core.episode import Episode, Score
from agentcap.core.manifests import (ManifestError, audio_id, audio_where, check_audio, check_duration, load_audio,
                                     resolve, warn_truncation)
from agentcap.judges.build import build_examiner
from agentcap.judges.evidence import evidence_states, serialize_evidence
from agentcap.judges.questions import Question, question_bank, sentences
from agentcap.judges.replies import TooManyInvalidReplies
from agentcap.judges.temporal import parse_intervals
from agentcap.rewards.evidence import LoopConfig, captioner_utility, composer_utilities, instruct_utility
from agentcap.rewards.functional.cloze import answer_scores
from agentcap_envs.audio_qa import ANSWER_PROMPTS, absent_pairs, check_qa, subject_questions

CAPTIONER, COMPOSER, INSTRUCT = "captioner", "composer", "instruct"

PROMPTS = {
    "paper": {
        "caption": "Describe the audio.",
        "compose": (
            "You write a detailed caption of an audio clip you cannot hear. Ask one question about a sound "
            "detail that is still unresolved as 'ASK: <question>', or reply 'READY' when the evidence is enough."
        ),
        "finalize": "Write the final detailed caption of the audio from the evidence above.",
        "answer": ANSWER_PROMPTS["paper"],
    },
    "compact": {
        "caption": "Describe the audio briefly .",
        "compose": "Ask one question as ASK : question , or say READY .",
        "finalize": "Write the final caption .",
        "answer": ANSWER_PROMPTS["compact"],
    },
}

_ASK = re.compile(r"^\s*ask\b\s*:?\s*", re.IGNORECASE)
_READY = re.compile(r"^\s*ready\b", re.IGNORECASE)


_WORD = re.compile(r"[a-z0-9']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _first_time(text: str) -> float | None:
    """The first time a sentence names ("from 1.2 s …"), the key that orders a time-aware caption."""
    timed = parse_intervals(text)
    return timed[0].start if timed else None


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def parse_composer_action(text: str) -> tuple[str, str, bool]:
    """(kind, question, malformed) of a Composer turn.

    ``READY…`` (any case) or an empty action stops; ``ASK: q`` (or ``ASK q``; the word ASK, any case,
    colon optional) asks ``q``; ``ASK:`` with nothing after it stops and is flagged malformed; any
    other text (``Askew…`` too: ASK must be a whole word) is asked verbatim as a question and
    flagged malformed, so a Composer that forgets the prefix still pays the question cost and earns
    only what its text elicits, instead of silently ending the game.
    """
    if not text.strip() or _READY.match(text):
        return "stop", "", False
    match = _ASK.match(text)
    if match:
        question = text[match.end():].strip()
        return ("question", question, False) if question else ("stop", "", True)
    return "question", text.strip(), True


class EvidenceGameEnv(CaptionEnv):
    """Active evidence acquisition for long audio captions (ACE-Cap).

    ## Description
    The audio-conditioned Captioner writes a first caption c0. The text-only Composer, seeing only
    c0 and the question–answer history, asks a question (``ASK: …``) or stops (``READY``); the
    audio-conditioned Instruct model answers from the audio. At READY, or when K questions have been
    asked (forced finalisation: no stop action exists), the Composer writes the final caption c^F.
    The Composer never receives audio.

    Modes (stage overrides): ``game`` (the whole game; the Composer's question / stop / final
    actions get LOOP-GRPO utilities, Eq. 12–16), ``captioner`` (only c0, utility R_G(c0), Eq. 22),
    ``instruct`` (replays a harvested (audio, history, question) state; the answer's utility is
    R_G(y⁺) − R_G(y⁻), Eq. 23). ``harvest`` turns finished games into ``instruct`` items.

    ## Action
    Text. Composer actions are parsed by :func:`parse_composer_action`.

    ## Observation
    ``agent`` is ``captioner``, ``composer`` or ``instruct``; ``media`` holds ``waveform`` for the
    Captioner and Instruct, and is empty for the Composer.

    ## Rewards
    G2P (Eq. 2–3): a frozen caption-only judge answers the item's gold MCQs; +1 correct, −0.5 for E,
    −1 wrong, mean over the bank. The episode reward is R_G(c^F) (``game``), R_G(c0) (``captioner``)
    or the Instruct utility (``instruct``). Components: ``g2p_c0``, ``g2p_evidence``, ``g2p_final``;
    extras: ``questions``, ``forced``, ``acc_*`` (share answered correctly), ``retention_gap``
    (Acc(E) − Acc(c^F)), ``malformed``. Utilities are aligned with ``episode.actions``: in ``game``
    mode u^Q / u^S / u^F on the Composer's question / stop / final actions and ``None`` on the
    Captioner's c0 and the Instruct answers. One examiner call per ``score`` batch; a (text,
    question) pair that repeats in the batch (shared c0, identical evidence states) is judged once.
    An unlabelled item (``item_from_audio``: no MCQ bank) has no reward: NaN, no components,
    utilities ``None``, ``extras["unlabelled"] = 1``.

    ## Episode end
    After c^F (``game``), c0 (``captioner``) or the answer (``instruct``).

    ## Arguments
    manifest: JSONL rows with ``id, audio, caption, mcq`` (and ``short_caption``, ``qa`` for the
    supervised warm start). budget: K. examiner: ``rule`` (toy worlds only) or a local HF causal LM.
    question_cost, stop_cost, preserve_weight: c_Q, c_S, λ of LOOP-GRPO. demo_questions, demo_order:
    how many gold questions the warm-start demonstrations ask (``needed``: as many as the gold MCQ
    bank rewards beyond c0, see ``needed_questions``; ``random``: a per-item draw that ignores the
    clip; ``padded``: the needed ones plus a per-item draw of redundant ones, so only LOOP-GRPO can
    teach when to stop), and which (see ``demonstrations``). demo_c0: the Captioner's warm-start
    target, ``short`` (the short caption: it names the sounds, the Composer asks for the rest) or
    ``dense`` (the gold caption: a Captioner that already writes dense captions, e.g. AudioMap's warm
    start, keeps what it hears, and the Composer asks for what c0 lacks) or ``own`` (the Captioner's own
    caption of the item, harvested by the stage: ``harvest: {mode: captioner}``; the Composer learns to
    mend an imperfect c0 with what it asks, since its final target is still the gold caption).
    demo_final: the Composer's final-caption target, ``gold`` (the gold caption, which may state
    facts neither c0 nor the answers hold) or ``supported`` (c0 mended by the answers alone, see
    ``supported_final``: the warm-up never shows a fact the evidence lacks). demo_absent: Instruct
    warm-up turns per clip that ask about a subject the clip lacks and answer that it is not heard
    (see ``absent_demonstrations``), so the warm-started Instruct does not say yes to every question;
    demo_absent_forms: their words, each subject's ``first`` question's or drawn from ``all`` its forms.
    audio_check: ``header`` (each clip's header at load; decoded, and a truncated file or NaN / Inf
    samples refused naming the row, when the item is used) or ``decode`` (every clip decoded at load,
    so ``on_error: skip`` drops those too).

    ## Version history
    v0: first version.
    """

    required_fields = {"id": str, "audio": str, "caption": str, "mcq": list}
    scoring_fields = frozenset({"caption", "mcq"})  # inference reads the audio alone
    check_settings = ("max_seconds", "audio_check")  # check_item decodes up to max_seconds, or reads the header

    @staticmethod
    def acting_roles(mode: str = "game", **_) -> set[str]:
        """The roles that act in an episode of ``mode`` (the engines a stage keeps awake: training.engines)."""
        return {"game": {CAPTIONER, COMPOSER, INSTRUCT}, "captioner": {CAPTIONER}, "instruct": {INSTRUCT}}[mode]

    def __init__(
        self,
        manifest: str | None = None,
        items: Sequence[dict[str, Any]] | None = None,
        mode: Literal["game", "captioner", "instruct"] = "game",
        budget: int = 4,
        sample_rate: int = 16000,
        max_seconds: float | None = 30.0,
        prompt: Literal["paper", "compact"] = "paper",
        examiner: str | dict[str, Any] = "rule",
        examiner_device: str = "cpu",
        examiner_readout: Literal["letters", "options"] = "letters",
        question_cost: float = 0.0,
        stop_cost: float = 0.0,
        preserve_weight: float = 1.0,
        demo_questions: int | Literal["needed", "random", "padded"] | None = None,
        demo_order: Literal["manifest", "shuffled"] = "manifest",
        demo_c0: Literal["short", "dense", "own"] = "short",
        demo_final: Literal["gold", "supported"] = "gold",
        demo_absent: int = 0,
        demo_absent_forms: Literal["first", "all"] = "first",
        defer_scoring: bool = False,
        on_error: Literal["raise", "skip"] = "raise",
        max_skip_fraction: float = 0.1,
        audio_check: Literal["header", "decode"] = "header",
    ):
        if budget < 0:
            raise ValueError(f"budget (K) must be ≥ 0, got {budget}")
        self.sample_rate, self.max_seconds, self.audio_check = sample_rate, max_seconds, audio_check
        super().__init__(
            manifest=manifest, items=items, defer_scoring=defer_scoring, on_error=on_error,
            max_skip_fraction=max_skip_fraction,
        )
        warn_truncation(self.items, max_seconds, type(self).__name__)
        self.mode, self.budget, self.prompts = mode, budget, PROMPTS[prompt]
        # c0, K questions and K answers, a stop, the final caption; one answer in instruct mode
        self.max_actions = 2 * budget + 3 if mode == "game" else 1
        self.examiner_spec, self.examiner_device = examiner, examiner_device
        self.examiner_readout = examiner_readout
        self.loop = LoopConfig(question_cost=question_cost, stop_cost=stop_cost, preserve_weight=preserve_weight)
        if not (demo_questions is None or demo_questions in ("needed", "random", "padded")
                or (isinstance(demo_questions, int) and demo_questions >= 0)):
            raise ValueError(
                f"demo_questions must be an int >= 0, 'needed', 'random', 'padded' or None, got {demo_questions!r}")
        self.demo_questions = budget if demo_questions is None else demo_questions
        self._needed: dict[tuple[str, str], list[int]] = {}
        if demo_order not in ("manifest", "shuffled"):
            raise ValueError(f"demo_order must be 'manifest' or 'shuffled', got {demo_order!r}")
        self.demo_order = demo_order
        if demo_c0 not in ("short", "dense", "own"):
            raise ValueError(f"demo_c0 must be 'short', 'dense' or 'own', got {demo_c0!r}")
        self.demo_c0 = demo_c0
        if demo_final not in ("gold", "supported"):
            raise ValueError(f"demo_final must be 'gold' or 'supported', got {demo_final!r}")
        self.demo_final = demo_final
        if not (isinstance(demo_absent, int) and demo_absent >= 0):
            raise ValueError(f"demo_absent must be an int >= 0, got {demo_absent!r}")
        self.demo_absent, self.demo_absent_forms = demo_absent, demo_absent_forms
        self._subjects: dict[str, list[str]] | None = None
        self._supported: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}
        self._examiner = None
        if mode == "instruct":
            for i, item in enumerate(self.items):
                if "question" not in item:
                    raise ValueError(f"instruct mode replays harvested items; items[{i}] has no 'question'")

    def check_item(self, row: dict[str, Any], where: str) -> None:
        check_duration(row, where)
        # the header at load (a corrupt file fails here); decoded at use, or here with audio_check="decode"
        decode = self.audio_check == "decode"
        row.setdefault("duration", check_audio(row, "audio", where, self.max_seconds, decode=decode))
        if "mcq" in row and not (isinstance(row["mcq"], list) and row["mcq"]):
            raise ManifestError(f"{where}: field 'mcq' (the gold MCQ bank) is empty")
        # the warm start's demonstrations read these; refuse them here, not as a bare KeyError there
        short = row.get("short_caption")
        if short is not None and (not isinstance(short, str) or not short.strip()):
            raise ManifestError(f"{where}: field 'short_caption' must be a non-empty string, got {short!r}")
        check_qa(row, where)
        row["_questions"] = [Question.from_row(q, f"{where}: mcq[{j}]") for j, q in enumerate(row.get("mcq", []))]

    def item_from_audio(self, path: str) -> dict[str, Any]:
        row = {"id": audio_id(path), "audio": os.path.abspath(path), "caption": "", "mcq": []}
        row["duration"] = check_audio(row, "audio", path, self.max_seconds)  # a missing, empty or undecodable file is named here
        return row

    # --- observations -------------------------------------------------------------------------
    def _waveform(self, item: Mapping[str, Any]):
        path = resolve(item["audio"], item.get("_manifest"))
        return load_audio(path, self.sample_rate, audio_where(item, "audio", path), self.max_seconds)

    def _history(self, c0: str, qa: Sequence[tuple[str, str]]) -> str:
        return serialize_evidence(c0, qa)

    def captioner_obs(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return self.observation(CAPTIONER, [{"role": "user", "content": self.prompts["caption"]}],
                                {"waveform": self._waveform(item)})

    def composer_obs(self, c0: str, qa: Sequence[tuple[str, str]], finalize: bool) -> dict[str, Any]:
        instruction = self.prompts["finalize" if finalize else "compose"]
        text = f"{self._history(c0, qa)}\n{instruction}"
        return self.observation(COMPOSER, [{"role": "user", "content": text}])

    def instruct_obs(self, item: Mapping[str, Any], c0: str, qa: Sequence[tuple[str, str]], question: str):
        text = f"{self._history(c0, qa)}\nQuestion : {question}\n{self.prompts['answer']}"
        return self.observation(INSTRUCT, [{"role": "user", "content": text}], {"waveform": self._waveform(item)})

    # --- the game -----------------------------------------------------------------------------
    def begin(self, episode: Episode) -> dict[str, Any]:
        item = episode.item
        episode.state.update(qa=[], stopped=False, malformed=0)
        if self.mode == "instruct":
            episode.state.update(c0=item["c0"], qa=[tuple(p) for p in item["history"]], turn=INSTRUCT)
            return self.instruct_obs(item, item["c0"], episode.state["qa"], item["question"])
        episode.state["turn"] = CAPTIONER
        return self.captioner_obs(item)

    def advance(self, episode: Episode, action: str) -> dict[str, Any] | None:
        obs = self._advance(episode, action)
        episode.state["turn"] = obs["agent"] if obs is not None else None
        return obs

    def _advance(self, episode: Episode, action: str) -> dict[str, Any] | None:
        state, item = episode.state, episode.item
        acting = state.get("turn")  # whose turn it is lives in the episode, so any env instance can step it
        if acting is None:
            raise RuntimeError("this episode is over (or was never begun); call reset() first")
        if self.mode == "instruct":
            self.record(episode, INSTRUCT, "answer", action)
            state["answer"] = action
            return None
        if acting == CAPTIONER:
            self.record(episode, CAPTIONER, "caption", action)
            state["c0"] = action
            if self.mode == "captioner":
                return None
            return self._next_composer(state)
        if acting == INSTRUCT:
            self.record(episode, INSTRUCT, "answer", action)
            state["qa"].append((state.pop("pending"), action.strip()))
            return self._next_composer(state)
        if state.get("finalizing"):
            self.record(episode, COMPOSER, "final", action)
            state["final"] = action
            return None
        kind, question, malformed = parse_composer_action(action)
        state["malformed"] += int(malformed)
        self.record(episode, COMPOSER, kind, action)
        if kind == "stop":
            state["stopped"] = True
            state["finalizing"] = True
            return self.composer_obs(state["c0"], state["qa"], finalize=True)
        state["pending"] = question
        return self.instruct_obs(item, state["c0"], state["qa"], question)

    def _next_composer(self, state: dict[str, Any]) -> dict[str, Any]:
        if len(state["qa"]) >= self.budget:  # forced finalisation: no stop action is created
            state["finalizing"] = True
        return self.composer_obs(state["c0"], state["qa"], finalize=bool(state.get("finalizing")))

    # --- supervised warm start ----------------------------------------------------------------
    def demonstrations(self, item: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """Every role's targets from the gold data, in game order: c0 = the short caption (else the
        gold caption's first sentence; with ``demo_c0="dense"`` the gold caption itself),
        min(demo_questions, K) gold questions (``needed``: those of :meth:`needed_questions`, so the
        count follows the clip; ``random``: those first, then the clip's other pairs, cut at a count
        drawn from 0..K by the item's id, so the count does not follow the clip; ``padded``: the same
        with the count drawn from needed..K), each followed by its gold answer (Instruct), READY when
        fewer than K were asked, then the gold caption as the final caption.

        The questions are the manifest's first ones, or with ``demo_order="shuffled"`` a draw seeded
        by the item's id: the same for an item every time, but spread over every event and attribute
        across items, so the warm-started Instruct can answer whatever the Composer later asks."""
        c0 = self.demo_first_caption(item)
        # never more questions than the game allows: the K-th answer is followed by the final turn
        qa = [(q["question"], q["answer"]) for q in item.get("qa", [])]
        draw = random.Random(zlib.crc32(str(item["id"]).encode()))
        if self.demo_questions == "needed":
            qa = [qa[k] for k in self.needed_questions(item, c0)]
            count = self.budget
        elif self.demo_questions in ("random", "padded"):
            # the needed pairs first, then the redundant rest; k > needed asks what the evidence
            # already holds. random: k from 0..K, so it also stops too early and its final caption
            # states facts its evidence lacks; padded: k from needed..K, every fact of c^F was asked
            needed = self.needed_questions(item, c0)
            qa = [qa[k] for k in needed] + [p for k, p in enumerate(qa) if k not in needed]
            count = draw.randint(0 if self.demo_questions == "random" else min(len(needed), self.budget), self.budget)
        else:
            count = min(self.demo_questions, self.budget)
        if self.demo_order == "shuffled":
            draw.shuffle(qa)
        qa = qa[:count]
        # "own" demonstrates the Captioner the gold caption: its own caption would teach it nothing
        demos = [(self.captioner_obs(item), item["caption"] if self.demo_c0 == "own" else c0)]
        for t, (question, answer) in enumerate(qa):
            demos.append((self.composer_obs(c0, qa[:t], finalize=False), f"ASK : {question}"))
            demos.append((self.instruct_obs(item, c0, qa[:t], question), answer))
        if len(qa) < self.budget:
            demos.append((self.composer_obs(c0, qa, finalize=False), "READY"))
        final = self.supported_final(item, c0, qa) if self.demo_final == "supported" else item["caption"]
        demos.append((self.composer_obs(c0, qa, finalize=True), final))
        return demos + self.absent_demonstrations(item, c0, draw)

    def absent_demonstrations(self, item: Mapping[str, Any], c0: str, draw: random.Random) -> list[tuple[dict[str, Any], str]]:
        """``demo_absent`` Instruct turns outside the game, each asking about a subject the clip lacks
        ("When is the bell heard?" of a clip with no bell), answered "The bell is not heard.".

        Every gold question is about something the clip holds, so an Instruct taught on those alone
        says yes to any question (it answered a time for each of six sounds, present or not, on every
        held-out clip: ``tools/instruct_probe.py``); its answers then tell the Composer nothing c0 does
        not. The subjects are those of the split's ``qa`` ``meta.subject``, each asked in its first
        question's words (``demo_absent_forms="first"``) or in words drawn from those its present
        questions take (``"all"``: one form per subject teaches the form, not the audio; docs/real.md
        "A warm start that also answers"); which ones is drawn by the item's id."""
        if self.demo_absent and self._subjects is None:
            self._subjects = subject_questions(self.items, self.demo_absent_forms)
        return [(self.instruct_obs(item, c0, [], question), answer)
                for question, answer in absent_pairs(item, self._subjects or {}, draw, self.demo_absent)]

    def supported_final(self, item: Mapping[str, Any], c0: str, qa: Sequence[tuple[str, str]]) -> str:
        """c0 mended by the answers: a final caption that states only what the evidence holds.

        Each answer in turn replaces one sentence of the caption, goes in as a sentence of its own
        or is left out, whichever scores best under G2P (the gold MCQ bank). On a tie it is left out
        (it adds nothing the bank asks), else it replaces the sentence that shares most of its words
        with it (over half: the same event told differently), else it goes in at its place in time
        (before the first sentence that starts later; at the end when it names no time). Cached per
        item id, c0 and answers.
        """
        key = (str(item["id"]), c0, tuple((q, a) for q, a in qa))
        if key not in self._supported:
            episode = Episode(item=dict(item))
            parts = sentences(c0)
            for _, answer in qa:
                answer = answer.strip()
                if not answer:
                    continue
                words = set(_words(answer))
                start = _first_time(answer)
                later = [j for j, s in enumerate(parts)
                         if start is not None and (t := _first_time(s)) is not None and t > start]
                at = later[0] if later else len(parts)
                # (candidate sentences, tie preference): c0 as it is first, an insertion as a half overlap
                options = [(parts, 1.0), (parts[:at] + [answer] + parts[at:], 0.5)]
                options += [(parts[:j] + [answer] + parts[j + 1:], _overlap(words, set(_words(s))))
                            for j, s in enumerate(parts)]
                texts = [" ".join(o) for o, _ in options]
                judged = self.g2p([(0, t) for t in texts], [episode])
                best = max(range(len(options)), key=lambda k: (round(judged[(0, texts[k])][0], 9), options[k][1], -k))
                parts = options[best][0]
            self._supported[key] = " ".join(parts)
        return self._supported[key]

    def demo_first_caption(self, item: Mapping[str, Any]) -> str:
        """The c0 of the demonstrations (``demo_c0``)."""
        if self.demo_c0 == "own":
            if not isinstance(item.get("c0"), str):
                raise ValueError(f"demo_c0='own' demonstrates the Captioner's own caption, harvested when the stage "
                                 f"begins (harvest: {{mode: captioner}}); item {item['id']!r} has no 'c0'")
            return item["c0"]
        if self.demo_c0 == "dense":
            return item["caption"]
        # the first sentence of the gold caption, when there is no short caption ("4.7 s" does not end one)
        return item.get("short_caption") or (sentences(item["caption"]) or [item["caption"]])[0]

    def needed_questions(self, item: Mapping[str, Any], c0: str) -> list[int]:
        """Indices (manifest order) of the gold QA pairs the evidence needs beyond c0.

        Greedy on the G2P reward itself: from ser(c0), add the pair whose answer raises
        R_G(ser(E)) the most (ties: the earlier pair), until no pair raises it or K are chosen. So a
        warm start asks as many questions as the clip's gold MCQ bank rewards, not a fixed number;
        on the toy soundscapes that is one whole-event question per event. Cached per item id and c0.
        """
        key = (str(item["id"]), c0)
        if key not in self._needed:
            pairs = [(q["question"], q["answer"]) for q in item.get("qa", [])]
            episode = Episode(item=dict(item))
            chosen: list[int] = []
            score = self.g2p([(0, serialize_evidence(c0, []))], [episode])[(0, serialize_evidence(c0, []))][0]
            while len(chosen) < self.budget:
                rest = [k for k in range(len(pairs)) if k not in chosen]
                texts = {k: serialize_evidence(c0, [pairs[j] for j in sorted([*chosen, k])]) for k in rest}
                judged = self.g2p([(0, t) for t in texts.values()], [episode]) if texts else {}
                gains = {k: judged[(0, t)][0] - score for k, t in texts.items()}
                best = max(rest, key=lambda k: (gains[k], -k), default=None)
                if best is None or gains[best] <= 1e-9:
                    break
                chosen.append(best)
                score += gains[best]
            self._needed[key] = sorted(chosen)
        return self._needed[key]

    def harvest(self, episodes: Sequence[Episode]) -> list[dict[str, Any]]:
        """Instruct replay items (Eq. 23): one per asked question, with the history before it; from
        ``captioner`` episodes, the item with the Captioner's c0 (``demo_c0="own"``)."""
        if self.mode == "captioner":
            return [{**e.item, "c0": e.state["c0"]} for e in episodes]
        items = []
        for e in episodes:
            qa = e.state.get("qa", [])
            for t, (question, _) in enumerate(qa):
                history = [list(p) for p in qa[:t]]
                items.append({**e.item, "c0": e.state["c0"], "history": history, "question": question})
        return items

    # --- scoring ------------------------------------------------------------------------------
    @property
    def examiner(self):
        if self._examiner is None:
            self._examiner = build_examiner(self.examiner_spec, self.examiner_device, self.examiner_readout)
        return self._examiner

    def g2p(self, requests: Sequence[tuple[int, str]], episodes: Sequence[Episode]) -> dict[tuple[int, str], tuple[float, float]]:
        """(R_G, accuracy) of every (episode index, text) request, from one batched examiner call.

        Every (text, gold question) pair of the batch is sent once: identical texts on the same bank
        (a shared c0, repeated evidence states, the G rollouts of an item) are judged once, and
        items are told apart by their banks, never by their ids.
        """
        pairs: dict[tuple[str, Any], int] = {}
        rows: dict[tuple[int, str], list[int]] = {}
        for i, text in requests:
            if (i, text) not in rows:
                bank = question_bank(episodes[i].item, "mcq")
                rows[(i, text)] = [pairs.setdefault((text, q), len(pairs)) for q in bank]
        unique = list(pairs)
        # asked even with nothing to judge: a sharded examiner's call is a collective (agentcap.judges.pool)
        letters = self.examiner.answer([t for t, _ in unique], [q for _, q in unique])
        if len(letters) != len(unique):
            raise RuntimeError(f"examiner returned {len(letters)} answers for {len(unique)} questions")
        gold = [q.answer for _, q in unique]
        scores = answer_scores(letters, gold).tolist() if unique else []
        correct = [float(a == g) for a, g in zip(letters, gold)]
        if all(a is not None for a in letters):
            return {
                key: (sum(scores[k] for k in row) / len(row), sum(correct[k] for k in row) / len(row))
                for key, row in rows.items()
            }
        out = {}  # invalid examiner replies (None) are left out of both means (agentcap.judges.replies)
        for (i, text), row in rows.items():
            kept = [k for k in row if letters[k] is not None]
            if not kept:
                raise TooManyInvalidReplies(f"the examiner gave no valid answer to any of episode {i}'s "
                                            f"{len(row)} questions (invalid replies; agentcap.judges.replies)")
            out[(i, text)] = (sum(scores[k] for k in kept) / len(kept), sum(correct[k] for k in kept) / len(kept))
        return out

    def score(self, episodes: Sequence[Episode]) -> list[Score]:
        requests: list[tuple[int, str]] = []
        states: list[dict[str, Any] | None] = []
        for i, e in enumerate(episodes):
            s = e.state
            c0 = s.get("c0", "")
            if not question_bank(e.item, "mcq"):  # inference on a raw audio file: no gold, nothing to score
                states.append(None)
                continue
            if self.mode == "captioner":  # Eq. 22 needs R_G(c0) only
                states.append({"c0": c0})
                requests.append((i, c0))
                continue
            if self.mode == "instruct":
                before = serialize_evidence(c0, s["qa"])
                after = serialize_evidence(c0, [*s["qa"], (e.item["question"], s.get("answer", ""))])
                states.append({"before": before, "after": after})
                requests += [(i, before), (i, after)]
                continue
            full, without = evidence_states(c0, s.get("qa", []))
            final = s.get("final", "")
            states.append({"c0": c0, "full": full, "without": without, "final": final})
            requests += [(i, c0), (i, full), (i, final)] + [(i, w) for w in without]
        judged = self.g2p(requests, episodes)
        return [self._score_one(i, e, st, judged) for i, (e, st) in enumerate(zip(episodes, states))]

    @staticmethod
    def _event_extras(episode: Episode) -> dict[str, float]:
        """With a manifest ``events`` list (the toy soundscapes): the clip's event count and the
        questions asked beyond it, so evaluation can see whether stopping tracks what a clip holds."""
        events = episode.item.get("events")
        if not isinstance(events, list):
            return {}
        asked = len(episode.state.get("qa", []))
        return {"events": float(len(events)), "extra_questions": float(max(0, asked - len(events)))}

    def _score_one(self, i: int, episode: Episode, st: dict[str, Any] | None, judged) -> Score:
        if st is None:
            return Score(float("nan"), {}, [None] * len(episode.actions), {"unlabelled": 1.0})
        if self.mode == "instruct":
            (r_before, _), (r_after, _) = judged[(i, st["before"])], judged[(i, st["after"])]
            utility = instruct_utility(r_before, r_after)  # Eq. 23
            return Score(utility, {"g2p_before": r_before, "g2p_after": r_after}, [utility])
        r0, acc0 = judged[(i, st["c0"])]
        if self.mode == "captioner":
            return Score(r0, {"g2p_c0": r0}, [captioner_utility(r0)], {"acc_c0": acc0})  # Eq. 22
        r_e, acc_e = judged[(i, st["full"])]
        r_f, acc_f = judged[(i, st["final"])]
        stopped = bool(episode.state.get("stopped"))
        u = composer_utilities(r0, r_e, [judged[(i, w)][0] for w in st["without"]], r_f, stopped, self.loop)
        questions = iter(u.questions)
        utilities: list[float | None] = []
        for action in episode.actions:
            if action.agent == CAPTIONER:
                utilities.append(None)  # the Captioner is frozen in game mode
            elif action.kind == "question":
                utilities.append(next(questions))
            elif action.kind == "stop":
                utilities.append(u.stop)
            elif action.kind == "final":
                utilities.append(u.final)
            else:
                utilities.append(None)  # Instruct answers are environment text for the Composer
        extras = {
            "questions": float(len(episode.state.get("qa", []))),
            **self._event_extras(episode),
            "forced": float(not stopped),
            "malformed": float(episode.state.get("malformed", 0)),
            "acc_c0": acc0,
            "acc_evidence": acc_e,
            "acc_final": acc_f,
            "retention_gap": acc_e - acc_f,
            "utility_final": u.final,
        }
        return Score(r_f, {"g2p_c0": r0, "g2p_evidence": r_e, "g2p_final": r_f}, utilities, extras)
