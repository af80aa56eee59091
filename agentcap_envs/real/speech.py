"""Build the real-speech world for AudioMap and ACE-Cap from real recordings, offline and deterministic.

The toy soundscapes (:mod:`agentcap_envs.toy.soundscapes`) synthesise every sound; this world mixes
real ones and keeps the same manifest schema, so ``agentcap/ClozeCaption-v0``,
``agentcap/EvidenceGame-v0`` and ``agentcap evaluate --benchmark`` read it unchanged:

* speech: Debian's ``asterisk-core-sounds-en-wav`` voice prompts (a woman, Allison Smith,
  CC-BY-SA-3.0) with their transcripts from ``asterisk-core-sounds-en``; kept are prompts whose
  transcript is one plain sentence of 2+ words (no digits, symbols or bracketed descriptions) and whose speech,
  silence trimmed, lasts ``--min-speech``–``--max-speech`` s;
* effects: six sounds of ``sound-theme-freedesktop`` (CC-BY-3.0 / CC-BY-SA-3.0, see ``EFFECTS``);
* each clip (16 kHz mono 16-bit WAV, at most ``--max-duration`` s) holds 1-2 utterances and 0-2
  effects, non-overlapping, in a seeded order at seeded onsets on a 0.1 s grid, each levelled to a
  seeded loudness around -20 dBFS over a -60 dBFS noise floor. Sources are resampled with a
  polyphase filter (``scipy.signal.resample_poly``), effects mixed to mono first;
* the event list (``events``: type, label, onset, offset, transcript, source) is exact: an event's
  span is the source's sound with its silences trimmed (40 dB under its loudest 10 ms frame,
  20 ms kept on either side), padded to the 0.1 s grid;
* splits are by recording: prompts with the same transcript form one group and each group belongs
  to one split (``--val-fraction`` / ``--test-fraction`` of the groups), so no recording and no
  sentence is heard in two splits; effects are sound classes and are shared;
* gold text is derived from the event list, no language model: the dense caption is one sentence
  per event in time order quoting the transcript (``From 0.4 s to 2.1 s, a woman says "Please
  hold".``), the short caption (the Captioner's draft) names the sounds only; cloze items blank a
  spoken word, an onset or an effect's name, or ask which sound follows the speech; MCQ items ask
  which word or sentence was said (and which first), which sound, which sound after the speech,
  and when; options A-D come from the clip (gold) and from other transcripts / effects / times
  that the clip's texts never contain, E is "Not given" and never gold; QA pairs per event warm up
  the Composer and Instruct roles; ``benchmark.jsonl`` holds differently worded 2-4 choice
  questions about the test clips in the MMAU / MMAR / MMSU benchmark schema.

Re-running with the same arguments and assets writes byte-identical files.

    python tools/make_real_speech.py --out data/real_speech --seed 0
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from agentcap.judges.temporal import content_words  # the temporal rule examiner's reading of an anchor
from agentcap_envs.real import assets
from agentcap_envs.toy.soundscapes import row_texts, write_jsonl  # the same manifest schema

SAMPLE_RATE = 16_000
GRID = 0.1  # s: onsets, offsets and durations are multiples of it
NOT_GIVEN = "Not given"
LETTERS = "ABCDE"
NOISE_FLOOR = 0.001  # -60 dBFS: no digital silence between events
SPEECH_DBFS, EFFECT_DBFS = -20.0, -22.0
TRIM_DB, TRIM_PAD = 40.0, 0.02
SPLIT_STREAMS = {"train": 1, "val": 2, "test": 3}
GROUP_STREAM, BENCHMARK_STREAM = 7, 4
SPEAKER = "woman"
#: The fixed wording of ACE-Cap's serialised evidence state (agentcap's serialize_evidence).
EVIDENCE_WORDS = ("Evidence about the audio. Only the initial caption and the answers state facts; the questions "
                  "were only asked and are not evidence. Initial caption: Question asked (not evidence): Answer:")
ONSET, NAME = "<onset>", "<name>"  # what Placed.sentence may blank besides a spoken word


@dataclass(frozen=True)
class Effect:
    """A sound effect of the freedesktop theme: file, the name the captions use, its sentence."""

    key: str
    file: str
    name: str
    template: str  # "{a} {name} rings": {a} is the article ("a" / "an" / "")
    article: str
    license: str
    max_seconds: float = 2.5

    def sentence_body(self, name: str | None = None) -> str:
        a = "a" if name == "___" and self.article else self.article
        return self.template.format(a=a, name=name or self.name).strip()


EFFECTS: tuple[Effect, ...] = (
    Effect("alarm", "alarm-clock-elapsed.oga", "alarm clock", "{a} {name} rings", "an", "CC-BY-SA-3.0 (Tim/corsica_s)", 2.0),
    Effect("bell", "bell.oga", "bell", "{a} {name} dings", "a", "CC-BY-3.0 (Dr. Richard Boulanger et al)"),
    Effect("chime", "complete.oga", "chime", "{a} {name} plays", "a", "CC-BY-3.0 (Dr. Richard Boulanger et al)"),
    Effect("paper", "trash-empty.oga", "paper", "{a} {name} rustles", "", "CC-BY-3.0 (Dr. Richard Boulanger et al)"),
    Effect("shutter", "camera-shutter.oga", "camera shutter", "{a} {name} clicks", "a",
           "CC-BY-SA-3.0 (freesound user horsthorstensen)"),
    Effect("error", "suspend-error.oga", "error tone", "{a} {name} sounds", "an", "CC-BY-SA-3.0 (Red Hat, Inc.)"),
)
SPEECH_LICENSE = "CC-BY-SA-3.0 (recorded by Allison Smith, Digium, Inc.; Debian asterisk-core-sounds-en-wav)"

# Words a blank may not take (too little to hear or to tell apart). Anchors' content words come from
# the temporal examiner (agentcap.judges.temporal.content_words), so their overlap is computed its way.
_FUNCTION = frozenset(
    "the and you your for are was were has have had not but can will with this that that's from into "
    "our any all may please".split()
)
_SENTENCE_BREAK = re.compile(r"[.!?;:]\s+\S")
_ALLOWED = re.compile(r"^[A-Za-z][A-Za-z ',-]*$")


class WorldError(ValueError):
    """The world cannot be built as asked; the message is one line."""


# --- text helpers -------------------------------------------------------------------------------
def clean_transcript(text: str) -> str | None:
    """The transcript as quoted in captions (no leading/trailing ellipsis or end punctuation, a
    capital first letter, "i" as "I"), or None when it is not one plain sentence."""
    t = re.sub(r"\s+", " ", text).strip()
    t = re.sub(r"^\.+\s*", "", t)
    t = re.sub(r"[\s.!?]+$", "", t)
    if not t or _SENTENCE_BREAK.search(t) or not _ALLOWED.match(t) or "--" in t:
        return None
    t = re.sub(r"\bi\b", "I", t)
    return t[0].upper() + t[1:]


def blankable(text: str) -> list[str]:
    """Words of ``text`` a cloze may blank: letters only, 3+ long, not a function word; first-seen order."""
    words = [w for w in re.findall(r"(?<![\w'-])[A-Za-z]+(?![\w'-])", text)]
    return list(dict.fromkeys(w.lower() for w in words if len(w) >= 3 and w.lower() not in _FUNCTION))


def _phrase(text: str) -> re.Pattern[str]:
    """A whole-word (plural allowed) case-insensitive match, as the rule examiners search options."""
    words = r"\s+".join(re.escape(w) for w in text.split())
    return re.compile(rf"(?<![\w-]){words}(?:e?s)?(?![\w-])", re.IGNORECASE)


def absent(option: str, texts: Sequence[str]) -> bool:
    """True when ``option`` occurs (as whole words) in none of ``texts``."""
    pattern = _phrase(option)
    return not any(pattern.search(t) for t in texts)


def seconds(t: float) -> str:
    return f"{t:.1f} s"


# --- audio helpers ------------------------------------------------------------------------------
def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def decode(path: Path, what: str) -> tuple[np.ndarray, int]:
    """Float64 mono samples and rate; a missing, empty or undecodable file raises a one-line
    :class:`assets.AssetError` naming ``what`` and the path."""
    if not path.is_file():
        raise assets.AssetError(f"{what} ({path}): file not found")
    if path.stat().st_size == 0:
        raise assets.AssetError(f"{what} ({path}): file is empty (0 bytes)")
    try:
        samples, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    except Exception as error:  # libsndfile raises its own error types
        raise assets.AssetError(f"{what} ({path}): cannot decode ({_one_line(error)})") from None
    if samples.shape[0] == 0:
        raise assets.AssetError(f"{what} ({path}): no samples")
    return samples.mean(axis=1), int(rate)


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Polyphase resampling (Kaiser-windowed FIR anti-aliasing filter)."""
    if rate == target:
        return samples.astype(np.float64)
    from scipy.signal import resample_poly

    g = math.gcd(rate, target)
    return resample_poly(samples, target // g, rate // g).astype(np.float64)


def trim(samples: np.ndarray, rate: int = SAMPLE_RATE, max_seconds: float | None = None) -> np.ndarray:
    """The sound without its leading / trailing silence (frames 40 dB under the loudest 10 ms frame),
    20 ms kept each side, cut to ``max_seconds`` (with a 50 ms fade) and padded to the 0.1 s grid."""
    hop = rate // 100
    frames = len(samples) // hop
    if frames == 0:
        return np.zeros(int(rate * GRID))
    rms = np.sqrt(np.mean(samples[: frames * hop].reshape(frames, hop) ** 2, axis=1))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-TRIM_DB / 20))
    pad = int(TRIM_PAD * rate)
    start = max(0, loud[0] * hop - pad)
    end = min(len(samples), (loud[-1] + 1) * hop + pad)
    if max_seconds is not None and end - start > max_seconds * rate:
        end = start + int(max_seconds * rate)
        fade = int(0.05 * rate)
        out = samples[start:end].copy()
        out[-fade:] *= np.linspace(1.0, 0.0, fade)
    else:
        out = samples[start:end].copy()
    step = int(round(GRID * rate))
    length = -(-len(out) // step) * step
    return np.pad(out, (0, length - len(out)))


def active_rms(samples: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    """RMS over the 10 ms frames within 40 dB of the loudest (pauses inside speech left out)."""
    hop = rate // 100
    frames = max(1, len(samples) // hop)
    block = np.pad(samples, (0, max(0, frames * hop - len(samples))))[: frames * hop].reshape(frames, hop)
    rms = np.sqrt(np.mean(block ** 2, axis=1))
    keep = rms > rms.max() * 10 ** (-TRIM_DB / 20)
    return float(np.sqrt(np.mean(block[keep] ** 2))) if keep.any() else 0.0


@dataclass(frozen=True)
class Source:
    """One trimmed source at 16 kHz: a recording (``kind="speech"``) or an effect."""

    kind: str
    key: str  # recording name ("vm-goodbye", "digits/1") or effect key
    text: str | None  # cleaned transcript (speech)
    samples: np.ndarray

    @property
    def seconds(self) -> float:
        return round(len(self.samples) / SAMPLE_RATE, 1)


def load_recordings(folder: Path, transcripts: dict[str, str], min_speech: float,
                    max_speech: float) -> list[Source]:
    """Every usable prompt under ``folder``, in name order: a transcript that is one plain sentence
    of 2+ words with one to blank, and trimmed speech within [min_speech, max_speech] s. A WAV listed in the
    folder that cannot be read raises a one-line error naming it (a transcript without a WAV, like
    the package's own ``pls-try-call-later``, is skipped)."""
    if not folder.is_dir():
        raise assets.AssetError(f"recordings folder {folder} does not exist")
    names = sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.wav"))
    if not names:
        raise assets.AssetError(f"recordings folder {folder} holds no .wav files; {assets._fix(assets.SPEECH_PACKAGE)}")
    out = []
    for name in names:
        if name.split("/")[0] == "silence" or name not in transcripts:
            continue
        text = clean_transcript(transcripts[name])
        if text is None or len(text.split()) < 2 or not blankable(text):
            continue
        samples, rate = decode(folder / f"{name}.wav", f"recording {name!r}")
        samples = trim(resample(samples, rate))
        if min_speech <= len(samples) / SAMPLE_RATE <= max_speech:
            out.append(Source("speech", name, text, samples))
    return out


def load_effects(folder: Path) -> dict[str, Source]:
    out = {}
    for effect in EFFECTS:
        samples, rate = decode(folder / effect.file, f"sound effect {effect.key!r}")
        out[effect.key] = Source("effect", effect.key, None, trim(resample(samples, rate), max_seconds=effect.max_seconds))
    return out


# --- splits -------------------------------------------------------------------------------------
def split_recordings(recordings: Sequence[Source], seed: int, val_fraction: float,
                     test_fraction: float) -> dict[str, list[Source]]:
    """Recordings by split; recordings sharing a transcript (case-insensitive) share a split."""
    groups: dict[str, list[Source]] = {}
    for source in recordings:
        groups.setdefault(source.text.lower(), []).append(source)
    keys = sorted(groups)
    order = [keys[i] for i in np.random.default_rng([seed, GROUP_STREAM]).permutation(len(keys))]
    n_test = max(1, int(round(test_fraction * len(keys)))) if test_fraction > 0 else 0
    n_val = max(1, int(round(val_fraction * len(keys)))) if val_fraction > 0 else 0
    if n_test + n_val >= len(keys):
        raise WorldError(f"only {len(keys)} distinct sentences: too few for --val-fraction {val_fraction} "
                         f"and --test-fraction {test_fraction}")
    parts = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
    return {split: sorted((s for k in ks for s in groups[k]), key=lambda s: s.key) for split, ks in parts.items()}


# --- one clip -----------------------------------------------------------------------------------
@dataclass
class Placed:
    source: Source
    onset: float
    offset: float
    effect: Effect | None = None

    @property
    def label(self) -> str:
        return "speech" if self.effect is None else self.effect.name

    def sentence(self, blank: str | None = None) -> str:
        """The caption sentence; ``blank``: ``ONSET``, ``NAME`` (the effect's) or a spoken word replaced by ``___``."""
        start = "___" if blank == ONSET else seconds(self.onset)
        head = f"From {start} to {seconds(self.offset)}, "
        if self.effect is None:
            text = self.source.text
            if blank not in (None, ONSET, NAME):
                text = _phrase_once(blank).sub("___", text, count=1)
            return f'{head}a {SPEAKER} says "{text}".'
        return f"{head}{self.effect.sentence_body('___' if blank == NAME else None)}."

    def anchor(self) -> str:
        """The ECTR anchor: the words that tell this event apart from the clip's others."""
        if self.effect is None:
            return f'a {SPEAKER} says "{self.source.text}"'
        return f"the {self.effect.name}"


def _phrase_once(word: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])", re.IGNORECASE)


def _distinct(a: str, b: str) -> bool:
    """Two utterances an anchor can tell apart: each has a content word the other lacks."""
    ca, cb = content_words(a), content_words(b)
    return bool(ca - cb) and bool(cb - ca) and a.lower() != b.lower()


def _effect_fits(effect: Effect, texts: Sequence[str]) -> bool:
    return all(absent(word, texts) for word in effect.name.split())


def layout(rng: np.random.Generator, pool: Sequence[Source], effects: dict[str, Source],
           max_duration: float) -> tuple[list[Placed], float]:
    """1-2 utterances and 0-2 effects in a seeded order, 0.2-1.0 s apart, within ``max_duration``."""
    for _ in range(100):
        chosen = [pool[int(rng.integers(len(pool)))]]
        if rng.random() < 0.5:
            second = pool[int(rng.integers(len(pool)))]
            if second.key != chosen[0].key and _distinct(chosen[0].text, second.text):
                chosen.append(second)
        texts = [s.text for s in chosen]
        fitting = [e for e in EFFECTS if _effect_fits(e, texts)]
        n_fx = min(int(rng.integers(3)), len(fitting))
        fx = [fitting[i] for i in sorted(rng.choice(len(fitting), size=n_fx, replace=False))] if n_fx else []
        items: list[tuple[Source, Effect | None]] = [(s, None) for s in chosen] + [(effects[e.key], e) for e in fx]
        tenths = [int(round(s.seconds * 10)) for s, _ in items]
        minimum = sum(tenths) + 2 * (len(items) + 1)
        if minimum <= int(round(max_duration * 10)):
            break
    else:
        raise WorldError(f"no clip fits in --max-duration {max_duration} s; raise it or lower --max-speech")
    items = [items[i] for i in rng.permutation(len(items))]
    tenths = [int(round(s.seconds * 10)) for s, _ in items]
    room = int(round(max_duration * 10)) - minimum
    extra = int(rng.integers(0, min(room, 8 * (len(items) + 1)) + 1))
    gaps = 2 + rng.multinomial(extra, rng.dirichlet(np.ones(len(items) + 1)))
    placed, cursor = [], int(gaps[0])
    for (source, effect), length, gap in zip(items, tenths, gaps[1:]):
        placed.append(Placed(source, cursor / 10, (cursor + length) / 10, effect))
        cursor += length + int(gap)
    return placed, cursor / 10


def render(placed: Sequence[Placed], duration: float, rng: np.random.Generator) -> np.ndarray:
    """The clip as int16 samples: each source at its onset, levelled, over a faint noise floor."""
    total = int(round(duration * SAMPLE_RATE))
    audio = rng.normal(0.0, NOISE_FLOOR, size=total)
    for event in placed:
        level = SPEECH_DBFS if event.effect is None else EFFECT_DBFS
        target = 10 ** ((level + rng.uniform(-3.0, 3.0)) / 20)
        wave = event.source.samples * (target / max(active_rms(event.source.samples), 1e-9))
        peak = np.max(np.abs(wave))
        if peak > 0.9:
            wave *= 0.9 / peak
        begin = int(round(event.onset * SAMPLE_RATE))
        audio[begin:begin + len(wave)] += wave
    return np.round(np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)


# --- gold text ----------------------------------------------------------------------------------
ORDINALS = ("first", "second", "third", "fourth")


def short_caption(placed: Sequence[Placed]) -> str:
    """The Captioner's coarse draft: which sounds in order, no words, no times."""
    parts = [f"a {SPEAKER} speaks" if p.effect is None else p.effect.sentence_body() for p in placed]
    text = ", then ".join(parts)
    return text[0].upper() + text[1:] + "."


def _options(rng: np.random.Generator, gold: str, pool: Sequence[str], texts: Sequence[str],
             k: int = 4) -> tuple[list[str], int] | None:
    """``k`` options: gold and ``k - 1`` of ``pool`` that no clip text contains (seeded draw and
    order); returns (options, gold index), or None when the pool is too small."""
    seen, chosen = {gold.lower()}, []
    for index in rng.permutation(len(pool)):  # a seeded scan: the first k - 1 usable ones
        item = pool[int(index)]
        if item.lower() not in seen and absent(item, texts):
            seen.add(item.lower())
            chosen.append(item)
            if len(chosen) == k - 1:
                break
    else:
        return None
    order = [[gold, *chosen][i] for i in rng.permutation(k)]
    return order, order.index(gold)


def _item(passage: str, picked: tuple[list[str], int], meta: dict[str, Any]) -> dict[str, Any]:
    options, gold = picked
    return {"passage": passage, "options": [*options, NOT_GIVEN], "answer": LETTERS[gold], "meta": meta}


def _times(duration: float, gold: float) -> list[str]:
    return [seconds(t / 10) for t in range(int(round(duration * 10)) + 1) if abs(t / 10 - gold) >= 0.5 - 1e-9]


def gold_banks(placed: Sequence[Placed], duration: float, rng: np.random.Generator,
               words: Sequence[str], sentences: Sequence[str]) -> dict[str, Any]:
    """Caption, short caption, cloze (ESR), MCQ (G2P), QA (warm-up) and anchors (ECTR) of one clip.

    ``words`` / ``sentences``: the split's vocabulary and transcripts, the distractor pools."""
    caption = " ".join(p.sentence() for p in placed)
    short = short_caption(placed)
    speech = [i for i, p in enumerate(placed) if p.effect is None]
    two = len(speech) > 1
    qa: list[dict[str, Any]] = []
    for i, p in enumerate(placed):
        if p.effect is None:
            nth = f" {ORDINALS[speech.index(i)]}" if two else ""
            pairs = (
                ("words", f"What does the {SPEAKER} say{nth}?", f'The {SPEAKER} says "{p.source.text}".'),
                ("time", f"When does the {SPEAKER} speak{nth}?",
                 f"The {SPEAKER} speaks from {seconds(p.onset)} to {seconds(p.offset)}."),
                ("event", f"What happens when the {SPEAKER} speaks{nth}?", p.sentence()),
            )
            subject = SPEAKER
        else:
            name = p.effect.name
            pairs = (
                ("time", f"When is the {name} heard?", f"The {name} is heard from {seconds(p.onset)} to {seconds(p.offset)}."),
                ("event", f"What happens with the {name}?", p.sentence()),
            )
            subject = name
        qa += [{"question": q, "answer": a, "meta": {"event": i, "subject": subject, "attribute": attr}}
               for attr, q, a in pairs]
    # the texts a distractor must avoid: everything the clip's gold says, and the words ACE-Cap's
    # serialised evidence wraps it in (an option "answer" would be found in "Answer: ...")
    texts = [caption, short, *(pair["answer"] for pair in qa), EVIDENCE_WORDS]
    effect_names = [e.name for e in EFFECTS]
    cloze: list[dict[str, Any]] = []
    mcq: list[dict[str, Any]] = []

    def add(bank: list, passage: str, gold: str, pool: Sequence[str], meta: dict[str, Any]) -> None:
        picked = _options(rng, gold, pool, texts)
        if picked is not None:
            bank.append(_item(passage, picked, meta))

    for i, p in enumerate(placed):
        if p.effect is None:
            meta = {"event": i, "subject": SPEAKER}
            nth = f" {ORDINALS[speech.index(i)]}" if two else ""
            candidates = blankable(p.source.text)
            picks = [candidates[j] for j in sorted(rng.choice(len(candidates), size=min(2, len(candidates)), replace=False))]
            for word in picks:
                add(cloze, p.sentence(blank=word), word, words, {**meta, "attribute": "word"})
            add(cloze, p.sentence(blank=ONSET), seconds(p.onset), _times(duration, p.onset), {**meta, "attribute": "onset"})
            word = picks[int(rng.integers(len(picks)))]
            add(mcq, f"Which of these words does the {SPEAKER} say{nth}?", word, words, {**meta, "attribute": "word"})
            add(mcq, f"What does the {SPEAKER} say{nth}?", p.source.text, sentences, {**meta, "attribute": "sentence"})
            add(mcq, f'When does the {SPEAKER} begin to say "{p.source.text}"?', seconds(p.onset),
                _times(duration, p.onset), {**meta, "attribute": "onset"})
        else:
            name = p.effect.name
            meta = {"event": i, "subject": name}
            add(cloze, p.sentence(blank=NAME), name, effect_names, {**meta, "attribute": "name"})
            add(cloze, p.sentence(blank=ONSET), seconds(p.onset), _times(duration, p.onset), {**meta, "attribute": "onset"})
            add(mcq, f"Which sound is heard from {seconds(p.onset)} to {seconds(p.offset)}?", name, effect_names,
                {**meta, "attribute": "name"})
            add(mcq, f"When does the {name} begin?", seconds(p.onset), _times(duration, p.onset), {**meta, "attribute": "onset"})
    # order: the first effect after the first utterance
    after = [j for j in range(speech[0] + 1, len(placed)) if placed[j].effect is not None]
    if after:
        j = after[0]
        meta = {"event": j, "subject": placed[j].effect.name, "attribute": "order"}
        quote = placed[speech[0]].source.text
        add(cloze, f'After the {SPEAKER} says "{quote}", ___ is the next sound effect.', placed[j].effect.name,
            effect_names, meta)
        add(mcq, f'Which sound effect follows the {SPEAKER} saying "{quote}"?', placed[j].effect.name,
            effect_names, dict(meta))
    anchors = [{"event": p.anchor(), "start": p.onset, "end": p.offset} for p in placed]
    return {"caption": caption, "short_caption": short, "cloze": cloze, "mcq": mcq, "qa": qa, "anchors": anchors}


# --- held-out benchmark ------------------------------------------------------------------------
def _pick(rng: np.random.Generator, gold: str, others: Sequence[str], k: int,
          texts: Sequence[str] = ()) -> tuple[list[str], str]:
    """``k`` choices (fewer when ``others`` runs out): gold and others that no ``texts`` contain."""
    seen, chosen = {gold.lower()}, []
    for index in rng.permutation(len(others)):
        item = others[int(index)]
        if len(chosen) < k - 1 and item.lower() not in seen and (not texts or absent(item, texts)):
            seen.add(item.lower())
            chosen.append(item)
    k = len(chosen) + 1
    choices = [[gold, *chosen][i] for i in rng.permutation(k)]
    return choices, "ABCDEFGHIJ"[choices.index(gold)]


def _describe(p: Placed) -> str:
    return f'the speaker saying "{p.source.text}"' if p.effect is None else f"the {p.effect.name}"


def benchmark_questions(row: dict[str, Any], rng: np.random.Generator, words: Sequence[str],
                        sentences: Sequence[str]) -> list[dict[str, Any]]:
    """Questions about one test clip in the benchmark manifest schema (MMAU / MMAR / MMSU after
    ``agentcap data convert``): speech content (sentence, word), sound events (which, how many),
    temporal order (which first / later, what follows the speech) and onset. Worded unlike the
    training banks, 2-4 choices, no "Not given"."""
    events = row["events"]
    speech = [e for e in events if e["type"] == "speech"]
    effects = [e for e in events if e["type"] == "effect"]
    spoken = " ".join(e["transcript"] for e in speech)
    texts = [spoken]
    out: list[tuple[str, str, str, str, list[str], str]] = []

    e = speech[int(rng.integers(len(speech)))]
    where = "" if len(speech) == 1 else (" first" if e is speech[0] else " last")
    choices, answer = _pick(rng, e["transcript"], sentences, 4, texts)
    out.append(("speech content", "information extraction", "sentence",
                f"Which sentence does the speaker say{where}?", choices, answer))

    heard = blankable(spoken)
    word = heard[int(rng.integers(len(heard)))]
    choices, answer = _pick(rng, word, words, 4, texts)
    out.append(("speech content", "information extraction", "word", "Which word is spoken in the recording?",
                choices, answer))

    counts = ["none", "one", "two"]
    choices, answer = _pick(rng, counts[len(effects)], counts, 3)
    out.append(("sound events", "counting", "effect count",
                "Apart from the voice, how many sound effects can be heard?", choices, answer))

    if effects:
        e = effects[int(rng.integers(len(effects)))]
        names = [x.name for x in EFFECTS if x.name not in {f["label"] for f in effects}]
        choices, answer = _pick(rng, e["label"], names, 4)
        out.append(("sound events", "sound identification", "effect", "Which of these sounds can be heard?",
                    choices, answer))

    placed = [Placed(Source(e["type"], e["source"], e["transcript"], np.zeros(0)), e["onset"], e["offset"],
                     None if e["type"] == "speech" else next(x for x in EFFECTS if x.name == e["label"]))
              for e in events]
    if len(placed) > 1:
        i, j = sorted(int(x) for x in rng.choice(len(placed), size=2, replace=False))
        earlier = bool(rng.integers(2))
        gold, other = (placed[i], placed[j]) if earlier else (placed[j], placed[i])
        choices, answer = _pick(rng, _describe(gold), [_describe(other)], 2)
        word = "first" if earlier else "later"
        out.append(("temporal order", "temporal reasoning", "order", f"Which comes {word}?", choices, answer))
        s = next(k for k, p in enumerate(placed) if p.effect is None)
        following = [p for p in placed[s + 1:] if p.effect is not None]
        if following:
            names = [x.name for x in EFFECTS if x.name != following[0].effect.name]
            choices, answer = _pick(rng, following[0].effect.name, names, 4)
            out.append(("temporal order", "temporal reasoning", "next",
                        f'Which sound effect is the first one after "{placed[s].source.text}" is said?',
                        choices, answer))

    p = placed[int(rng.integers(len(placed)))]
    what = "the speaker start saying " + f'"{p.source.text}"' if p.effect is None else f"the {p.effect.name} start"
    choices, answer = _pick(rng, seconds(p.onset), _times(row["duration"], p.onset), 4)
    out.append(("temporal order", "temporal localisation", "onset", f"At about what time does {what}?",
                choices, answer))

    return [
        {"id": f"{row['id']}-q{q}", "audio": row["audio"], "question": question, "choices": choices,
         "answer": answer, "answer_text": choices["ABCDEFGHIJ".index(answer)], "benchmark": "real-speech",
         "task": task, "category": category, "subcategory": subcategory, "layer": None, "duration": row["duration"]}
        for q, (category, task, subcategory, question, choices, answer) in enumerate(out)
    ]


def make_clip(clip_id: str, rng: np.random.Generator, pool: Sequence[Source], effects: dict[str, Source],
              max_duration: float, words: Sequence[str], sentences: Sequence[str]) -> tuple[dict[str, Any], np.ndarray]:
    placed, duration = layout(rng, pool, effects, max_duration)
    samples = render(placed, duration, rng)
    gold = gold_banks(placed, duration, rng, words, sentences)
    row = {
        "id": clip_id,
        "audio": f"audio/{clip_id}.wav",
        "duration": duration,
        "caption": gold["caption"],
        "short_caption": gold["short_caption"],
        "events": [
            {"type": "speech" if p.effect is None else "effect", "label": p.label, "onset": p.onset,
             "offset": p.offset, "transcript": p.source.text, "source": p.source.key if p.effect is None else p.effect.file}
            for p in placed
        ],
        "cloze": gold["cloze"],
        "mcq": gold["mcq"],
        "qa": gold["qa"],
        "anchors": gold["anchors"],
    }
    return row, samples


def attribution(splits: dict[str, list[Source]]) -> str:
    lines = [
        "Sources of the audio in this folder (mixed clips are adaptations under the same licences).",
        f"Speech: Asterisk core sound prompts, {SPEECH_LICENSE}; https://www.asterisk.org",
        "Sound effects: freedesktop.org sound theme (Debian sound-theme-freedesktop):",
        *(f"  {e.file} ({e.name}): {e.license}" for e in EFFECTS),
        "Licences: https://creativecommons.org/licenses/by-sa/3.0/ and https://creativecommons.org/licenses/by/3.0/",
        "",
        "Recordings per split:",
        *(f"  {split}: {' '.join(s.key for s in sources)}" for split, sources in splits.items()),
    ]
    return "\n".join(lines) + "\n"


# --- command line -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=400, help="training clips")
    parser.add_argument("--val", type=int, default=40, help="validation clips")
    parser.add_argument("--test", type=int, default=100, help="test clips")
    parser.add_argument("--max-clips", type=int, default=None, help="at most this many clips per split (a small world)")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="share of distinct sentences held for val")
    parser.add_argument("--test-fraction", type=float, default=0.2, help="share of distinct sentences held for test")
    parser.add_argument("--min-speech", type=float, default=0.5, help="shortest utterance kept, s (silence trimmed)")
    parser.add_argument("--max-speech", type=float, default=6.0, help="longest utterance kept, s (silence trimmed)")
    parser.add_argument("--max-duration", type=float, default=10.0, help="longest clip, s")
    parser.add_argument("--recordings", type=Path, default=None, help="folder of Asterisk .wav prompts (default: located)")
    parser.add_argument("--transcripts", type=Path, default=None, help="core-sounds-en.txt(.gz) (default: located)")
    parser.add_argument("--effects", type=Path, default=None, help="freedesktop stereo/ folder (default: located)")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """Write the world under ``--out``; returns counts (clips per split, benchmark rows, texts).
    A missing or unreadable asset stops with one line naming it (``SystemExit``)."""
    args = build_parser().parse_args(argv)
    try:
        return build(args)
    except (assets.AssetError, WorldError) as error:
        raise SystemExit(f"make_real_speech: {error}") from None


def build(args: argparse.Namespace) -> dict[str, int]:
    for name in ("train", "val", "test"):
        if getattr(args, name) < 0:
            raise WorldError(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.max_clips is not None and args.max_clips < 0:
        raise WorldError(f"--max-clips must be >= 0, got {args.max_clips}")
    if not 0 < args.min_speech <= args.max_speech:
        raise WorldError(f"need 0 < --min-speech <= --max-speech, got {args.min_speech} and {args.max_speech}")
    if args.max_duration < args.max_speech + 0.6:
        raise WorldError(f"--max-duration ({args.max_duration}) must be at least --max-speech + 0.6 s")
    started = time.perf_counter()
    folder = args.recordings or assets.recordings_dir()
    table = assets.read_transcripts(args.transcripts) if args.transcripts else assets.transcripts()
    recordings = load_recordings(Path(folder), table, args.min_speech, args.max_speech)
    effects = load_effects(Path(args.effects or assets.effects_dir()))
    splits = split_recordings(recordings, args.seed, args.val_fraction, args.test_fraction)
    out: Path = args.out
    (out / "audio").mkdir(parents=True, exist_ok=True)

    texts: list[str] = []
    counts: dict[str, int] = {}
    total_seconds = 0.0
    for split in ("train", "val", "test"):
        n = getattr(args, split) if args.max_clips is None else min(getattr(args, split), args.max_clips)
        pool = splits[split]
        if n and not pool:
            raise WorldError(f"split {split!r} has no recordings; raise --{split}-fraction or use more recordings")
        sentences = list(dict.fromkeys(s.text for s in pool))
        words = list(dict.fromkeys(w for s in sentences for w in blankable(s)))
        rows = []
        for index in range(n):
            rng = np.random.default_rng([args.seed, SPLIT_STREAMS[split], index])
            row, samples = make_clip(f"{split}-{index:04d}", rng, pool, effects, args.max_duration, words, sentences)
            soundfile.write(str(out / row["audio"]), samples, SAMPLE_RATE, subtype="PCM_16", format="WAV")
            rows.append(row)
            texts.extend(row_texts(row))
            total_seconds += row["duration"]
        write_jsonl(out / f"{split}.jsonl", rows)
        counts[split] = len(rows)
        counts[f"{split}_recordings"] = len(pool)
        if split == "test":
            questions = [q for index, row in enumerate(rows) for q in
                         benchmark_questions(row, np.random.default_rng([args.seed, BENCHMARK_STREAM, index]), words, sentences)]
            write_jsonl(out / "benchmark.jsonl", questions)
            counts["benchmark"] = len(questions)
    unique = list(dict.fromkeys(texts))
    (out / "texts.txt").write_text("\n".join(unique) + "\n", encoding="utf-8", newline="\n")
    (out / "ATTRIBUTION.txt").write_text(attribution(splits), encoding="utf-8", newline="\n")
    counts["texts"] = len(unique)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"real speech -> {out}: train {counts['train']} / val {counts['val']} / test {counts['test']} clips "
        f"from {counts['train_recordings']} / {counts['val_recordings']} / {counts['test_recordings']} recordings, "
        f"{counts['benchmark']} benchmark questions, {total_seconds / 60:.1f} min of audio, {counts['texts']} texts, "
        f"{size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s"
    )
    return counts


if __name__ == "__main__":
    main(sys.argv[1:])
