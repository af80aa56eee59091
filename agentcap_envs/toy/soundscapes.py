"""Generate the toy soundscape world for AudioMap and ACE-Cap, offline and deterministic.

Why this world exists: AudioMap trains against a cloze bank (ESR) and event-time anchors (ECTR),
ACE-Cap against a gold MCQ bank (G2P) with QA pairs to warm up the Composer and Instruct roles.
Real data and annotators are unavailable here, so every gold artefact is derived from known
synthesis parameters instead of a language model:

* each clip (16 kHz mono 16-bit wav, 2-8 s) holds 1-3 non-overlapping events of distinct types
  (beep, buzz, hiss, knock, chirp); each event has a pitch, a loudness, a count of repetitions and
  start/end times on a 0.1 s grid, all audible in the waveform;
* the gold dense caption is one templated sentence per event in time order, the short caption
  (the Captioner's first draft) names the types only;
* the QA pairs (role warm-up) ask one attribute of an event, or the whole event ("What is the beep
  like?" answered by its gold sentence), so the evidence a clip needs grows with its 1-3 events;
* cloze and MCQ items offer the 4 values of one attribute as A-D (gold placed at random by the
  seeded generator) and "Not given" as E, which is never gold;
* clip durations follow a skewed spread so a short-clips-first curriculum has something to do;
* ``benchmark.jsonl`` holds held-out MCQ questions about the test clips in the benchmark manifest
  schema of MMAU / MMAR / MMSU (``agentcap evaluate --benchmark``; see :func:`benchmark_questions`).

Re-running with the same arguments writes byte-identical files (the random serial number that
libsndfile puts in an Ogg stream is pinned to 0).

    python tools/make_toy_soundscapes.py --out data/toy_soundscapes --seed 0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

SAMPLE_RATE = 16_000
TYPES: tuple[str, ...] = ("beep", "buzz", "hiss", "knock", "chirp")
PITCHES: tuple[str, ...] = ("low", "mid", "high", "very high")
LOUDNESSES: tuple[str, ...] = ("very soft", "soft", "loud", "very loud")
COUNTS: tuple[int, ...] = (1, 2, 3, 4)
COUNT_WORDS = {1: "once", 2: "twice", 3: "three times", 4: "four times"}
NOT_GIVEN = "Not given"
LETTERS = "ABCDE"

# Tonal types: base frequency per pitch, in octaves. Hiss: the pass band of the noise.
PITCH_HZ = {"low": 200.0, "mid": 400.0, "high": 800.0, "very high": 1600.0}
HISS_BAND_HZ = {"low": (150.0, 500.0), "mid": (500.0, 1500.0), "high": (1500.0, 4000.0),
                "very high": (4000.0, 7500.0)}
PEAK = {"very soft": 0.06, "soft": 0.15, "loud": 0.4, "very loud": 0.8}
NOISE_FLOOR = 0.002  # no digital silence: a model must hear events, not detect exact zeros

SPLIT_STREAMS = {"train": 1, "val": 2, "test": 3, "bad": 99}


@dataclass(frozen=True)
class SoundEvent:
    """One event; the field order is the manifest's ``events`` row order."""

    type: str
    pitch: str
    loudness: str
    count: int
    start: float
    end: float

    def phrase(self) -> str:
        """The anchor description: attributes that tell this event apart from its neighbours."""
        return f"the {self.loudness} {self.pitch} {self.type}"

    def sentence(self, blank: str | None = None) -> str:
        """The gold caption sentence; ``blank`` names the attribute replaced by ``___``."""
        parts = {
            "type": self.type,
            "pitch": self.pitch,
            "loudness": self.loudness,
            "count": COUNT_WORDS[self.count],
        }
        if blank is not None:
            parts[blank] = "___"
        return (
            f"From {self.start:.1f} s to {self.end:.1f} s, a {parts['loudness']} {parts['pitch']} "
            f"{parts['type']} sounds {parts['count']}."
        )


# --- synthesis ---------------------------------------------------------------------------------
def _fade(n: int, rate: int, seconds: float = 0.005) -> np.ndarray:
    """Raised-cosine edges, so bursts start and stop without clicks that would sound like knocks."""
    ramp = min(int(seconds * rate), n // 2)
    window = np.ones(n)
    if ramp > 0:
        edge = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / ramp)
        window[:ramp] = edge
        window[n - ramp:] = edge[::-1]
    return window


def _burst(kind: str, pitch: str, n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """One repetition of a sound type, peak-normalised to 1."""
    t = np.arange(n) / rate
    f0 = PITCH_HZ[pitch] * rng.uniform(0.97, 1.03)
    if kind == "beep":
        wave = np.sin(2 * np.pi * f0 * t)
    elif kind == "buzz":
        # Band-limited square wave: odd harmonics below Nyquist, so no aliasing.
        wave = np.zeros(n)
        for h in range(1, int(0.45 * rate / f0) + 1, 2):
            wave += np.sin(2 * np.pi * h * f0 * t) / h
    elif kind == "hiss":
        low, high = HISS_BAND_HZ[pitch]
        spectrum = np.fft.rfft(rng.normal(size=n))
        freqs = np.fft.rfftfreq(n, 1.0 / rate)
        spectrum[(freqs < low) | (freqs > high)] = 0.0
        wave = np.fft.irfft(spectrum, n)
    elif kind == "knock":
        # A struck-object click: a damped resonance at the pitch plus a short noise transient.
        decay = np.exp(-t / 0.015)
        wave = decay * np.sin(2 * np.pi * f0 * t) + 0.3 * np.exp(-t / 0.002) * rng.normal(size=n)
    elif kind == "chirp":
        duration = max(n / rate, 1e-3)
        wave = np.sin(2 * np.pi * (f0 * t + f0 * t * t / (2 * duration)))  # f0 -> 2 f0
    else:
        raise ValueError(f"unknown sound type {kind!r}; expected one of {TYPES}")
    peak = np.max(np.abs(wave))
    return wave / peak if peak > 0 else wave


def render(events: Sequence[SoundEvent], duration: float, rate: int,
           rng: np.random.Generator) -> np.ndarray:
    """The clip as int16 samples: each event split into ``count`` equal slots, one burst each."""
    total = int(round(duration * rate))
    audio = rng.normal(0.0, NOISE_FLOOR, size=total)
    for event in events:
        first, last = int(round(event.start * rate)), int(round(event.end * rate))
        slot = (last - first) / event.count
        for k in range(event.count):
            begin = first + int(round(k * slot))
            on = int(round(0.6 * slot))
            if event.type == "knock":
                on = min(on, int(0.08 * rate))  # a knock is short however long its slot
            edge = 0.001 if event.type == "knock" else 0.005  # keep the knock's attack sharp
            wave = _burst(event.type, event.pitch, on, rate, rng) * _fade(on, rate, edge)
            gain = PEAK[event.loudness] * rng.uniform(0.9, 1.05)
            audio[begin:begin + on] += gain * wave
    return np.round(np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)


# --- clip layout ------------------------------------------------------------------------------
def sample_duration(rng: np.random.Generator, low: float, high: float) -> float:
    """A 0.5 s grid skewed to short clips (mean about 4 s at 2-8 s): size stays small and the
    duration curriculum has many short clips to start on and some long ones to end on."""
    steps = int(round((high - low) / 0.5))
    return low + 0.5 * int(round(steps * rng.random() ** 1.7))


def sample_events(rng: np.random.Generator, duration: float) -> list[SoundEvent]:
    """1-3 events of distinct types, laid out in time order without overlap, on a 0.1 s grid."""
    tenths = int(round(duration * 10))
    most = 1 if duration < 2.5 else 2 if duration < 5.0 else 3
    n = int(rng.integers(1, most + 1))
    kinds = [TYPES[i] for i in rng.choice(len(TYPES), size=n, replace=False)]
    # Keep 0.2 s at each edge and at least 0.1 s between events.
    budget = (tenths - 4) // n - 1
    counts = [COUNTS[int(rng.integers(len(COUNTS)))] for _ in range(n)]
    # 0.3-0.5 s per repetition, shrunk to fit the clip, never under 0.1 s per repetition.
    lengths = [max(c, min(budget, int(round(c * rng.uniform(3.0, 5.0))))) for c in counts]
    slack = tenths - sum(lengths) - (n - 1)
    if slack < 0:
        raise ValueError(f"duration {duration} s is too short for {n} events; raise --min-duration")
    gaps = rng.multinomial(slack, rng.dirichlet(np.ones(n + 1)))
    events, cursor = [], int(gaps[0])
    for i, (kind, count, length) in enumerate(zip(kinds, counts, lengths)):
        events.append(SoundEvent(
            type=kind,
            pitch=PITCHES[int(rng.integers(len(PITCHES)))],
            loudness=LOUDNESSES[int(rng.integers(len(LOUDNESSES)))],
            count=count,
            start=cursor / 10,
            end=(cursor + length) / 10,
        ))
        cursor += length + 1 + int(gaps[i + 1])
    return events


# --- gold text --------------------------------------------------------------------------------
def short_caption(events: Sequence[SoundEvent]) -> str:
    """The coarse first draft: which sounds, nothing about their attributes or times."""
    names = [f"a {event.type}" for event in events]
    if len(names) == 1:
        return f"A {events[0].type} is heard."
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    return listed[0].upper() + listed[1:] + " are heard."


def _values(attribute: str, event: SoundEvent, rng: np.random.Generator) -> tuple[list[str], str]:
    """The 4 same-kind candidate values (gold + 3 distractors) and the gold, as option text."""
    if attribute == "type":
        others = [t for t in TYPES if t != event.type]
        chosen = [others[i] for i in rng.choice(len(others), size=3, replace=False)]
        return [event.type, *chosen], event.type
    if attribute == "pitch":
        return list(PITCHES), event.pitch
    if attribute == "loudness":
        return list(LOUDNESSES), event.loudness
    if attribute == "count":
        return [COUNT_WORDS[c] for c in COUNTS], COUNT_WORDS[event.count]
    raise ValueError(f"unknown attribute {attribute!r}")


def _options(attribute: str, event: SoundEvent, rng: np.random.Generator) -> tuple[list[str], str]:
    """A-D: the 4 values shuffled by the seeded generator; E: always "Not given", never gold."""
    values, gold = _values(attribute, event, rng)
    order = [values[i] for i in rng.permutation(4)]
    return [*order, NOT_GIVEN], LETTERS[order.index(gold)]


def _question(attribute: str, event: SoundEvent) -> str:
    at = f"{event.start:.1f} s"
    if attribute == "type":
        return f"What kind of sound is heard from {at} to {event.end:.1f} s?"
    if attribute == "pitch":
        return f"What is the pitch of the {event.type} heard from {at}?"
    if attribute == "loudness":
        return f"How loud is the {event.type} heard from {at}?"
    return f"How many times does the {event.type} heard from {at} sound?"


GOLD_ATTRIBUTES = ("type", "pitch", "loudness", "count")


def gold_banks(events: Sequence[SoundEvent], rng: np.random.Generator) -> dict[str, list[dict]]:
    """Cloze (AudioMap ESR), MCQ (ACE-Cap G2P), QA (role warm-up) and anchors (AudioMap ECTR)."""
    cloze, mcq, qa, anchors = [], [], [], []
    for index, event in enumerate(events):
        for attribute in GOLD_ATTRIBUTES:
            meta = {"event": index, "subject": event.type, "attribute": attribute}
            options, answer = _options(attribute, event, rng)
            cloze.append({"passage": event.sentence(blank=attribute), "options": options,
                          "answer": answer, "meta": meta})
            options, answer = _options(attribute, event, rng)
            mcq.append({"passage": _question(attribute, event), "options": options,
                        "answer": answer, "meta": dict(meta)})
        name = event.type
        for attribute, question, answer in (
            ("pitch", f"What is the pitch of the {name}?",
             f"The {name} has a {event.pitch} pitch."),
            ("loudness", f"How loud is the {name}?", f"The {name} is {event.loudness}."),
            ("count", f"How many times does the {name} sound?",
             f"The {name} sounds {COUNT_WORDS[event.count]}."),
            ("time", f"When is the {name} heard?",
             f"The {name} is heard from {event.start:.1f} s to {event.end:.1f} s."),
            # one question that resolves the whole event: a clip needs one per event beyond c0
            ("event", f"What is the {name} like?", event.sentence()),
        ):
            qa.append({"question": question, "answer": answer,
                       "meta": {"event": index, "subject": name, "attribute": attribute}})
        anchors.append({"event": event.phrase(), "start": event.start, "end": event.end})
    return {"cloze": cloze, "mcq": mcq, "qa": qa, "anchors": anchors}


# --- held-out benchmark (caption-as-evidence QA, MMAU's converted schema) ---------------------
BENCHMARK_STREAM = 4  # its own random stream: adding it changed no clip of any split
ORDINALS = ("first", "second", "third")


def _pick(rng: np.random.Generator, gold: str, others: Sequence[str], k: int) -> tuple[list[str], str]:
    """``k`` choices: the gold and ``k - 1`` of ``others`` in a seeded order; returns (choices, letter)."""
    chosen = [others[i] for i in rng.choice(len(others), size=k - 1, replace=False)]
    choices = [[gold, *chosen][i] for i in rng.permutation(k)]
    return choices, "ABCDEFGHIJ"[choices.index(gold)]


def benchmark_questions(row: dict[str, Any], rng: np.random.Generator) -> list[dict[str, Any]]:
    """MCQ rows about one held-out clip, in the benchmark manifest schema (docs/data.md): the
    sound's type (by its place in time), pitch, loudness and repetitions, which of two comes first or
    later, and when one begins. Worded unlike the training banks (no cloze sentence, no time span
    naming the event, 2-4 choices, no "Not given"), so a caption must carry the facts, not the
    bank's phrasing."""
    events = [SoundEvent(**e) for e in row["events"]]
    n = len(events)
    out: list[tuple[str, str, str, str, list[str], str]] = []

    k = int(rng.integers(n))
    where = f"{ORDINALS[k]} in the recording" if n > 1 else "in the recording"
    choices, answer = _pick(rng, events[k].type, [t for t in TYPES if t != events[k].type], 4)
    out.append(("sound identification", "perception", "type", f"Which sound is heard {where}?", choices, answer))

    event = events[int(rng.integers(n))]
    choices, answer = _pick(rng, event.pitch, [p for p in PITCHES if p != event.pitch], 3)
    out.append(("sound attributes", "perception", "pitch", f"How high in pitch is the {event.type}?", choices, answer))

    event = events[int(rng.integers(n))]
    choices, answer = _pick(rng, event.loudness, [v for v in LOUDNESSES if v != event.loudness], 3)
    out.append(("sound attributes", "perception", "loudness", f"How loud is the {event.type}?", choices, answer))

    event = events[int(rng.integers(n))]
    words = [COUNT_WORDS[c] for c in COUNTS]
    choices, answer = _pick(rng, COUNT_WORDS[event.count], [w for w in words if w != COUNT_WORDS[event.count]], 4)
    out.append(("counting", "perception", "count", f"How often does the {event.type} repeat?", choices, answer))

    if n > 1:
        i, j = sorted(int(x) for x in rng.choice(n, size=2, replace=False))
        earlier = bool(rng.integers(2))
        gold = events[i].type if earlier else events[j].type
        other = events[j].type if earlier else events[i].type
        choices, answer = _pick(rng, gold, [other], 2)
        word = "first" if earlier else "later"
        out.append(("temporal reasoning", "temporal", "order",
                    f"Which comes {word}, the {events[i].type} or the {events[j].type}?", choices, answer))

    event = events[int(rng.integers(n))]
    grid = [t / 10 for t in range(int(round(row["duration"] * 10)))]
    far = [f"{t:.1f} s" for t in grid if abs(t - event.start) >= 0.5]
    choices, answer = _pick(rng, f"{event.start:.1f} s", far, 4)
    out.append(("temporal reasoning", "temporal", "onset", f"At about what time does the {event.type} begin?",
                choices, answer))

    return [
        {"id": f"{row['id']}-q{q}", "audio": row["audio"], "question": question, "choices": choices,
         "answer": answer, "answer_text": choices["ABCDEFGHIJ".index(answer)], "benchmark": "toy", "task": task,
         "category": category, "subcategory": subcategory, "layer": None, "duration": row["duration"]}
        for q, (task, category, subcategory, question, choices, answer) in enumerate(out)
    ]


def make_clip(clip_id: str, rng: np.random.Generator, low: float, high: float,
              rate: int) -> tuple[dict[str, Any], np.ndarray]:
    """One manifest row and its int16 samples, all drawn from ``rng``."""
    duration = sample_duration(rng, low, high)
    events = sample_events(rng, duration)
    samples = render(events, duration, rate, rng)
    row = {
        "id": clip_id,
        "audio": f"audio/{clip_id}.wav",
        "duration": duration,
        "caption": " ".join(event.sentence() for event in events),
        "short_caption": short_caption(events),
        "events": [asdict(event) for event in events],
        **gold_banks(events, rng),
    }
    return row, samples


def row_texts(row: dict[str, Any]) -> list[str]:
    """Every string a tokenizer for this world must cover."""
    texts = [row["caption"], row["short_caption"]]
    for item in row["cloze"] + row["mcq"]:
        texts.append(item["passage"])
        texts.extend(item["options"])
    for pair in row["qa"]:
        texts.extend((pair["question"], pair["answer"]))
    texts.extend(anchor["event"] for anchor in row["anchors"])
    return texts


def _write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    soundfile.write(str(path), samples, rate, subtype="PCM_16", format="WAV")


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def _ogg_crc(data: bytes) -> int:
    """Ogg's page checksum: CRC-32, polynomial 0x04C11DB7, not reflected, initial value 0."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else (crc << 1)
            crc &= 0xFFFFFFFF
    return crc


def _pin_ogg_serial(path: Path, serial: int = 0) -> None:
    """libsndfile gives each Ogg stream a time-seeded serial number; fix it so files repeat."""
    data = bytearray(path.read_bytes())
    offset = 0
    while offset < len(data):
        if data[offset:offset + 4] != b"OggS":
            raise ValueError(f"{path}: no Ogg page at byte {offset}")
        segments = data[offset + 26]
        table = data[offset + 27:offset + 27 + segments]
        end = offset + 27 + segments + sum(table)
        data[offset + 14:offset + 18] = serial.to_bytes(4, "little")
        data[offset + 22:offset + 26] = bytes(4)
        data[offset + 22:offset + 26] = _ogg_crc(bytes(data[offset:end])).to_bytes(4, "little")
        offset = end
    path.write_bytes(bytes(data))


# --- deliberately broken inputs for tests -----------------------------------------------------
def write_bad_examples(out_dir: str | Path) -> Path:
    """Write ``bad.jsonl`` with one row per failure a loader must name, and return its path.

    Rows (by id): ``bad-missing`` (audio file absent), ``bad-empty`` (0-byte file),
    ``bad-corrupt`` (random bytes named .wav), ``bad-gold-e`` (first cloze and first MCQ answer
    "E"), ``bad-gold-z`` (same with "Z"), ``bad-valid`` (usable). Each row says in ``broken`` what
    is wrong (null when nothing is). The valid clip is also written as ``.flac`` and ``.ogg`` with
    their rows in ``formats.jsonl``, to test loading of other formats.
    """
    out = Path(out_dir)
    (out / "audio").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([0, SPLIT_STREAMS["bad"]])
    valid, samples = make_clip("bad-valid", rng, 3.0, 3.0, SAMPLE_RATE)
    _write_wav(out / "audio" / "bad-valid.wav", samples, SAMPLE_RATE)

    def variant(clip_id: str, audio: str, broken: str | None) -> dict[str, Any]:
        row = json.loads(json.dumps(valid))  # deep copy
        row.update(id=clip_id, audio=audio, broken=broken)
        return row

    missing = out / "audio" / "bad-missing.wav"
    missing.unlink(missing_ok=True)
    (out / "audio" / "bad-empty.wav").write_bytes(b"")
    (out / "audio" / "bad-corrupt.wav").write_bytes(b"JUNK" + rng.bytes(4092))

    rows = [
        variant("bad-missing", "audio/bad-missing.wav", "audio file does not exist"),
        variant("bad-empty", "audio/bad-empty.wav", "audio file is empty (0 bytes)"),
        variant("bad-corrupt", "audio/bad-corrupt.wav", "audio file is random bytes, not a wav"),
    ]
    for letter in ("E", "Z"):
        row = variant(f"bad-gold-{letter.lower()}", "audio/bad-valid.wav",
                      f"first cloze and first mcq have gold answer {letter!r}")
        row["cloze"][0]["answer"] = letter
        row["mcq"][0]["answer"] = letter
        rows.append(row)
    rows.append(variant("bad-valid", "audio/bad-valid.wav", None))
    write_jsonl(out / "bad.jsonl", rows)

    formats = []
    for extension, kind, subtype in (("flac", "FLAC", "PCM_16"), ("ogg", "OGG", "VORBIS")):
        path = out / "audio" / f"bad-valid.{extension}"
        soundfile.write(str(path), samples, SAMPLE_RATE, format=kind, subtype=subtype)
        if kind == "OGG":
            _pin_ogg_serial(path)
        formats.append(variant(f"bad-valid-{extension}", f"audio/bad-valid.{extension}", None))
    write_jsonl(out / "formats.jsonl", formats)
    return out / "bad.jsonl"


# --- command line -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=600, help="training clips")
    parser.add_argument("--val", type=int, default=30, help="validation clips")
    parser.add_argument("--test", type=int, default=150,
                        help="test clips (150: paired per-clip intervals narrower than the gains)")
    parser.add_argument("--min-duration", type=float, default=2.0, help="seconds, on a 0.5 s grid")
    parser.add_argument("--max-duration", type=float, default=8.0, help="seconds, on a 0.5 s grid")
    parser.add_argument("--sample-rate", type=int, default=SAMPLE_RATE)
    parser.add_argument("--bad-examples", action="store_true",
                        help="also write bad.jsonl / formats.jsonl (see write_bad_examples)")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """Write the world under ``--out``; returns clips per split for callers and tests."""
    args = build_parser().parse_args(argv)
    for name in ("train", "val", "test"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name} must be >= 0, got {getattr(args, name)}")
    low, high = args.min_duration, args.max_duration
    if low < 1.5 or high < low or abs(low * 2 - round(low * 2)) > 1e-9 \
            or abs(high * 2 - round(high * 2)) > 1e-9:
        raise SystemExit(f"need 1.5 <= --min-duration <= --max-duration, both multiples of 0.5; "
                         f"got {low} and {high}")
    if args.sample_rate < 16_000:
        raise SystemExit(
            f"--sample-rate must be >= 16000 (hiss reaches 7.5 kHz), got {args.sample_rate}"
        )
    started = time.perf_counter()
    out: Path = args.out
    (out / "audio").mkdir(parents=True, exist_ok=True)

    texts: list[str] = []
    counts: dict[str, int] = {}
    seconds = 0.0
    for split in ("train", "val", "test"):
        rows = []
        for index in range(getattr(args, split)):
            # One stream per (seed, split, clip): other splits' sizes never change this clip.
            rng = np.random.default_rng([args.seed, SPLIT_STREAMS[split], index])
            row, samples = make_clip(f"{split}-{index:04d}", rng, low, high, args.sample_rate)
            _write_wav(out / row["audio"], samples, args.sample_rate)
            rows.append(row)
            texts.extend(row_texts(row))
            seconds += row["duration"]
        write_jsonl(out / f"{split}.jsonl", rows)
        counts[split] = len(rows)
        if split == "test":  # the held-out benchmark asks only about test clips
            questions = [q for index, row in enumerate(rows)
                         for q in benchmark_questions(row, np.random.default_rng([args.seed, BENCHMARK_STREAM, index]))]
            write_jsonl(out / "benchmark.jsonl", questions)
            counts["benchmark"] = len(questions)
    unique = list(dict.fromkeys(texts))  # first-seen order keeps the file deterministic
    (out / "texts.txt").write_text("\n".join(unique) + "\n", encoding="utf-8", newline="\n")
    counts["texts"] = len(unique)
    if args.bad_examples:
        write_bad_examples(out)

    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"toy soundscapes -> {out}: train {counts['train']} / val {counts['val']} / "
        f"test {counts['test']} clips, {seconds / 60:.1f} min of audio, {counts['texts']} texts, "
        f"{size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s"
    )
    return counts


if __name__ == "__main__":
    main(sys.argv[1:])
