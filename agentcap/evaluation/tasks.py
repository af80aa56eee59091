"""The metrics each paper reports for its task, computed on finished captions.

Every task gets the captioning metrics (:mod:`agentcap.evaluation.captioning`); the rest follow
from what the environment and its items carry:

- ``recall@5/16``, ``recall@1/5`` (READ): items with ``movie`` and ``position``.
- ``logp``, ``masked_logp``, ``ppl`` (READ Tab. 3): an environment with a coherence ``scorer``;
  each AD is scored given the context it was written with (a prediction row's ``context``: READ's
  recurrent inference feeds the model's own previous ADs; else the item's). ``logp`` is the mean
  token log-probability, ``masked_logp`` Eq. 4 (anti-copy masked), ``ppl`` the corpus perplexity:
  exp of the mean negative log-probability over every scored token of every AD (not a mean of
  per-AD perplexities, which a few outliers decide). ADs without context (a movie's first clip) are
  not scored, as in Eq. 4.
- ``cloze_accuracy`` and ``esr`` (AudioMap), ``mcq_accuracy`` and ``g2p`` (ACE-Cap): an
  environment with an ``examiner`` and items with a question bank; the configured examiner answers
  from the caption alone; accuracy is the share answered correctly, ``esr`` / ``g2p`` the mean of
  Eq. 3's +1 / −0.5 / −1.
- ``tiou`` (AudioMap): an environment with a ``temporal`` examiner and items with ``anchors``: the
  mean over captions of the mean tIoU over their event anchors (Eq. 5, a missing interval scores 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentcap.evaluation.captioning import CaptionMetrics
from agentcap.evaluation.retrieval import recall_at_k
from agentcap.judges.questions import question_bank
from agentcap.rewards.functional.cloze import answer_scores, event_temporal_reward

#: READ's two retrieval settings, (k, N).
RECALLS = ((5, 16), (1, 5))
#: An n-gram longer than any AD: no token is masked, so the score is the plain mean log-prob.
_NO_MASK = 1_000_000


class MissingReferenceError(ValueError):
    """An item without the reference text the captioning metrics need (named by file:line)."""


def reference_field(env: Any) -> str:
    """The manifest field holding an item's reference caption (READ: ``ad``)."""
    return getattr(env, "reference_field", "caption")


def references_of(env: Any, item: Mapping[str, Any]) -> list[str]:
    """Every reference text of an item, as the COCO caption tools score against all of them: the
    reference field (``caption``; READ: ``ad``) first, then those of its plural list (``captions``:
    Clotho's five, AudioCaps' several, as ``agentcap data convert`` writes them), each text once."""
    field = reference_field(env)
    texts = [str(item[field])] if item.get(field) is not None else []
    more = item.get(field + "s")
    if isinstance(more, list):
        texts += [t for t in more if isinstance(t, str) and t.strip()]
    return list(dict.fromkeys(t for t in texts if t.strip())) or texts


def question_field(env: Any) -> str:
    return "mcq" if "mcq" in getattr(env, "required_fields", {}) else "cloze"


def caption_text(env: Any, text: str) -> str:
    """The caption in an action's text (READ: the ``<answer>`` span; elsewhere the text itself)."""
    extract = getattr(env, "caption_text", None)
    return extract(text) if extract is not None else text.strip()


#: The fields of an evaluation row that are not averaged values.
ROW_TEXT_FIELDS = ("id", "caption", "reference", "context", "trace")


def item_row(env: Any, index: int, episode: Any, score: Any) -> dict[str, Any]:
    """One evaluated item (``env.items[index]``) as a row of ``<run_dir>/eval/<stage>.jsonl``, of
    the captions table and of ``task_metrics``' input: id, caption, reference, the reward, each
    component and each numeric episode extra under its ``summary.json`` name (as floats), READ's
    context and ACE-Cap's evidence trace."""
    values = {**score.components, **{k: v for k, v in score.extras.items() if isinstance(v, (int, float))}}
    clash = sorted(set(values) & set(ROW_TEXT_FIELDS))
    if clash:
        raise ValueError(f"{type(env).__name__}: reward component or episode extra named {clash}; "
                         f"{list(ROW_TEXT_FIELDS)} name an evaluation row's own fields, rename it")
    item = episode.item
    response = episode.actions[-1].text if episode.actions else ""
    row: dict[str, Any] = {
        "id": str(env.items[index].get("id", index)),
        "caption": caption_text(env, response),
        "reference": item.get(reference_field(env)),
        "reward": float(score.reward),
        **{k: float(v) for k, v in values.items()},
    }
    if "context" in episode.state:
        row["context"] = list(episode.state["context"])
    if len(episode.actions) > 1:  # multi-turn (ACE-Cap): the evidence trace
        row["trace"] = "\n".join(f"{a.agent}/{a.kind}: {a.text}" for a in episode.actions)
    return row


def check_references(env: Any, items: Sequence[Mapping[str, Any]]) -> None:
    """Refuse items without the reference text (before any captioning is spent on them)."""
    field = reference_field(env)
    for item in items:
        if field not in item:
            raise MissingReferenceError(
                f"{item.get('_where', type(env).__name__ + ' item ' + repr(item.get('id')))}: no field {field!r} "
                f"(the reference text the captioning metrics compare with; the row has "
                f"{sorted(k for k in item if not k.startswith('_'))}). Set `reference_field` on the environment "
                f"to the field that holds it (a class attribute, e.g. reference_field = \"answer\"), or add "
                f"{field!r} to every row."
            )


def task_metrics(
    env: Any, items: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], captioning: CaptionMetrics
) -> dict[str, float]:
    """Every metric of the task for ``rows[i]["caption"]`` written for ``items[i]``."""
    if len(items) != len(rows):
        raise ValueError(f"got {len(items)} items but {len(rows)} prediction rows")
    captions = [str(r.get("caption") or "") for r in rows]
    check_references(env, items)
    references = [references_of(env, item) for item in items]
    result = captioning(captions, references)
    if items and all("movie" in item and "position" in item for item in items) and captioning.use_bertscore:
        similarity = lambda hyps, refs: captioning.bertscore(hyps, refs)  # noqa: E731
        for k, n in RECALLS:
            result[f"recall@{k}/{n}"] = recall_at_k(
                captions, [r[0] for r in references], [i["movie"] for i in items],
                [float(i["position"]) for i in items], k, n, similarity,
            )
    if getattr(env, "scorer", None) is not None:
        contexts = [list(r["context"]) if r.get("context") is not None else list(i.get("context", []))
                    for r, i in zip(rows, items)]
        result.update(coherence_metrics(env.scorer, contexts, captions, getattr(env, "ngram", 3)))
    if getattr(env, "examiner", None) is not None:
        result.update(question_metrics(env, items, captions))
    if getattr(env, "temporal", None) is not None and items and all(i.get("anchors") for i in items):
        result["tiou"] = float(event_temporal_reward(captions, [i["anchors"] for i in items], env.temporal).mean())
    return result


def coherence_metrics(scorer: Any, contexts: Sequence[Sequence[str]], captions: Sequence[str], ngram: int) -> dict[str, float]:
    """LogP, Masked LogP (Eq. 4) and PPL under the coherence scorer (READ Tab. 3)."""
    plain = scorer.score(contexts, captions, n=_NO_MASK).tolist()
    masked = scorer.score(contexts, captions, n=ngram).tolist()
    scored = [v for v in plain if not math.isnan(v)]
    kept = [v for v in masked if not math.isnan(v)]
    if not scored:
        return {}
    # a served scorer builds its queries with a local CoherenceScorer (``_local``): the same token counts
    counter = getattr(scorer, "token_counts", None) or getattr(getattr(scorer, "_local", None), "token_counts", None)
    counts = counter(contexts, captions) if counter is not None else [1] * len(plain)
    pairs = [(v, n) for v, n in zip(plain, counts) if not math.isnan(v) and n > 0] or [(v, 1) for v in scored]
    return {
        "logp": sum(scored) / len(scored),
        "masked_logp": sum(kept) / len(kept) if kept else float("nan"),
        "ppl": corpus_perplexity([v for v, _ in pairs], [n for _, n in pairs]),
    }


def corpus_perplexity(mean_logprobs: Sequence[float], token_counts: Sequence[int]) -> float:
    """exp(−Σ_i n_i·logp_i / Σ_i n_i): exp of the mean token NLL over every token of the corpus, from
    each text's mean token log-probability ``logp_i`` over its ``n_i`` tokens."""
    total = sum(token_counts)
    if not total:
        return float("nan")
    return math.exp(-sum(v * n for v, n in zip(mean_logprobs, token_counts)) / total)


def question_metrics(env: Any, items: Sequence[Mapping[str, Any]], captions: Sequence[str]) -> dict[str, float]:
    """Question accuracy and the mean answer score (ESR / G2P), per caption then averaged."""
    field = question_field(env)
    texts, questions, owner = [], [], []
    for i, (item, caption) in enumerate(zip(items, captions)):
        for q in question_bank(item, field):
            texts.append(caption)
            questions.append(q)
            owner.append(i)
    if not questions:
        return {}
    letters = env.examiner.answer(texts, questions)
    scores = answer_scores(letters, [q.answer for q in questions], **getattr(env, "answer_scores", {})).tolist()
    per_caption: dict[int, list[tuple[float, float]]] = {}
    for i, letter, q, score in zip(owner, letters, questions, scores):
        if letter is not None:  # an invalid examiner reply is left out (agentcap.judges.replies)
            per_caption.setdefault(i, []).append((float(letter == q.answer), score))
    if not per_caption:
        return {}
    accuracy = [sum(a for a, _ in v) / len(v) for v in per_caption.values()]
    mean_score = [sum(s for _, s in v) / len(v) for v in per_caption.values()]
    name = "esr" if field == "cloze" else "g2p"
    return {f"{field}_accuracy": sum(accuracy) / len(accuracy), name: sum(mean_score) / len(mean_score)}
