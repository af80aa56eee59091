"""READ's LLM-AD-Eval (READ §B.3, after AutoAD III, Han et al. 2024): an LLM judge scores each
generated AD against its reference AD on a scale from 1 to 5; the metric is the mean.

The judge is a served chat model (``vllm serve``, any OpenAI-compatible ``/v1``), asked greedily
with one fixed prompt (:data:`SYSTEM`, :data:`USER`, version :data:`PROMPT_VERSION`; our wording of
the published protocol: match of actions, objects and interactions, synonyms and pronouns count).
The reply is parsed for the score (:func:`parse_score`); a reply without a score from 1 to 5 is
counted and reported (``llm_ad_eval_unparsable``), never dropped silently, and left out of the mean.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentcap.agents.literal import literal
from agentcap.judges.served import ServedClient

PROMPT_VERSION = "llm-ad-eval-v1"
SYSTEM = (
    "You evaluate generated movie audio descriptions (ADs). Compare the predicted AD with the reference "
    "AD and judge how well they match, mainly in what is seen: actions, objects, characters and their "
    "interactions. Count synonyms and paraphrases as matches, and a pronoun or another name for the same "
    "character as a match. Specific details that match count more than generic statements."
)
USER = (
    "Reference AD: {reference}\nPredicted AD: {prediction}\n\n"
    "Rate the match with one integer from 1 (nothing matches) to 5 (a complete match). "
    'Reply only with the score, as {{"score": N}}.'
)
LOW, HIGH = 1, 5
_KEYED = re.compile(r"score\W{0,4}(\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w./])(\d+(?:\.\d+)?)(?![\w/]|\.\d)")


def parse_score(reply: str) -> int | None:
    """The score in a judge reply: the number after "score" if there is one, else the only number in
    the reply; None when absent, ambiguous, not an integer or outside 1–5."""
    keyed = _KEYED.search(reply)
    if keyed:
        text = keyed.group(1)
    else:
        numbers = _NUMBER.findall(reply)
        if len(numbers) != 1:
            return None
        text = numbers[0]
    if "." in text:
        return None
    value = int(text)
    return value if LOW <= value <= HIGH else None


def messages(prediction: str, reference: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": literal(USER.format(reference=reference, prediction=prediction))}]


def llm_ad_eval(
    client: ServedClient, predictions: Sequence[str], references: Sequence[str], max_tokens: int = 16
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(summary values, one ``{"llm_ad_eval": score or None, "llm_ad_eval_reply": text}`` per AD)."""
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions but {len(references)} references")
    payloads = [{"model": client.model, "messages": messages(p, r), "max_tokens": max_tokens, "temperature": 0.0}
                for p, r in zip(predictions, references)]
    replies = [(reply["choices"][0].get("message") or {}).get("content") or ""
               for reply in client.map("/chat/completions", payloads)]
    scores = [parse_score(text) for text in replies]
    kept = [s for s in scores if s is not None]
    summary = {
        "llm_ad_eval": sum(kept) / len(kept) if kept else float("nan"),
        "llm_ad_eval_scored": float(len(kept)),
        "llm_ad_eval_unparsable": float(len(scores) - len(kept)),
    }
    return summary, [{"llm_ad_eval": s, "llm_ad_eval_reply": text} for s, text in zip(scores, replies)]
