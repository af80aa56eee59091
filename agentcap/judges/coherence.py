"""The coherence scorer LLM-AD* of READ (§3.3, Eq. 4): masked mean log-prob of an AD given its context.

Any HF causal LM works (GPT-2 class by default), fine-tuned on an AD corpus by
``tools/train_coherence_scorer.py``. The scorer and the tool share :func:`serialize_context` and
:func:`encode_context_response`, so the sequence the scorer reads is exactly the kind of sequence the
model was trained on: ``[bos] c_1 SEP c_2 SEP c_3 SEP o``.

Details the paper leaves open, chosen here:

- The prefix starts with the tokenizer's BOS token (EOS when it has none, as GPT-2's
  ``<|endoftext|>``), so the first context token is conditioned like every other.
- Context ADs and the response are tokenised separately and their ids concatenated; with a newline
  separator this is also how GPT-2's BPE splits the joined string.
- The anti-copy mask (Eq. 4) compares token n-grams of the response with those of the *whole*
  serialized context, even when the context is cut from the left to fit ``max_length``.
- A sequence longer than ``max_length`` drops its oldest context tokens; a response that alone does
  not fit (with BOS and one context token) is cut to its head.
- Identical (context, response) pairs are scored once, so duplicate rollouts tie exactly in Eq. 5.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from agentcap.agents.literal import literal
from agentcap.judges.anti_copy import anti_copy_mask

#: Separator after each context AD; the response follows the last one.
CONTEXT_SEPARATOR = "\n"
_TOOL = "tools/train_coherence_scorer.py"


def serialize_context(contexts: Sequence[str]) -> str:
    """The context sequence c_{1:m} = [c_1; …; c_m] as text: each stripped AD followed by the separator.

    Blank ADs are dropped; a context with no AD serializes to ``""``.
    """
    if isinstance(contexts, str):
        raise TypeError("contexts must be a sequence of AD strings, not one string")
    return "".join(ad.strip() + CONTEXT_SEPARATOR for ad in contexts if ad.strip())


def _prefix_ids(tokenizer) -> list[int]:
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return [] if bos is None else [int(bos)]


def encode_context_response(
    tokenizer, contexts: Sequence[str], response: str, max_length: int | None = None
) -> tuple[list[int], list[int], list[int]]:
    """Token ids of ``(prefix, response, full_context)`` for one query.

    ``prefix`` is BOS plus the serialized context (left-truncated so ``prefix + response`` fits in
    ``max_length``); ``full_context`` is the untruncated context ids, which the anti-copy mask uses.
    """
    # data: special-token strings in an AD stay literal (agentcap.agents.literal)
    context_ids = tokenizer(literal(serialize_context(contexts), tokenizer), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(literal(response.strip(), tokenizer), add_special_tokens=False)["input_ids"]
    bos = _prefix_ids(tokenizer)
    if max_length is not None:
        if max_length < len(bos) + 2:
            raise ValueError(f"max_length={max_length} leaves no room for a context token and a response token")
        room_for_response = max_length - len(bos) - min(1, len(context_ids))
        response_ids = response_ids[:room_for_response]
        room_for_context = max_length - len(bos) - len(response_ids)
        kept_context = context_ids[max(0, len(context_ids) - room_for_context) :] if room_for_context > 0 else []
    else:
        kept_context = context_ids
    return bos + list(kept_context), list(response_ids), list(context_ids)


def _model_max_length(model) -> int:
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1024


class CoherenceScorer:
    """Scores ADs by their anti-copy masked mean log-probability under an AD-tuned causal LM (Eq. 4).

    Args:
        model: a causal LM whose forward takes ``input_ids`` and ``attention_mask`` and returns
            ``.logits`` of shape [B, T, V].
        tokenizer: the model's tokenizer (``PreTrainedTokenizer[Fast]``).
        device: where to run the model; ``None`` keeps it where it is.
        batch_size: queries per forward pass.
        max_length: longest sequence fed to the model; defaults to the model's position limit.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 16,
        max_length: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model if device is None else model.to(device)
        self.model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length or _model_max_length(model)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad_id = int(pad) if pad is not None else 0  # pads are masked out; any id will do

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 16,
        max_length: int | None = None,
    ) -> CoherenceScorer:
        """Load a scorer saved by ``tools/train_coherence_scorer.py`` (``save_pretrained`` layout)."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"no coherence scorer at {str(path)!r} (expected a save_pretrained folder with config.json);"
                f" fine-tune one with `python {_TOOL} --corpus CORPUS.jsonl --base GPT2_DIR --out {path}`"
                f" (or `--tiny --tokenizer TOKENIZER_DIR` for a toy scorer)"
            )
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        except (OSError, ValueError) as error:
            raise FileNotFoundError(
                f"coherence scorer at {str(path)!r} has no loadable tokenizer ({error}); {_TOOL} saves one"
            ) from error
        kwargs = {"trust_remote_code": False}
        if dtype is not None:
            kwargs["dtype"] = dtype
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        return cls(model, tokenizer, device=device, batch_size=batch_size, max_length=max_length)

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except (AttributeError, StopIteration):
            return torch.device("cpu")

    @torch.no_grad()
    def score(self, contexts: Sequence[Sequence[str]], responses: Sequence[str], n: int = 3) -> torch.Tensor:
        """s_i of Eq. 4 for each (context ADs, response AD) pair; NaN when it cannot be scored. [N] float64

        NaN for an empty context (plain clip→AD instances), an empty response, or a response whose
        every token lies in an n-gram copied from the context. One forward pass per ``batch_size``
        distinct queries.
        """
        if isinstance(responses, str):
            raise TypeError("responses must be a sequence of strings, not a single string")
        if len(contexts) != len(responses):
            raise ValueError(f"got {len(contexts)} contexts but {len(responses)} responses")
        scores = torch.full((len(responses),), float("nan"), dtype=torch.float64)
        # distinct query -> (prefix ids, response ids, mask); rows that share a query share its score
        queries: dict[tuple[tuple[str, ...], str], tuple[list[int], list[int], list[int]]] = {}
        rows: dict[tuple[tuple[str, ...], str], list[int]] = {}
        for i, (context, response) in enumerate(zip(contexts, responses)):
            if isinstance(context, str):
                raise TypeError(f"contexts[{i}] must be a sequence of AD strings, not one string")
            key = (tuple(ad.strip() for ad in context if ad.strip()), response.strip())
            if not key[0] or not key[1]:
                continue
            if key not in queries:
                prefix, response_ids, context_ids = encode_context_response(
                    self.tokenizer, key[0], key[1], self.max_length
                )
                mask = anti_copy_mask(response_ids, context_ids, n=n)
                if not prefix or not response_ids or sum(mask) == 0:
                    continue  # nothing to condition on, or nothing left to score
                queries[key] = (prefix, response_ids, mask)
            rows.setdefault(key, []).append(i)
        keys = list(queries)
        for start in range(0, len(keys), self.batch_size):
            chunk = keys[start : start + self.batch_size]
            values = self._masked_mean_logprob([queries[k] for k in chunk])
            for key, value in zip(chunk, values.tolist()):
                scores[rows[key]] = value
        return scores

    def token_counts(self, contexts: Sequence[Sequence[str]], responses: Sequence[str]) -> list[int]:
        """How many tokens of each response the unmasked score averages over (0 where it is NaN);
        the weights of a corpus perplexity."""
        counts = []
        for context, response in zip(contexts, responses):
            key = (tuple(ad.strip() for ad in context if ad.strip()), response.strip())
            if not key[0] or not key[1]:
                counts.append(0)
                continue
            prefix, response_ids, _ = encode_context_response(self.tokenizer, key[0], key[1], self.max_length)
            counts.append(len(response_ids) if prefix else 0)
        return counts

    def _masked_mean_logprob(self, batch: list[tuple[list[int], list[int], list[int]]]) -> torch.Tensor:
        """One right-padded forward pass; Eq. 4 for each (prefix, response, mask) triple. [B]"""
        lengths = [len(prefix) + len(response) for prefix, response, _ in batch]
        width = max(lengths)
        input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        # positions whose *next* token is a scored response token, its id and mask m_t
        rows, positions, targets, weights = [], [], [], []
        for b, (prefix, response, mask) in enumerate(batch):
            ids = prefix + response
            input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[b, : len(ids)] = 1
            for t, (token, keep) in enumerate(zip(response, mask)):
                rows.append(b)
                positions.append(len(prefix) + t - 1)
                targets.append(token)
                weights.append(float(keep))
        device = self.device
        logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
        rows_t = torch.tensor(rows, device=device)
        picked = logits[rows_t, torch.tensor(positions, device=device)].float()  # [K, V]
        token_logprob = picked.log_softmax(-1).gather(-1, torch.tensor(targets, device=device)[:, None])[:, 0]
        weights_t = torch.tensor(weights, dtype=torch.float64, device=device)
        numerator = torch.zeros(len(batch), dtype=torch.float64, device=device)
        denominator = torch.zeros(len(batch), dtype=torch.float64, device=device)
        numerator.index_add_(0, rows_t, weights_t * token_logprob.double())
        denominator.index_add_(0, rows_t, weights_t)
        return (numerator / denominator).cpu()  # Eq. 4
