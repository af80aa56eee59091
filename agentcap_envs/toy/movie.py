"""Generate the toy movie world for READ audio description (AD), offline and deterministic.

Why this world exists: READ needs clips with precomputed visual features, a reference AD per clip,
the previous ADs as context, and a pure AD corpus to fine-tune the coherence scorer (LLM-AD*).
Nothing can be downloaded here, so this module builds a small world with the same shape:

* a few "movies", each an ordered sequence of clips driven by a small state machine (who holds
  what, what is open), so neighbouring ADs share characters and objects and actions follow
  plausible chains (picks up -> carries -> puts down); a language model fine-tuned on the corpus
  can therefore tell a coherent next AD from an incoherent one;
* per clip a float32 feature array [frames, dim] that is a deterministic function of the clip
  content (fixed codebook vectors per character / action / object / colour, the adverb as a
  temporal profile of the action code, a recipient code in the later frames) plus small noise,
  so the content is recoverable from the features;
* splits by movie (held-out movies are unseen), a corpus from extra movies, and ``texts.txt``
  with every AD sentence for building a tokenizer.

Re-running with the same arguments writes byte-identical files.

    python tools/make_toy_movie.py --out data/toy_movie --seed 0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CAST: tuple[str, ...] = ("Anna", "Tom", "Maria", "Ben", "Lucy", "Sam")
OBJECTS: tuple[str, ...] = ("door", "key", "box", "cup", "book", "lamp", "letter", "bag")
COLOURS: tuple[str, ...] = ("red", "blue", "green", "yellow", "black", "white")
ACTIONS: tuple[str, ...] = (
    "looks at", "walks to", "picks up", "carries", "puts down", "opens",
    "closes", "reads", "drops", "gives", "turns on", "turns off",
)
ADVERBS: tuple[str, ...] = ("slowly", "quickly", "carefully")

# What can be done to each object; the state machine only proposes afforded actions.
AFFORDANCES: dict[str, frozenset[str]] = {
    "door": frozenset({"looks at", "walks to", "opens", "closes"}),
    "key": frozenset({"looks at", "picks up", "carries", "puts down", "drops", "gives"}),
    "box": frozenset({"looks at", "walks to", "picks up", "carries", "puts down", "opens", "closes",
                      "drops", "gives"}),
    "cup": frozenset({"looks at", "picks up", "carries", "puts down", "drops", "gives"}),
    "book": frozenset({"looks at", "picks up", "carries", "puts down", "opens", "closes", "reads",
                       "drops", "gives"}),
    "lamp": frozenset({"looks at", "walks to", "picks up", "carries", "puts down", "turns on",
                       "turns off"}),
    "letter": frozenset({"looks at", "picks up", "carries", "puts down", "opens", "reads", "drops",
                         "gives"}),
    "bag": frozenset({"looks at", "walks to", "picks up", "carries", "puts down", "opens", "closes",
                      "drops", "gives"}),
}

# Which action tends to follow which (same character, same object). None = a fresh object.
TRANSITIONS: dict[str | None, dict[str, float]] = {
    None: {"looks at": 2, "walks to": 2, "picks up": 3, "opens": 1, "turns on": 1},
    "looks at": {"picks up": 4, "opens": 3, "walks to": 1, "reads": 2, "turns on": 2},
    "walks to": {"opens": 4, "looks at": 1, "picks up": 3, "turns on": 3},
    "picks up": {"carries": 4, "opens": 2, "looks at": 1, "gives": 2},
    "carries": {"puts down": 4, "gives": 3, "drops": 1},
    "puts down": {"opens": 1, "looks at": 1},
    "opens": {"reads": 4, "looks at": 2, "closes": 2},
    "reads": {"closes": 4, "puts down": 2},
    "closes": {"puts down": 3, "looks at": 1},
    "drops": {"picks up": 4, "looks at": 1},
    "gives": {"opens": 2, "looks at": 2, "carries": 3, "puts down": 1},
    "turns on": {"looks at": 2, "turns off": 1, "picks up": 1},
    "turns off": {"picks up": 1, "looks at": 1},
}

# Actions after which the scene usually moves on to another object.
CLOSING_ACTIONS = frozenset({"puts down", "drops", "closes", "turns off"})

# Extra seconds an adverb adds to a clip: slow actions take longer to show.
ADVERB_SECONDS = {None: 0.0, "slowly": 1.0, "quickly": -0.4, "carefully": 0.5}

SPLIT_STREAMS = {"train": 1, "val": 2, "test": 3, "corpus": 4}


@dataclass(frozen=True)
class Event:
    """One clip's content: everything the AD says, and so everything the features encode."""

    actor: str
    action: str
    obj: str
    colour: str
    adverb: str | None = None
    recipient: str | None = None

    def sentence(self) -> str:
        """The reference AD, a fixed template of 5-9 words."""
        verb = self.action if self.adverb is None else f"{self.adverb} {self.action}"
        text = f"{self.actor} {verb} the {self.colour} {self.obj}"
        if self.action == "carries":
            text += " across the room"
        elif self.action == "gives":
            text += f" to {self.recipient}"
        return text + "."

    def characters(self) -> list[str]:
        return [self.actor] if self.recipient is None else [self.actor, self.recipient]


@dataclass
class Scene:
    """The state a movie's story runs on: who holds what, what is open or switched on."""

    cast: list[str]
    colours: dict[str, str]
    holder: dict[str, str | None] = field(default_factory=dict)
    is_open: dict[str, bool] = field(default_factory=dict)
    is_on: dict[str, bool] = field(default_factory=dict)

    def allowed(self, actor: str, obj: str, action: str) -> bool:
        """Preconditions keep the story physically plausible (only a holder can put down)."""
        if action not in AFFORDANCES[obj]:
            return False
        holder = self.holder.get(obj)
        held_by_actor = holder == actor
        held_by_other = holder is not None and not held_by_actor
        if action in ("carries", "puts down", "drops"):
            return held_by_actor
        if action == "gives":
            return held_by_actor and len(self.cast) > 1
        if action == "picks up":
            return holder is None
        if action == "walks to":
            return holder is None
        if action == "opens":
            return not held_by_other and not self.is_open.get(obj, False)
        if action == "closes":
            return not held_by_other and self.is_open.get(obj, False)
        if action == "reads":
            return not held_by_other and self.is_open.get(obj, False)
        if action == "turns on":
            return not held_by_other and not self.is_on.get(obj, False)
        if action == "turns off":
            return not held_by_other and self.is_on.get(obj, False)
        return True  # looks at

    def apply(self, event: Event) -> None:
        if event.action == "picks up":
            self.holder[event.obj] = event.actor
        elif event.action in ("puts down", "drops"):
            self.holder[event.obj] = None
        elif event.action == "gives":
            self.holder[event.obj] = event.recipient
        elif event.action == "opens":
            self.is_open[event.obj] = True
        elif event.action == "closes":
            self.is_open[event.obj] = False
        elif event.action == "turns on":
            self.is_on[event.obj] = True
        elif event.action == "turns off":
            self.is_on[event.obj] = False


def _pick(rng: np.random.Generator, items: Sequence[str]) -> str:
    return items[int(rng.integers(len(items)))]


def generate_story(rng: np.random.Generator, n_clips: int) -> list[Event]:
    """A Markov story: characters and objects persist, actions follow the transition table.

    Each movie draws a sub-cast of 2-3 characters and 3-4 objects with fixed colours, so the
    "red key" stays red for the whole movie, which is what makes a wrong colour incoherent.
    """
    cast = [CAST[i] for i in rng.choice(len(CAST), size=int(rng.integers(2, 4)), replace=False)]
    n_objects = int(rng.integers(3, 5))
    objects = [OBJECTS[i] for i in rng.choice(len(OBJECTS), size=n_objects, replace=False)]
    colours = [COLOURS[i] for i in rng.choice(len(COLOURS), size=n_objects, replace=False)]
    scene = Scene(cast=cast, colours=dict(zip(objects, colours)))

    events: list[Event] = []
    actor, obj = _pick(rng, cast), _pick(rng, objects)
    for _ in range(n_clips):
        previous = events[-1] if events else None
        if previous is not None:
            if previous.action == "gives":
                actor = previous.recipient or actor
            elif rng.random() < 0.2:
                actor = _pick(rng, [c for c in cast if c != actor])
            leave = 0.5 if previous.action in CLOSING_ACTIONS else 0.15
            if rng.random() < leave:
                # Moving on: prefer something the actor already holds, else anything else.
                held = [o for o in objects if o != obj and scene.holder.get(o) == actor]
                obj = _pick(rng, held or [o for o in objects if o != obj])
            holder = scene.holder.get(obj)
            if holder is not None and holder != actor and rng.random() < 0.7:
                actor = holder  # whoever holds the thing carries the scene on
        # Try the chosen object first, then the others, until one has a plausible next action.
        order = [obj] + [objects[i] for i in rng.permutation(len(objects)) if objects[i] != obj]
        for candidate_obj in order:
            choice = _next_action(rng, scene, events, actor, candidate_obj)
            if choice is not None:
                obj, action = candidate_obj, choice
                break
        else:  # nothing plausible anywhere: looking is always possible
            action = "looks at"
        adverb = _pick(rng, ADVERBS) if rng.random() < 0.2 else None
        recipient = _pick(rng, [c for c in cast if c != actor]) if action == "gives" else None
        event = Event(actor, action, obj, scene.colours[obj], adverb, recipient)
        scene.apply(event)
        events.append(event)
    return events


def _next_action(
    rng: np.random.Generator, scene: Scene, events: list[Event], actor: str, obj: str
) -> str | None:
    """Sample the next action on ``obj`` from the transition table; None if none is plausible."""
    previous = events[-1] if events else None
    if previous is not None and previous.obj == obj:
        key: str | None = previous.action
        recent = {e.action for e in events[-2:] if e.obj == obj}
    else:
        # A fresh object: if the actor already holds it, carry on as after picking it up.
        key = "picks up" if scene.holder.get(obj) == actor else None
        recent = set()
    weights = TRANSITIONS[key]
    candidates = [
        a for a in ACTIONS
        if scene.allowed(actor, obj, a)
        # never the very same event twice in a row
        and not (previous is not None and (previous.actor, previous.action, previous.obj)
                 == (actor, a, obj))
    ]
    # Damp what just happened to this object, so stories move on instead of looping.
    scores = np.array(
        [weights.get(a, 0.0) * (0.1 if a in recent else 1.0) for a in candidates], dtype=np.float64
    )
    if scores.sum() == 0:
        return None
    return candidates[int(rng.choice(len(candidates), p=scores / scores.sum()))]


def clip_duration(rng: np.random.Generator, event: Event) -> float:
    """Seconds on screen, correlated with AD length (READ's prompt gives the duration)."""
    words = len(event.sentence().split())
    seconds = 0.7 * words - 1.8 + ADVERB_SECONDS[event.adverb] + rng.normal(0.0, 0.25)
    return round(float(np.clip(seconds, 1.5, 6.0)), 1)


class Codebook:
    """Fixed vectors per attribute value; orthonormal when they fit, so content is recoverable."""

    def __init__(self, seed: int, dim: int):
        names = (
            [("character", c) for c in CAST]
            + [("action", a) for a in ACTIONS]
            + [("object", o) for o in OBJECTS]
            + [("colour", c) for c in COLOURS]
        )
        rng = np.random.default_rng([seed, 0])
        matrix = rng.normal(size=(dim, max(dim, len(names))))
        if len(names) <= dim:
            q, _ = np.linalg.qr(matrix)  # columns are orthonormal
            vectors = q[:, : len(names)].T
        else:
            vectors = matrix[:, : len(names)].T
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        self.dim = dim
        self.vectors = {name: vectors[i] for i, name in enumerate(names)}

    def __getitem__(self, key: tuple[str, str]) -> np.ndarray:
        return self.vectors[key]


def adverb_profile(adverb: str | None, frames: int) -> np.ndarray:
    """How strongly the action shows in each frame: the adverb is the action's tempo."""
    t = np.linspace(0.0, 1.0, frames)
    if adverb == "slowly":
        return 0.4 + 0.6 * t
    if adverb == "quickly":
        return np.where(np.abs(t - 0.4) < 0.2, 1.6, 0.6)
    if adverb == "carefully":
        return 1.0 + 0.4 * np.sin(2 * np.pi * t)
    return np.ones(frames)


def clip_features(
    codebook: Codebook, event: Event, rng: np.random.Generator, frames: int, noise: float
) -> np.ndarray:
    """[frames, dim] float32: sum of the clip's codes, varied per frame, plus seeded noise."""
    static = (
        codebook[("character", event.actor)]
        + codebook[("object", event.obj)]
        + codebook[("colour", event.colour)]
    )
    action = codebook[("action", event.action)]
    profile = adverb_profile(event.adverb, frames)
    out = static[None, :] + profile[:, None] * action[None, :]
    if event.recipient is not None:
        arrives = (np.arange(frames) >= frames // 2).astype(np.float64)
        out = out + 0.6 * arrives[:, None] * codebook[("character", event.recipient)][None, :]
    out = out + rng.normal(0.0, noise, size=out.shape)
    return out.astype(np.float32)


def _movie_ids(prefix: str, start: int, count: int, total: int) -> list[str]:
    width = max(2, len(str(total - 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(start, start + count)]


def _context(ads: Sequence[str], position: int, size: int) -> list[str]:
    """The up-to-``size`` ADs just before ``position``, oldest first (READ's context)."""
    return list(ads[max(0, position - size):position]) if size > 0 else []


def _write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-movies", type=int, default=8)
    parser.add_argument("--val-movies", type=int, default=2)
    parser.add_argument("--test-movies", type=int, default=5,
                        help="held-out movies: 100 clips, so paired per-clip intervals are narrow")
    parser.add_argument("--clips-per-movie", type=int, default=20)
    parser.add_argument("--corpus-movies", type=int, default=150,
                        help="extra movies (never val/test) whose ADs form corpus.jsonl")
    parser.add_argument("--context", type=int, default=3, help="previous ADs given as context")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--noise", type=float, default=0.05, help="feature noise std")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """Write the world under ``--out``; returns counts (rows per split) for callers and tests."""
    args = build_parser().parse_args(argv)
    for name in ("train_movies", "val_movies", "test_movies", "corpus_movies", "context"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("clips_per_movie", "frames", "dim"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    started = time.perf_counter()
    out: Path = args.out
    (out / "features").mkdir(parents=True, exist_ok=True)
    codebook = Codebook(args.seed, args.dim)

    total_movies = args.train_movies + args.val_movies + args.test_movies
    splits = {
        "train": _movie_ids("m", 0, args.train_movies, total_movies),
        "val": _movie_ids("m", args.train_movies, args.val_movies, total_movies),
        "test": _movie_ids(
            "m", args.train_movies + args.val_movies, args.test_movies, total_movies
        ),
    }
    texts: list[str] = []
    counts: dict[str, int] = {}
    for split, movie_ids in splits.items():
        rows = []
        for index, movie in enumerate(movie_ids):
            # One stream per (seed, split, movie): sizes of other splits never change this movie.
            rng = np.random.default_rng([args.seed, SPLIT_STREAMS[split], index])
            story = generate_story(rng, args.clips_per_movie)
            ads = [event.sentence() for event in story]
            for position, event in enumerate(story):
                clip_id = f"{movie}-c{position:03d}"
                features = clip_features(codebook, event, rng, args.frames, args.noise)
                np.save(out / "features" / f"{clip_id}.npy", features, allow_pickle=False)
                rows.append({
                    "id": clip_id,
                    "movie": movie,
                    "position": position,
                    "duration": clip_duration(rng, event),
                    "features": f"features/{clip_id}.npy",
                    "characters": event.characters(),
                    "ad": ads[position],
                    "context": _context(ads, position, args.context),
                    "meta": {"action": event.action, "object": event.obj, "colour": event.colour,
                             "adverb": event.adverb},
                })
            texts.extend(ads)
        _write_jsonl(out / f"{split}.jsonl", rows)
        counts[split] = len(rows)

    corpus = []
    for index in range(args.corpus_movies):
        rng = np.random.default_rng([args.seed, SPLIT_STREAMS["corpus"], index])
        ads = [event.sentence() for event in generate_story(rng, args.clips_per_movie)]
        for position in range(1, len(ads)):
            corpus.append({"context": _context(ads, position, args.context), "ad": ads[position]})
        texts.extend(ads)
    _write_jsonl(out / "corpus.jsonl", corpus)
    counts["corpus"] = len(corpus)

    unique = list(dict.fromkeys(texts))  # first-seen order keeps the file deterministic
    (out / "texts.txt").write_text("\n".join(unique) + "\n", encoding="utf-8", newline="\n")
    counts["texts"] = len(unique)

    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"toy movie world -> {out}: train {counts['train']} / val {counts['val']} / "
        f"test {counts['test']} clips, corpus {counts['corpus']} rows, {counts['texts']} texts, "
        f"{size / 1e6:.2f} MB, {time.perf_counter() - started:.1f} s"
    )
    return counts


if __name__ == "__main__":
    main(sys.argv[1:])
