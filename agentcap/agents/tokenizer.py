"""Tiny word-level tokenizers built offline, for the demo worlds and the tests.

No hub is reachable, so the offline demos cannot download a tokenizer; a word-level vocabulary over
the toy world's own texts is small (hundreds of ids) and makes the tiny models learn in minutes.
The result is a real ``PreTrainedTokenizerFast`` with a chat template, so every code path is the
one a pretrained model takes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
#: Words every chat prompt uses, so role names and tags always have ids.
BASE_WORDS = ("system", "user", "assistant", "think", "answer", "<think>", "</think>", "<answer>", "</answer>")

# ChatML-style: one turn per line, the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|> {{ message['role'] }} {{ message['content'] }} <|im_end|> "
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)

_WORD = re.compile(r"</?\w+>|\d+(?:\.\d+)?|[A-Za-z]+|[^\sA-Za-z\d]")


def words(text: str) -> list[str]:
    """The pre-tokenisation the word tokenizer applies (tags and decimal numbers kept whole)."""
    return _WORD.findall(text)


def build_word_tokenizer(texts: Iterable[str], extra_tokens: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose vocabulary is every word of ``texts`` (sorted, so ids are stable)."""
    vocab_words: set[str] = set(BASE_WORDS) | set(extra_tokens)
    for text in texts:
        vocab_words.update(words(text))
    vocab_words.update(str(d) for d in range(10))
    return word_tokenizer(list(SPECIAL_TOKENS) + sorted(vocab_words - set(SPECIAL_TOKENS)))


def saved_word_tokenizer(path: str, build: Callable[[], PreTrainedTokenizerFast]) -> PreTrainedTokenizerFast:
    """The vocabulary saved at ``path`` (a JSON list of words), else ``build()``'s, saved there.

    A trained run's embedding rows are its vocabulary's ids: rebuilding it from another manifest
    (``agentcap test`` on new data) would give other ids and another size, so a run keeps its own.
    """
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            return word_tokenizer(json.load(handle))
    tokenizer = build()
    ordered = [w for w, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # every process may get here first; each writes the same list
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(ordered, handle)
    os.replace(tmp, path)
    return tokenizer


def word_tokenizer(ordered: list[str]) -> PreTrainedTokenizerFast:
    """The word-level tokenizer whose token ``i`` is ``ordered[i]`` (special tokens first)."""
    vocab = {w: i for i, w in enumerate(ordered)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.NFKC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(_tokenizers_regex(), behavior="isolated")]
    )
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "</s>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def _tokenizers_regex():
    from tokenizers import Regex

    return Regex(_WORD.pattern)
