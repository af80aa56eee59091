"""READ's Recall@k/N: can a generated AD be told apart from the ground-truth ADs around it?

For each generated AD, the candidates are N temporally adjacent ground-truth ADs of the same movie
(its own among them); they are ranked by BERTScore F1 against the generated AD, and the AD counts
as retrieved when its own ground truth ranks within the top k (READ §B.3, after AutoAD-II). READ
reports R@5/16 and R@1/5.

Details the papers leave open, chosen here:

- The window is the N consecutive ADs of the movie (ordered by ``position``) most centred on the
  target; near a movie's start or end it shifts so it still holds N; a movie with fewer than N ADs
  uses all of them.
- A candidate outranks the ground truth only with a strictly higher score, so an identical
  ground-truth sentence elsewhere in the window (the same words, hence the same score) does not
  count against the prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def neighbour_windows(movies: Sequence[str], positions: Sequence[float], n: int) -> list[list[int]]:
    """For each AD, the indices of the N ADs of its movie around it (itself included)."""
    if n < 1:
        raise ValueError(f"N must be >= 1, got {n}")
    by_movie: dict[str, list[int]] = {}
    for i, movie in enumerate(movies):
        by_movie.setdefault(str(movie), []).append(i)
    windows: list[list[int]] = [[] for _ in movies]
    for members in by_movie.values():
        members.sort(key=lambda i: (positions[i], i))
        size = min(n, len(members))
        for rank, i in enumerate(members):
            start = min(max(rank - (size - 1) // 2, 0), len(members) - size)
            windows[i] = members[start : start + size]
    return windows


def recall_at_k(
    predictions: Sequence[str],
    references: Sequence[str],
    movies: Sequence[str],
    positions: Sequence[float],
    k: int,
    n: int,
    similarity: Callable[[Sequence[str], Sequence[str]], torch.Tensor],
) -> float:
    """R@k/N over all predictions; ``similarity(hyps, refs)`` scores pairs (BERTScore F1), [P]."""
    if not len(predictions) == len(references) == len(movies) == len(positions):
        raise ValueError("predictions, references, movies and positions must have the same length")
    if not predictions:
        return float("nan")
    windows = neighbour_windows(movies, positions, n)
    hyps = [predictions[i] for i, window in enumerate(windows) for _ in window]
    refs = [references[j] for window in windows for j in window]
    scores = similarity(hyps, refs).tolist()
    hits, start = 0, 0
    for i, window in enumerate(windows):
        mine = scores[start : start + len(window)]
        own = mine[window.index(i)]
        hits += int(sum(s > own for s in mine) < k)
        start += len(window)
    return hits / len(predictions)
