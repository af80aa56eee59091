"""READ: audio description of one movie clip."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from agentcap.core.env import CaptionEnv
from agentcap.core.episode import Episode, Score
from agentcap.core.manifests import ManifestError, check_duration, load_features, resolve
from agentcap.judges.coherence import CoherenceScorer
from agentcap.judges.pool import judge_key, load_once
from agentcap.judges.served import ServedCoherenceScorer, served_judge_client
from agentcap.rewards.functional.read import extract_answer
from agentcap.rewards.read import read_rewards

AD_DEFINITION = (
    "Audio Descriptions (ADs) are written narrations that describe the visual elements of a video, "
    "including characters, actions, interactions, and scene settings, especially those not conveyed "
    "through dialogue."
)
FORMAT_INSTRUCTION = (
    "Put your reasoning in <think> </think> and the final description in <answer> </answer>."
)


class ADClipEnv(CaptionEnv):
    """Audio description (AD) of a movie clip, in one step (READ, §3).

    ## Description
    The policy sees a clip (precomputed visual features, or frames) with its duration and the names
    of the characters on screen, and writes one AD sentence. A configurable share of instances are
    context-aware: the prompt also lists up to three previous ADs of the same movie (READ Listing 2);
    the rest are plain clip→AD prompts (Listing 1). Which instances get context is a deterministic
    function of the item id and ``mix_seed``, so the G rollouts of an item always share a prompt.

    ## Action
    Text: ``<think>…</think><answer>…</answer>``; only the answer is the AD.

    ## Observation
    ``{"agent": "policy", "messages": [user prompt], "media": {"features": [frames, dim]}}``
    (``"frames"`` instead when the manifest row gives ``frames``).

    ## Rewards
    READ Eq. 6: accuracy (mean ROUGE-1/2/L F1, Eq. 3) + 0.08·format + 0.05·length (|wc(o) − wc(g)| ≤ Λ)
    + 0.05·coherence (Eq. 4–5: masked mean log-prob under the coherence scorer, only for responses with
    accuracy ≥ τ, top-k of the group get rank levels). Without a scorer the coherence term is 0.

    ## Episode end
    After the single action. ``info["utilities"]`` holds the total reward for that action.

    ## Arguments
    manifest: JSONL with ``id, duration, characters, ad, context`` and ``features`` (``.npy``) or
    ``frames``. context_ratio: share of context-aware instances (READ: 3:1 → 0.75).
    prompt: ``paper`` (Listings 1–2) or ``compact`` (a short prompt for the tiny offline models).
    scorer: folder of the coherence LM (``tools/train_coherence_scorer.py``), or a served one
    ``{url: http://HOST:8000/v1, model: NAME, tokenizer: FOLDER}`` (``agentcap.judges.served``). weights, tau, top_k,
    levels, tolerance, ngram: READ's reward constants. on_error: ``skip`` drops unusable rows and
    counts them; more than ``max_skip_fraction`` stops.

    ## Version history
    v0: first version.
    """

    required_fields = {"id": str, "duration": (int, float), "characters": list, "ad": str, "context": list}
    scoring_fields = frozenset({"ad"})  # the reference AD; inference reads the clip, its cast and context
    #: The reference caption of an item (``agentcap evaluate``).
    reference_field = "ad"
    max_actions = 1  # single step

    def __init__(
        self,
        manifest: str | None = None,
        items: Sequence[dict[str, Any]] | None = None,
        context_ratio: float = 0.75,
        prompt: Literal["paper", "compact"] = "paper",
        scorer: str | dict[str, Any] | None = None,
        scorer_device: str = "cpu",
        weights: Mapping[str, float] | None = None,
        tau: float = 0.12,
        top_k: int = 2,
        levels: Sequence[float] = (1.0, 0.5),
        tolerance: int = 4,
        ngram: int = 3,
        mix_seed: int = 0,
        defer_scoring: bool = False,
        on_error: Literal["raise", "skip"] = "raise",
        max_skip_fraction: float = 0.1,
    ):
        if not 0.0 <= context_ratio <= 1.0:
            raise ValueError(f"context_ratio must be in [0, 1], got {context_ratio}")
        super().__init__(
            manifest=manifest, items=items, defer_scoring=defer_scoring, on_error=on_error,
            max_skip_fraction=max_skip_fraction,
        )
        self.context_ratio = context_ratio
        self.prompt_style = prompt
        self.scorer_path = scorer
        self.scorer_device = scorer_device
        self.weights = dict(weights or {"accuracy": 1.0, "format": 0.08, "length": 0.05, "coherence": 0.05})
        self.tau, self.top_k, self.levels = tau, top_k, tuple(levels)
        self.tolerance, self.ngram, self.mix_seed = tolerance, ngram, mix_seed
        self._scorer = None

    def check_item(self, row: dict[str, Any], where: str) -> None:
        check_duration(row, where)
        if "ad" in row and not (isinstance(row["ad"], str) and row["ad"].strip()):
            raise ManifestError(f"{where}: field 'ad' (the reference AD) is empty")
        if "features" not in row and "frames" not in row:
            raise ManifestError(f"{where}: row needs 'features' (a .npy path) or 'frames'")
        for key in ("features", "frames"):
            if key in row:
                path = resolve(row[key], row["_manifest"])


                if not os.path.isfile(path):
                    raise ManifestError(f"{where}: field {key!r}: file {path!r} not found")

    # --- episode ------------------------------------------------------------------------------
    def uses_context(self, item: Mapping[str, Any]) -> bool:
        if not item.get("context"):
            return False
        if item.get("force_context"):
            return True
        digest = hashlib.sha256(f"{self.mix_seed}:{item['id']}".encode()).digest()
        return digest[0] / 256.0 < self.context_ratio

    def begin(self, episode: Episode) -> dict[str, Any]:
        item = episode.item
        context = list(item["context"][-3:]) if self.uses_context(item) else []
        episode.state["context"] = context
        return self.observation("policy", [{"role": "user", "content": self.prompt(item, context)}], self.media(item))

    def advance(self, episode: Episode, action: str) -> None:
        self.record(episode, "policy", "answer", action)
        return None

    def media(self, item: Mapping[str, Any]) -> dict[str, np.ndarray]:
        manifest = item.get("_manifest")
        if "features" in item:
            return {"features": load_features(resolve(item["features"], manifest), item.get("_where", ""))}
        frames = np.load(resolve(item["frames"], manifest), allow_pickle=False)
        return {"frames": frames.astype(np.uint8)}

    def prompt(self, item: Mapping[str, Any], context: Sequence[str]) -> str:
        duration, names = float(item["duration"]), ", ".join(item["characters"]) or "none"
        if self.prompt_style == "compact":
            lines = [f"Clip {duration:.1f} seconds . Characters : {names} ."]
            lines += [f"[AD] {c}" for c in context]
            lines.append("Describe the clip in one sentence .")
            return " ".join(lines)
        if not context:
            return (
                f"{AD_DEFINITION} The video clip is {duration:.2f} seconds long. Consider the clip duration "
                "when completing the following task.\nPlease provide a concise audio description summarizing "
                "what happens in the video clip in one sentence, focusing on key characters, actions, "
                f"interactions, or important visual details.\nPossible character names are: {names}.\n"
                f"{FORMAT_INSTRUCTION}"
            )
        listed = "\n".join(f"[AD] {c}" for c in context)
        return (
            f"{AD_DEFINITION}\n\nYou are given a video clip with its prior and chronologically ordered "
            f"contexts.\nContext:\n{listed}\n\nTask:\nPlease provide a concise audio description summarizing "
            f"what happens in the target video clip in one sentence. The video clip is {duration:.2f} seconds "
            f"long. Consider the clip duration when summarizing ADs.\nPossible character names are: {names}.\n"
            f"{FORMAT_INSTRUCTION}"
        )

    def demonstrations(self, item: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """The supervised warm start's target: a short think span, then the reference AD."""
        episode = Episode(item=dict(item))
        obs = self.begin(episode)
        names = " , ".join(item["characters"]) or "someone"
        return [(obs, f"<think> {names} </think> <answer> {item['ad']} </answer>")]

    @staticmethod
    def caption_text(response: str) -> str:
        """The AD in a response: its ``<answer>`` span, else the whole stripped text."""
        return extract_answer(response) or response.strip()

    def caption(self, driver: Any, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Recurrent inference (READ §4.5): each clip's context is the model's own previous three ADs.

        Movies advance together, one clip per movie per batched call, ordered by ``position``.
        """
        movies: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            movies.setdefault(str(item.get("movie", item["id"])), []).append(item)
        for clips in movies.values():
            clips.sort(key=lambda c: c.get("position", 0))
        history: dict[str, list[str]] = {m: [] for m in movies}
        results: list[dict[str, Any]] = []
        for step in range(max(len(c) for c in movies.values())):
            names = [m for m, clips in movies.items() if step < len(clips)]
            batch = [
                {**movies[m][step], "context": history[m][-3:], "force_context": True} for m in names
            ]
            rollouts = driver.run(items=batch, greedy=True)
            for movie, item, episode in zip(names, batch, rollouts.episodes):
                response = episode.actions[-1].text
                ad = self.caption_text(response)
                history[movie].append(ad)
                results.append(
                    {"id": item["id"], "movie": movie, "position": item.get("position"), "caption": ad,
                     "context": item["context"], "response": response, "reference": item.get("ad")}
                )
        return results

    def caption_chunks(self, items: Sequence[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
        """Whole movies, ``size`` at a time: a clip's context is its movie's previous ADs."""
        movies: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            movies.setdefault(str(item.get("movie", item["id"])), []).append(item)
        groups = list(movies.values())
        step = max(1, size)
        return [[clip for movie in groups[i : i + step] for clip in movie] for i in range(0, len(groups), step)]

    # --- scoring ------------------------------------------------------------------------------
    @property
    def scorer(self):
        if self._scorer is None and isinstance(self.scorer_path, dict):  # served: {url, model, tokenizer}
            if "tokenizer" not in self.scorer_path:
                raise ValueError("scorer: a served coherence scorer needs `tokenizer:` (the served model's folder)")
            self._scorer = ServedCoherenceScorer(served_judge_client(self.scorer_path, "scorer"),
                                                 self.scorer_path["tokenizer"])
        elif self._scorer is None and self.scorer_path:
            key = judge_key("scorer", self.scorer_path, device=self.scorer_device)
            self._scorer = load_once(key, lambda where: CoherenceScorer.from_pretrained(self.scorer_path, device=where),
                                     self.scorer_device)
        return self._scorer

    def score(self, episodes: Sequence[Episode]) -> list[Score]:
        responses = [e.actions[-1].text if e.actions else "" for e in episodes]
        total, parts = read_rewards(
            responses,
            [e.item["ad"] for e in episodes],
            [e.state.get("context", []) for e in episodes],
            [e.group for e in episodes],
            scorer=self.scorer,
            weights=self.weights,
            tau=self.tau,
            top_k=self.top_k,
            levels=self.levels,
            tolerance=self.tolerance,
            ngram=self.ngram,
        )
        return [
            Score(
                reward=float(total[i]),
                components={k: float(v[i]) for k, v in parts.items()},
                utilities=[float(total[i])],
            )
            for i in range(len(episodes))
        ]
