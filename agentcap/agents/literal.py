"""Text from data stays text: a special-token string inside it never becomes a control token.

A manifest ``context`` or reference, a benchmark question, an Instruct reply or a caption put into a
judge's prompt may contain the tokenizer's special strings (``<|im_end|>``, ``<|im_start|>assistant``,
``</s>``, ``<pad>``). Tokenised as they stand they would forge a chat turn, end an SFT target early
or let a question answer itself. :func:`literal` escapes them *before* any chat template is applied:
an invisible WORD JOINER (U+2060) goes after their first character, so no tokenizer matches them
(the template's own special tokens, written after, still are). Text without such strings is returned
unchanged, so valid input tokenises bit for bit as before.

What is escaped: the tokenizer's special tokens (``all_special_tokens`` and every added token marked
special; added tokens that are plain words, such as Qwen3's ``<think>``, stay), and, for prompts sent
to a server whose tokenizer is not at hand, every ``<|…|>`` string and the usual ``<s>``, ``</s>``,
``<pad>``, ``<unk>``, ``<eos>``, ``<bos>``, ``<mask>``, ``[INST]``, ``[/INST]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

#: Inserted after a special string's first character: invisible, and no tokenizer's special token.
ESCAPE = "\u2060"
#: Special strings of tokenizers not at hand (a served judge's): ``<|…|>`` and the usual names.
GENERIC = r"<\|[^|<>\s]{1,64}\|>|</?s>|<pad>|<unk>|<eos>|<bos>|<mask>|\[/?INST\]"


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special-token strings (longest first); cached on the tokenizer."""
    if tokenizer is None:
        return ()
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    key = len(added)
    cached = getattr(tokenizer, "_agentcap_specials", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    strings = set(getattr(tokenizer, "all_special_tokens", None) or ())
    strings.update(t.content for t in added.values() if getattr(t, "special", False))
    result = tuple(sorted((s for s in strings if s), key=len, reverse=True))
    try:
        tokenizer._agentcap_specials = (key, result)
    except AttributeError:  # a tokenizer that takes no attributes: computed each time
        pass
    return result


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}


def _pattern(strings: tuple[str, ...]) -> re.Pattern[str]:
    pattern = _PATTERNS.get(strings)
    if pattern is None:
        pattern = _PATTERNS[strings] = re.compile("|".join([*map(re.escape, strings), GENERIC]))
    return pattern


def literal(text: str, tokenizer: Any = None) -> str:
    """``text`` with every special-token string escaped (see the module docstring); unchanged when it
    holds none. ``tokenizer`` None: only the generic strings (a served judge's prompt)."""
    strings = special_strings(tokenizer)
    if not any(s[0] in text for s in strings) and "<" not in text and "[" not in text:
        return text
    return _pattern(strings).sub(lambda m: m.group(0)[0] + ESCAPE + m.group(0)[1:], text)


def literal_messages(messages: Sequence[Mapping[str, Any]], tokenizer: Any = None) -> list[dict[str, Any]]:
    """Chat messages whose text contents are :func:`literal` (other fields as they are)."""
    return [{**m, "content": literal(m["content"], tokenizer)} if isinstance(m.get("content"), str) else dict(m)
            for m in messages]
