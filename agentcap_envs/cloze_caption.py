"""AudioMap: dense, time-aware audio captions scored by a frozen cloze examiner."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agentcap.core.env import CaptionEnv
from agentcap.core.episode import Episode, Score
from agentcap.core.manifests import (ManifestError, audio_id, audio_where, check_audio, check_duration, load_audio,
                                     resolve, warn_truncation)
from agentcap.judges.build import build_examiner, build_temporal_examiner
from agentcap.judges.pool import sharded as judges_sharded
from agentcap.judges.questions import BLANK, Question, question_bank, sentence_spans
from agentcap.rewards.base import weighted_sum
from agentcap.rewards.functional.cloze import (
    anchor_problem,
    event_count_reward,
    event_temporal_reward,
    evidence_sufficiency,
    length_ramp_reward,
)
from agentcap_envs.audio_qa import ANSWER_PROMPTS, BalancedQuestions, check_qa

PROMPTS = {
    "paper": (
        "Describe this audio in detail: speech content, speakers and prosody, sound events, music, "
        "acoustic scene, background noise, audio quality and how events relate. Give the start and end "
        "time of every event in seconds."
    ),
    "compact": "Describe every sound with its start and end time .",
}

#: The reward components, in the order they are logged; ``weights`` may name only these.
COMPONENTS = ("esr", "ectr", "length", "count")
#: How far (s) an anchor may pass the decoded clip end: rounding in hand-written timestamps.
ANCHOR_SLACK = 0.1


class ClozeCaptionEnv(CaptionEnv):
    """Dense, time-aware audio captioning with a cloze examiner (AudioMap).

    ## Description
    The policy hears a clip and writes a dense caption with timestamps. A frozen examiner that sees
    only the caption answers the clip's cloze questions (options A–D plus E = "Not given"), and a
    temporal examiner reads off the interval the caption gives each event anchor.

    ## Action
    Text: the caption.

    ## Observation
    ``{"agent": "policy", "messages": [instruction], "media": {"waveform": float32 [samples]}}`` at
    ``sample_rate``, mono.

    ## Rewards
    ``weights["esr"]``·ESR (+1 correct, −0.5 for E, −1 wrong, mean over the bank; Eq. 3)
    + ``weights["ectr"]``·ECTR (mean tIoU over anchors, null → 0; Eq. 5)
    + ``weights["length"]``·length + ``weights["count"]``·count (ours, not the paper's: timed clauses
    against the clip's events, so an invented event costs something; weight 0 unless named). The
    reward curriculum (Eq. 7: R(1) without ECTR, then R(2)) is two schedule stages with different
    ``weights``; the duration curriculum is a stage ``max_duration``. A weight left out counts 0; a
    weight naming no component is refused (a typo must not drop a term silently). An unlabelled item
    (``item_from_audio``: no cloze bank) has no reward: NaN, no components, utility ``None``,
    ``extras["unlabelled"] = 1``.

    ## Episode end
    After the single action.

    ## Arguments
    manifest: JSONL rows with ``id, audio, caption, cloze, anchors`` (``duration`` optional); ``cloze``
    and ``anchors`` must be non-empty (ESR and ECTR are means over them).
    examiner / temporal_examiner: ``rule`` (toy worlds only), a local HF causal-LM folder, or a
    served one ``{url: http://HOST:8000/v1, model: NAME}`` (one server can answer both).
    examiner_readout: ``letters`` (A–E next-token logits, the paper's examiner) or ``options``
    (scores each option's text; for small models that cannot follow a letter format).
    half_width: w, the widening of point timestamps. on_error: ``skip`` drops unusable rows (missing,
    empty or corrupt audio; bad cloze items) and counts them; more than ``max_skip_fraction`` stops.
    audio_check: ``header`` (each clip's header at load; decoded, and a truncated file or NaN / Inf
    samples refused naming the row, when the item is used) or ``decode`` (every clip decoded at
    load, so ``on_error: skip`` drops those too).
    demo_qa, demo_absent: question turns the warm start shows beside each gold caption, on the same
    audio: ``demo_qa`` questions about subjects the clip holds (from its ``qa`` pairs, gold answers),
    and questions about subjects it lacks (→ "The <subject> is not heard."), ``demo_absent`` of them
    per present one over the split, subject by subject, in the same question forms, so a question's
    words do not give its answer away (``agentcap_envs.audio_qa.BalancedQuestions``); drawn by the
    item's id. An Instruct warmed up from a base taught only to caption answers each sound by habit,
    not by the audio (docs/real.md); a base that also answered these starts it from an audio LM
    that answers, as the paper's Instruct starts. demo_caption: ``False`` drops the gold caption from
    the warm start, so its loss is the answers' alone (beside a caption, the answers' few tokens are a
    small share of it).
    credit: ``caption`` (the paper's GRPO: one advantage for the whole caption) or ``sentence`` (ours:
    the caption's advantage is redistributed over its sentences by each one's share of the reward,
    the reward minus that of the caption without it; see
    ``Score.text_credit`` and ``training.update.set_advantages``). One caption-level advantage carries
    every number a winning caption wrote, right or wrong (docs/real.md). It costs one more scoring of
    each caption per sentence, in the same batched examiner call. credit_terms: the reward components a
    sentence's share is made of (default: all of them). Length is a property of the whole caption:
    its leave-one-out share grows with a sentence's word count, so ``[esr, ectr, count]`` leaves it to
    the caption's advantage and shares that advantage by what each sentence's event earns.

    ## Version history
    v0: first version.
    """

    required_fields = {"id": str, "audio": str, "caption": str, "cloze": list, "anchors": list}
    scoring_fields = frozenset({"caption", "cloze", "anchors"})  # inference reads the audio alone
    check_settings = ("max_seconds", "audio_check")  # check_item decodes up to max_seconds, or reads the header
    max_actions = 1  # single step

    def __init__(
        self,
        manifest: str | None = None,
        items: Sequence[dict[str, Any]] | None = None,
        sample_rate: int = 16000,
        max_seconds: float | None = 30.0,
        prompt: Literal["paper", "compact"] = "paper",
        examiner: str | dict[str, Any] = "rule",
        temporal_examiner: str | dict[str, Any] = "rule",
        examiner_device: str = "cpu",
        examiner_readout: Literal["letters", "options"] = "letters",
        weights: Mapping[str, float] | None = None,
        half_width: float = 0.5,
        length_tolerance: float = 0.25,
        r_pos: float = 1.0,
        r_abs: float = -0.5,
        r_neg: float = -1.0,
        defer_scoring: bool = False,
        on_error: Literal["raise", "skip"] = "raise",
        max_skip_fraction: float = 0.1,
        audio_check: Literal["header", "decode"] = "header",
        demo_qa: int = 0,
        demo_absent: float = 0.0,
        demo_caption: bool = True,
        credit: Literal["caption", "sentence"] = "caption",
        credit_terms: Sequence[str] | None = None,
    ):
        self.sample_rate, self.max_seconds, self.audio_check = sample_rate, max_seconds, audio_check
        if not (isinstance(demo_qa, int) and not isinstance(demo_qa, bool) and demo_qa >= 0):
            raise ValueError(f"demo_qa must be an int >= 0, got {demo_qa!r}")
        if not (isinstance(demo_absent, (int, float)) and not isinstance(demo_absent, bool) and demo_absent >= 0):
            raise ValueError(f"demo_absent must be a number >= 0 (absent turns per present turn), got {demo_absent!r}")
        if demo_absent and not demo_qa:
            raise ValueError("demo_absent counts absent turns per present one; with demo_qa=0 there are none (set demo_qa >= 1)")
        if not demo_caption and not demo_qa:
            raise ValueError("demo_caption=False leaves the warm start only its question turns; with demo_qa=0 there are none (set demo_qa >= 1)")
        self.demo_qa, self.demo_absent, self.demo_caption = demo_qa, demo_absent, demo_caption
        self.credit = credit
        self.credit_terms = tuple(COMPONENTS if credit_terms is None else credit_terms)
        if credit_terms is not None and credit != "sentence":
            raise ValueError(f"credit_terms {credit_terms!r} make sentence shares; with credit={credit!r} there are none")
        if not self.credit_terms or isinstance(credit_terms, str) or set(self.credit_terms) - set(COMPONENTS):
            raise ValueError(f"credit_terms must name some of the reward components {list(COMPONENTS)}, "
                             f"got {credit_terms!r}")
        self._questions: BalancedQuestions | None = None
        super().__init__(
            manifest=manifest, items=items, defer_scoring=defer_scoring, on_error=on_error,
            max_skip_fraction=max_skip_fraction,
        )
        warn_truncation(self.items, max_seconds, type(self).__name__)
        self.prompt_style = prompt
        self.examiner_spec, self.temporal_spec, self.examiner_device = examiner, temporal_examiner, examiner_device
        self.examiner_readout = examiner_readout
        self.weights = dict(weights or {"esr": 1.0, "ectr": 1.0, "length": 0.1})
        unknown = sorted(set(self.weights) - set(COMPONENTS))
        if unknown:
            raise ValueError(f"weights name unknown reward components {unknown}; the components are {list(COMPONENTS)}")
        self.half_width, self.length_tolerance = half_width, length_tolerance
        self.answer_scores = {"r_pos": r_pos, "r_abs": r_abs, "r_neg": r_neg}
        self._examiner = None
        self._temporal = None

    def check_item(self, row: dict[str, Any], where: str) -> None:
        check_duration(row, where)
        # the header at load (a corrupt file fails here); decoded at use, or here with audio_check="decode"
        decode = self.audio_check == "decode"
        row.setdefault("duration", check_audio(row, "audio", where, self.max_seconds, decode=decode))
        if "caption" in row and not (isinstance(row["caption"], str) and row["caption"].strip()):
            raise ManifestError(f"{where}: field 'caption' (the gold caption) is empty")
        if "cloze" in row:
            self._check_cloze(row, where)
        if "anchors" in row:
            self._check_anchors(row, where)
        if self.demo_qa or self.demo_absent:
            check_qa(row, where)

    def _check_cloze(self, row: dict[str, Any], where: str) -> None:
        if not isinstance(row["cloze"], list):
            raise ManifestError(f"{where}: field 'cloze' must be a list, got {type(row['cloze']).__name__}")
        if not row["cloze"]:
            raise ManifestError(f"{where}: field 'cloze' is empty; every clip needs at least one question")
        row["_questions"] = [Question.from_row(q, f"{where}: cloze[{j}]") for j, q in enumerate(row["cloze"])]
        for j, question in enumerate(row["_questions"]):
            if not BLANK.search(question.passage):  # a cloze asks for the word in its blank (___)
                raise ManifestError(
                    f"{where}: cloze[{j}]: field 'passage' has no blank (three or more underscores), "
                    f"got {question.passage!r}"
                )

    def _check_anchors(self, row: dict[str, Any], where: str) -> None:
        if not isinstance(row["anchors"], list):
            raise ManifestError(f"{where}: field 'anchors' must be a list, got {type(row['anchors']).__name__}")
        if not row["anchors"]:
            raise ManifestError(f"{where}: field 'anchors' is empty; ECTR needs at least one event anchor")
        for j, anchor in enumerate(row["anchors"]):
            _check_anchor(anchor, f"{where}: anchors[{j}]")
            if anchor["start"] > row["duration"] + ANCHOR_SLACK or anchor["end"] > row["duration"] + ANCHOR_SLACK:
                raise ManifestError(
                    f"{where}: anchors[{j}]: event {anchor['event']!r} ({anchor['start']}–{anchor['end']} s) "
                    f"ends past the clip's end ({row['duration']:.3f} s)"
                )

    def item_from_audio(self, path: str) -> dict[str, Any]:
        """An unlabelled item for inference on a raw audio file."""
        # the id is the file's stem, as `agentcap data convert` names a clip (birds.wav → birds)
        row = {"id": audio_id(path), "audio": os.path.abspath(path), "caption": "", "cloze": [], "anchors": []}
        row["duration"] = check_audio(row, "audio", path, self.max_seconds)  # a missing, empty or undecodable file is named here
        return row

    # --- episode ------------------------------------------------------------------------------
    def begin(self, episode: Episode) -> dict[str, Any]:
        item = episode.item
        path = resolve(item["audio"], item.get("_manifest"))
        wave = load_audio(path, self.sample_rate, audio_where(item, "audio", path), self.max_seconds)
        return self.observation("policy", [{"role": "user", "content": PROMPTS[self.prompt_style]}], {"waveform": wave})

    def advance(self, episode: Episode, action: str) -> None:
        self.record(episode, "policy", "caption", action)
        return None

    def demonstrations(self, item: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """The gold caption (unless ``demo_caption`` is off), then the ``demo_qa`` and ``demo_absent``
        question turns on the same audio."""
        observation = self.begin(Episode(item=dict(item)))
        demos = [(observation, item["caption"])] if self.demo_caption else []
        if not (self.demo_qa or self.demo_absent):
            return demos
        if self._questions is None:
            self._questions = BalancedQuestions(self.items, self.demo_qa, self.demo_absent)
        pairs = self._questions.turns(item)
        return demos + [(self.question_obs(item, question, observation["media"]), target) for question, target in pairs]

    def question_obs(self, item: Mapping[str, Any], question: str, media: Mapping[str, Any] | None = None):
        """The policy asked one question about the clip (the warm start's question turns, and
        ``tools/instruct_probe.py`` on an AudioMap run); ``media``: the clip's, when already loaded."""
        if media is None:
            media = self.begin(Episode(item=dict(item)))["media"]
        text = f"Question : {question}\n{ANSWER_PROMPTS[self.prompt_style]}"
        return self.observation("policy", [{"role": "user", "content": text}], media)

    # --- scoring ------------------------------------------------------------------------------
    @property
    def examiner(self):
        if self._examiner is None:
            self._examiner = build_examiner(self.examiner_spec, self.examiner_device, self.examiner_readout)
        return self._examiner

    @property
    def temporal(self):
        if self._temporal is None:
            self._temporal = build_temporal_examiner(self.temporal_spec, self.half_width, self.examiner_device)
        return self._temporal

    def score(self, episodes: Sequence[Episode]) -> list[Score]:
        scores: list[Score | None] = [None] * len(episodes)
        labelled = []
        for i, e in enumerate(episodes):
            if question_bank(e.item):
                labelled.append(i)
            else:  # inference on a raw audio file: no gold, nothing to score
                scores[i] = Score(math.nan, {}, [None] * len(e.actions), {"unlabelled": 1.0})
        if labelled or judges_sharded():  # a sharded judge's call is a collective: asked even with none
            batch = [episodes[i] for i in labelled]
            captions = [e.actions[-1].text if e.actions else "" for e in batch]
            parts, total = self._rewards(captions, [e.item for e in batch])
            credit = self._sentence_credit(captions, [e.item for e in batch], parts) \
                if self.credit == "sentence" else [None] * len(batch)
            for row, i in enumerate(labelled):
                scores[i] = Score(
                    reward=float(total[row]),
                    components={k: float(v[row]) for k, v in parts.items()},
                    utilities=[float(total[row])],
                    text_credit=[credit[row]],
                )
        return scores  # type: ignore[return-value]

    def _rewards(self, captions: Sequence[str], items: Sequence[Mapping[str, Any]]):
        """Each caption's components and weighted reward, against its item's bank, anchors and gold."""
        parts = {
            "esr": evidence_sufficiency(captions, [question_bank(i) for i in items], self.examiner, **self.answer_scores),
            "ectr": event_temporal_reward(captions, [i["anchors"] for i in items], self.temporal),
            "length": length_ramp_reward(captions, [i["caption"] for i in items], self.length_tolerance),
            "count": event_count_reward(captions, [i["anchors"] for i in items]),
        }
        return parts, self._weighted(parts)

    def _weighted(self, parts: Mapping[str, Any], terms: Sequence[str] = COMPONENTS):
        return weighted_sum(parts, {k: float(self.weights.get(k, 0.0)) if k in terms else 0.0 for k in COMPONENTS})

    def _sentence_credit(
        self, captions: Sequence[str], items: Sequence[Mapping[str, Any]], parts: Mapping[str, Any]
    ) -> list[list[tuple[int, float]] | None]:
        """Each sentence's share of its caption's reward (its ``credit_terms``): that reward minus the
        caption's without the sentence (leave one out), so a sentence whose event the examiner gets
        wrong is charged, and the right ones beside it are not. One batched scoring of every caption
        with one sentence removed; a sentence's piece runs to the next one's start."""
        totals = self._weighted(parts, self.credit_terms).tolist()
        variants, owners, pieces = [], [], []
        for row, caption in enumerate(captions):
            spans = sentence_spans(caption)  # none in an empty caption: its one token keeps the caption's advantage
            starts = [0] + [start for start, _ in spans[1:]] if spans else []
            ends = [start for start, _ in spans[1:]] + [len(caption)] if spans else []
            pieces.append(ends)
            for start, end in zip(starts, ends):
                variants.append((caption[:start] + caption[end:]).strip())
                owners.append(row)
        # a sharded judge's call is a collective: asked even with no variant here
        without = self._weighted(self._rewards(variants, [items[row] for row in owners])[0], self.credit_terms) \
            if variants or judges_sharded() else []
        shares: list[list[float]] = [[] for _ in captions]
        for row, reward in zip(owners, [float(r) for r in without]):
            shares[row].append(totals[row] - reward)
        return [list(zip(ends, share)) if ends else None for ends, share in zip(pieces, shares)]


def _check_anchor(anchor: Any, where: str) -> None:
    """An ECTR anchor ``{"event": str, "start": s, "end": e}`` with 0 ≤ s ≤ e (AudioMap Eq. 4–5)."""
    problem = anchor_problem(anchor)
    if problem is not None:
        raise ManifestError(f"{where}: {problem}")
