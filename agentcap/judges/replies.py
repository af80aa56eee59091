"""What a judge's reply must be before it counts as an answer, and how many bad ones a run accepts.

A served judge (``agentcap.judges.served``) may answer nonsense: a letter outside the question's
options ("Z", one past the last option, a lowercase "a"), a reply from another model than the one
asked, a NaN or +Inf log-prob, a body that is not JSON, has no ``choices``, or is larger than
:data:`MAX_REPLY_BYTES`. Such a reply is an *invalid reply*: it is asked again (the client's
``retries``, with its backoff), and one still invalid after that is counted (``judge/invalid`` in the
training metrics, a warning line) and never read as an answer:

- a letters examiner (cloze / MCQ rewards) leaves that question out of the caption's mean; a caption
  none of whose questions got a valid answer stops the run (:class:`TooManyInvalidReplies`);
- the benchmark judge reports the question as ``invalid`` (counted wrong) and does not cache it:
  a rerun asks it again;
- the temporal examiner reads the pair with its rule fallback, as it does an answer without a time;
- the coherence scorer has nothing to stand in for a log-prob: it stops at once.

A judge whose invalid share passes :data:`INVALID_SHARE` (5 %) once it has been asked at least
:data:`MIN_REPLIES` (20) questions stops the run with one line naming the URL, the model and the
share (:class:`TooManyInvalidReplies`). A healthy server gives none: vLLM restricts the answer to the
option letters.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agentcap.parallel.http_client import (  # noqa: F401  (re-exported: the judges' reply rules)
    MAX_REPLY_BYTES,
    Invalid,
    InvalidReply,
    finite_logprob,
    first_choice,
)

#: The share of invalid replies (after retries) above which a judge stops the run.
INVALID_SHARE = 0.05
#: The share is judged only once a judge has answered at least this many questions.
MIN_REPLIES = 20

log = logging.getLogger("agentcap.judges")


class TooManyInvalidReplies(RuntimeError):
    """A judge's share of invalid replies passed :data:`INVALID_SHARE`."""


def message_text(reply: Any) -> str:
    """The assistant text of a chat reply ("" when the server sent none), or :class:`InvalidReply`."""
    message = first_choice(reply).get("message") or {}
    content = message.get("content") if isinstance(message, dict) else None
    if content is not None and not isinstance(content, str):
        raise InvalidReply(f"message.content is not text: {str(content)[:60]!r}")
    return content or ""


def letter_scores(reply: Any, letters: Sequence[str]) -> list[float]:
    """Log-probs of ``letters`` (missing ones −inf) from a one-token chat reply, validated.

    The chosen token (``message.content``, else the first ``logprobs.content`` token) must be one of
    ``letters`` exactly (stripped of spaces); every log-prob a letter is read from must be finite
    (or −inf). A server reporting raw log-probs that name none of the letters: the chosen one wins.
    """
    choice = first_choice(reply)
    logprobs = choice.get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if content is not None and not isinstance(content, list):
        raise InvalidReply(f"logprobs.content is not a list: {str(content)[:60]!r}")
    step = content[0] if content else {}
    if not isinstance(step, dict):
        raise InvalidReply(f"logprobs.content[0] is not an object: {str(step)[:60]!r}")
    chosen = message_text(reply).strip()
    if not chosen:
        chosen = str(step.get("token") or "").strip()
    if chosen not in letters:
        raise InvalidReply(f"answered {chosen[:20]!r}, not one of the options {letters[0]}–{letters[-1]}")
    if "logprob" in step:
        finite_logprob(step["logprob"], "the chosen token's log-prob")
    scores = [float("-inf")] * len(letters)
    top = step.get("top_logprobs") or []
    if not isinstance(top, list):
        raise InvalidReply(f"top_logprobs is not a list: {str(top)[:60]!r}")
    for entry in top:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            raise InvalidReply(f"a top_logprobs entry is not {{token, logprob}}: {str(entry)[:60]!r}")
        letter = entry["token"].strip()
        if letter in letters and scores[letters.index(letter)] == float("-inf"):
            scores[letters.index(letter)] = finite_logprob(entry.get("logprob"), f"the log-prob of {letter!r}")
    if all(s == float("-inf") for s in scores):
        scores[letters.index(chosen)] = 0.0  # a server that reports no log-probs of the letters: its greedy token
    return scores


class ReplyTally:
    """Counts one judge's questions and invalid replies; stops the run past :data:`INVALID_SHARE`."""

    def __init__(self, where: str, share: float = INVALID_SHARE, min_replies: int = MIN_REPLIES):
        self.where, self.share, self.min_replies = where, share, min_replies
        self.asked = self.invalid = 0
        TALLIES.append(self)

    def record(self, results: Sequence[Any]) -> None:
        """Count a call's results (:class:`Invalid` ones are invalid); warn, and stop past the share."""
        bad = [r for r in results if isinstance(r, Invalid)]
        self.asked += len(results)
        self.invalid += len(bad)
        if not bad:
            return
        log.warning("%s: %d of %d replies invalid after retries, not read as answers (%s)",
                    self.where, len(bad), len(results), bad[0].reason)
        if self.asked >= self.min_replies and self.invalid > self.share * self.asked:
            raise TooManyInvalidReplies(
                f"{self.where}: {self.invalid} of {self.asked} replies invalid ({self.invalid / self.asked:.1%}, "
                f"more than {self.share:.0%}; last: {bad[-1].reason}); is the server serving the right model?")


#: Every tally of this process, read by :func:`invalid_metrics`.
TALLIES: list[ReplyTally] = []


def invalid_count() -> int:
    """Invalid replies (after retries) of every judge of this process so far."""
    return sum(t.invalid for t in TALLIES)
