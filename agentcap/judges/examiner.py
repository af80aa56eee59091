"""Cloze / MCQ examiners: a frozen judge that reads ONLY a caption and answers a question about it.

The evidence rewards (AudioMap ESR, Eq. 2–3; ACE-Cap G2P, Eq. 2–3) need one letter A–E per
(caption, question) pair. Every examiner is pairwise: caption i answers question i, so a reward
can flatten a whole batch of banks into one call.

- :class:`LLMExaminer` — any HF causal LM. By default it reads the next-token logits at the
  answer position restricted to the five letter ids, in one forward pass per batch: no free
  generation, hence no parsing failures, and the cost is one prompt encoding per question. Models
  too small to bind option text to its letter (135M-class) can use ``readout="options"`` instead,
  which scores each option's text in the passage — still forward passes only.
- :class:`RuleExaminer` — deterministic string matching, for the offline toy worlds ONLY (their
  captions are templated, so matching attribute words is an exact judge there). It is not a
  substitute for an LLM judge on real captions.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from agentcap.core.manifests import ManifestError
from agentcap.judges.prefix import PrefixReader
from agentcap.parallel.distributed import world
from agentcap.parallel.lockstep import FORWARD, GENERATE, announce_pass, stand_in_passes
from agentcap.parallel.sharding import is_sharded
from agentcap.rewards.evidence import EVIDENCE_PREAMBLE, QUESTION_LABEL

LETTERS = ("A", "B", "C", "D", "E")
GOLD_LETTERS = LETTERS[:4]
NOT_GIVEN = "Not given"
#: A cloze blank: three or more underscores.
BLANK = re.compile(r"_{3,}")

INSTRUCTION = (
    "Read the caption and answer the question using only what the caption says. "
    "Choose A, B, C or D only if the caption explicitly states or clearly entails that option; "
    "otherwise choose E (Not given). Reply with a single letter."
)


# --- questions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    """One cloze / MCQ item: a passage with a blank, options A–E (E is "Not given"), a gold in A–D.

    ``meta`` is free-form (the toy worlds put ``subject`` / ``attribute`` / ``event`` there); it
    takes part in equality but not in the hash, so a question stays usable as a dict key.
    """

    passage: str
    options: tuple[str, ...]
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _check_question(self.passage, self.options, self.answer, self.meta, "Question")

    @classmethod
    def from_row(cls, row: Mapping[str, Any], where: str = "") -> "Question":
        """Build from a manifest row; a bad row raises ``ManifestError`` naming ``where``, field, value."""
        where = where or "question"
        if not isinstance(row, Mapping):
            raise ManifestError(f"{where}: a question must be a JSON object, got {row!r}")
        for name in ("passage", "options", "answer"):
            if name not in row:
                raise ManifestError(f"{where}: question is missing field {name!r} (has {sorted(row)})")
        options = row["options"]
        if not isinstance(options, (list, tuple)):
            raise ManifestError(f"{where}: field 'options' must be a list of 5 strings, got {options!r}")
        answer = row["answer"]
        if isinstance(answer, str):
            answer = answer.strip().upper()
        meta = row.get("meta") or {}
        _check_question(row["passage"], tuple(options), answer, meta, where)
        return cls(row["passage"], tuple(options), answer, dict(meta))

    def prompt_text(self) -> str:
        """The passage followed by the lettered options, as the examiner reads it."""
        lines = [self.passage] + [f"{letter}. {text}" for letter, text in zip(LETTERS, self.options)]
        return "\n".join(lines)


def question_bank(item: Mapping[str, Any], field: str = "cloze") -> list[Question]:
    """The item's parsed question bank (``field``: ``cloze`` for AudioMap, ``mcq`` for ACE-Cap): parsed
    on load from a manifest (``_questions``), parsed here from ``item[field]`` (and kept under a key
    of that field) for items handed over directly (``items=``); empty for an unlabelled item."""
    questions = item.get("_questions")
    if questions is None:
        cache = f"_questions:{field}"
        questions = item.get(cache)
        if questions is None:
            where = str(item.get("_where") or item.get("id", "item"))
            rows = item.get(field) or []
            questions = [Question.from_row(q, f"{where}: {field}[{j}]") for j, q in enumerate(rows)]
            if isinstance(item, dict):
                item[cache] = questions
    return list(questions)


def question_problems(passage: Any, options: Sequence[Any], answer: Any, meta: Any = None) -> list[str]:
    """Every reason a cloze / MCQ item is unusable, each naming the field and the bad value."""
    problems = []
    if not isinstance(passage, str) or not passage.strip():
        problems.append(f"field 'passage' must be a non-empty string, got {passage!r}")
    if len(options) != 5:
        problems.append(
            f"field 'options' must hold exactly 5 options (A–D and E='{NOT_GIVEN}'), "
            f"got {len(options)}: {list(options)!r}"
        )
    texts = [t.strip().lower() if isinstance(t, str) else None for t in options]
    for letter, text, raw in zip(LETTERS, texts, options):
        if not text:
            problems.append(f"field 'options' option {letter} must be a non-empty string, got {raw!r}")
    if len(options) == 5 and texts[4] is not None and texts[4] != NOT_GIVEN.lower():
        problems.append(f"field 'options' option E must be {NOT_GIVEN!r}, got {options[4]!r}")
    seen: dict[str, str] = {}
    for letter, text, raw in zip(LETTERS, texts, options):
        if text and text in seen:
            problems.append(f"field 'options' has a duplicate option {raw!r} (options {seen[text]} and {letter})")
        elif text:
            seen[text] = letter
    if answer == "E":
        problems.append(
            f"field 'answer' is 'E', but E is '{NOT_GIVEN}' and can never be the gold answer; "
            "the gold must be one of A, B, C, D"
        )
    elif answer not in GOLD_LETTERS:
        problems.append(f"field 'answer' must be one of A, B, C, D, got {answer!r}")
    if meta is not None and not isinstance(meta, Mapping):
        problems.append(f"field 'meta' must be an object, got {meta!r}")
    return problems


def _check_question(passage: Any, options: Sequence[Any], answer: Any, meta: Any, where: str) -> None:
    problems = question_problems(passage, options, answer, meta)
    if problems:
        raise ManifestError(f"{where}: " + "; ".join(problems))


# --- the protocol --------------------------------------------------------------------------------
@runtime_checkable
class Examiner(Protocol):
    """Answers question i from caption i only; returns one letter "A".."E" per pair."""

    def answer(self, captions: Sequence[str], questions: Sequence[Question]) -> list[str]: ...


def _check_pairs(captions: Sequence[str], others: Sequence[Any], what: str) -> None:
    if len(captions) != len(others):
        raise ValueError(f"examiner is pairwise: got {len(captions)} captions but {len(others)} {what}")
    for i, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise TypeError(f"caption {i} must be a string, got {type(caption).__name__}: {caption!r}")


# --- the deterministic toy-world examiner --------------------------------------------------------
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*;\s*|\n+")


def sentences(text: str) -> list[str]:
    """Sentences (and ";"-separated parts) of a caption; a decimal point ("0.5 s") ends none."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _word_pattern(phrase: str, plural: bool = False) -> re.Pattern[str]:
    words = r"\s+".join(re.escape(w) for w in phrase.split())
    suffix = r"(?:e?s)?" if plural else ""
    return re.compile(rf"(?<![\w-]){words}{suffix}(?![\w-])", re.IGNORECASE)


class RuleExaminer:
    """Deterministic judge for the offline toy worlds ONLY (templated captions, attribute words).

    With ``meta["subject"]`` (e.g. "beep"), only the caption sentences that mention the subject
    (whole word, plural allowed) are read; without it, the whole caption is. Options A–D are
    searched as whole words, longest first, and a shorter option inside an already matched longer
    one does not count ("very high" hides its "high"). Exactly one option found → its letter; none,
    or a subject the caption never mentions → "E"; several → the one found first in the text.
    Lines of a serialised evidence state that carry a question (ACE-Cap's ser(E)) are not read:
    questions are non-assertive, so only the initial caption and the answers count as evidence.
    """

    def answer(self, captions: Sequence[str], questions: Sequence[Question]) -> list[str]:
        _check_pairs(captions, questions, "questions")
        return [self._answer_one(c, q) for c, q in zip(captions, questions)]

    def _answer_one(self, caption: str, question: Question) -> str:
        caption = "\n".join(
            line for line in caption.splitlines() if not line.startswith((QUESTION_LABEL, EVIDENCE_PREAMBLE))
        )
        subject = question.meta.get("subject") if question.meta else None
        if subject:
            pattern = _word_pattern(str(subject), plural=True)
            text = " ".join(s for s in sentences(caption) if pattern.search(s))
        else:
            text = caption
        if not text.strip():
            return "E"
        claimed: list[tuple[int, int]] = []
        first_at: dict[str, int] = {}
        order = sorted(range(4), key=lambda k: -len(question.options[k]))
        for k in order:
            for match in _word_pattern(question.options[k]).finditer(text):
                span = match.span()
                if any(span[0] < end and start < span[1] for start, end in claimed):
                    continue
                claimed.append(span)
                first_at.setdefault(LETTERS[k], span[0])
        if not first_at:
            return "E"
        return min(first_at, key=lambda letter: first_at[letter])


# --- HF causal LM plumbing shared by the LLM judges ---------------------------------------------
def load_causal_lm(
    path: str | os.PathLike,
    gguf_file: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    cache_dir: str | os.PathLike | None = None,
):
    """(model, tokenizer) from a local folder, optionally from a GGUF file inside it.

    A GGUF checkpoint is de-quantised at every load (tens of seconds on a CPU), and transformers
    refuses to ``save_pretrained`` a model loaded through its GGUF quantizer even when every weight
    is already dense. With ``cache_dir``, the dense model is saved there once (written to a
    temporary folder, then renamed, so concurrent first loads do not collide) and later loads read
    that copy in well under a second; a ``cache_dir`` belongs to one GGUF file (it is not checked
    against the source). Without ``gguf_file`` the folder is read as is. ``trust_remote_code``
    stays off.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(dtype, str) and dtype != "auto":  # "auto": the checkpoint's own dtype
        dtype = getattr(torch, dtype)
    dtype = dtype or torch.float32
    source = Path(path)
    if gguf_file is not None and cache_dir is not None and (Path(cache_dir) / "config.json").is_file():
        source, gguf_file = Path(cache_dir), None
    if not source.exists():
        raise FileNotFoundError(f"model folder {str(source)!r} not found (no hub download is attempted)")
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    if gguf_file and cache_dir is not None:
        _save_dense_copy(model, tokenizer, Path(cache_dir))
    return model.to(device).eval(), tokenizer


def _save_dense_copy(model, tokenizer, target: Path) -> None:
    packed = [type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()]
    if packed:  # weights still in GGUF blocks: there is no dense copy to write
        return
    # The weights are plain tensors; only the loader's bookkeeping marks the model as quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    except OSError:  # another process renamed its copy first; theirs is as good as ours
        shutil.rmtree(staging, ignore_errors=True)


def collective_call(method):
    """A judge call that every process makes together when the judge is sharded: afterwards a
    process runs stand-in passes while any other still has passes of its own
    (:func:`agentcap.parallel.lockstep.stand_in_passes`)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        if self.sharded:
            stand_in_passes(self._stand_in_forward, self._stand_in_generate)
        return out

    return call


class CausalLMJudge:
    """A frozen causal LM that reads prompts: chat template when the tokenizer has one, plain text
    otherwise; left padding with explicit position ids, so a batched row equals the row alone.

    Every pass goes through :meth:`forward` or :meth:`generate_ids`, so that a sharded judge
    (:mod:`agentcap.judges.pool`) can keep the processes' passes in step."""

    def __init__(self, model, tokenizer, batch_size: int = 32):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def sharded(self) -> bool:
        """True when the model is sharded over several processes: each public call is then a collective."""
        return world()[1] > 1 and is_sharded(self.model)

    def forward(self, **inputs):
        if self.sharded:
            announce_pass(FORWARD)
        return self.model(**inputs)

    def generate_ids(self, **inputs) -> torch.Tensor:
        if self.sharded:
            announce_pass(GENERATE)
        return self.model.generate(**inputs, synced_gpus=self.sharded)

    def _stand_in_forward(self) -> None:
        self.model(input_ids=torch.tensor([[self.pad_id]], device=self.device))

    def _stand_in_generate(self) -> None:
        one = torch.tensor([[self.pad_id]], device=self.device)
        self.model.generate(input_ids=one, attention_mask=torch.ones_like(one), max_new_tokens=1, do_sample=False,
                            pad_token_id=self.pad_id, synced_gpus=True)

    def render(self, user_text: str, answer_cue: str = "Answer:") -> str:
        """The full prompt; the model's next token starts the answer."""
        if self.chat:
            messages = [{"role": "user", "content": user_text}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{user_text}\n{answer_cue}"

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        # A chat template writes its own special tokens; a plain prompt gets the tokenizer's (BOS).
        return [self.tokenizer(p, add_special_tokens=not self.chat).input_ids for p in prompts]

    def batch_tensors(self, ids: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, x in enumerate(ids):
            input_ids[row, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[row, width - len(x) :] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    def batches(self, ids: Sequence[Sequence[int]]):
        """Index groups of at most ``batch_size``, similar lengths together (less padding)."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), self.batch_size):
            yield order[start : start + self.batch_size]

    @torch.inference_mode()
    @collective_call
    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations (new text only), batched."""
        ids = self.encode(prompts)
        out: list[str] = [""] * len(prompts)
        # stop at the model's end of turn and at the tokenizer's EOS; they can differ (SmolLM2's GGUF
        # tokenizer calls <|im_start|> its EOS while the model ends turns with <|im_end|>)
        stops = self.model.generation_config.eos_token_id
        stops = [stops] if isinstance(stops, int) else list(stops or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in stops:
            stops.append(self.tokenizer.eos_token_id)
        for group in self.batches(ids):
            batch = self.batch_tensors([ids[i] for i in group])
            new = self.generate_ids(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=self.pad_id,
                eos_token_id=stops or None,
            )[:, batch["input_ids"].shape[1] :]
            texts = self.tokenizer.batch_decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            for row, i in enumerate(group):
                out[i] = texts[row]
        return out


def _unique(keys: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """Distinct keys in first-seen order, and for each input the index of its distinct key."""
    index: dict[Any, int] = {}
    inverse = [index.setdefault(k, len(index)) for k in keys]
    return list(index), inverse


def distinct_pairs(
    captions: Sequence[str], questions: Sequence[Question]
) -> tuple[list[tuple[str, Question]], torch.Tensor]:
    """The distinct (caption, question) pairs in first-seen order, and for each input pair the index
    of its distinct pair: a letter examiner asks each distinct pair once. A question's ``meta`` never
    reaches the prompt, so it does not split otherwise identical pairs."""
    keys = [(c, q.passage, q.options) for c, q in zip(captions, questions)]
    distinct, inverse = _unique(keys)
    pair_of = dict(zip(keys, zip(captions, questions)))
    return [pair_of[key] for key in distinct], torch.tensor(inverse, dtype=torch.long)


def letters_question(caption: str, question: Question) -> str:
    """The user turn of the letters readout: instruction, caption, question with options A–E."""
    return f"{INSTRUCTION}\n\nCaption: {caption}\n\nQuestion: {question.prompt_text()}"


_LETTER_IN_TEXT = re.compile(r"(?<![A-Za-z])([A-E])(?![A-Za-z])")


def parse_letter(text: str) -> str | None:
    """The first standalone capital A–E in a generated answer, or None."""
    match = _LETTER_IN_TEXT.search(text)
    return match.group(1) if match else None


# --- the LLM examiner -----------------------------------------------------------------------------
class LLMExaminer(CausalLMJudge):
    """A frozen causal LM answering cloze / MCQ items from a caption alone (AudioMap Eq. 2).

    Nothing but the caption and the question reaches the model (no audio, no gold caption), no
    text is generated, so there are no parsing failures, and identical (caption, question) pairs
    are scored once. Two readouts:

    ``readout="letters"`` (default; the paper's judge) — an instruction, the caption and the
    lettered options; the answer is the argmax of the next-token logits restricted to the ids of
    A–E. The prompts are read as a prefix tree (:mod:`agentcap.judges.prefix`): the shared
    instruction once, each distinct caption once, the sentence that several of its questions
    quote once, then only each question's own tokens on top of that KV cache
    (``share_prefix=False``: one full pass per prompt). Tokenizers differ on whether the answer is "A" or
    " A" (chat templates end in "\n" or a space, a plain prompt in "Answer:"); the ids used are
    those the tokenizer produces for the letter appended to a real prompt — the first token after
    the prompt's own ids — trying no gap first after whitespace and one space first otherwise, and
    keeping the first variant that leaves the prompt's ids intact and gives five distinct known ids.
    They are found once: every prompt ends in the same template tail.

    ``readout="options"`` (our addition, for small models) — letter-choice MCQ needs a judge that
    binds option text to its letter, which small LMs do at chance (SmolLM2-135M-Instruct: 25 % on
    rotated items whatever the caption says). This readout scores each option A–D by the
    log-likelihood of the passage continued with that option after "Caption: <caption>", minus the
    same with an empty caption (how much the caption supports the option); the best option wins if
    that gain is at least ``margin`` nats, otherwise the answer is E. An empty caption therefore
    always gets E. It costs four short rows per pair (the empty-caption rows are shared by every
    caption of a question), one forward pass per batch of rows.
    """

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 32,
        readout: Literal["letters", "options"] = "letters",
        margin: float = 2.0,
        share_prefix: bool = True,
    ):
        super().__init__(model, tokenizer, batch_size)
        self.share_prefix = share_prefix
        if readout not in ("letters", "options"):
            raise ValueError(f"readout must be 'letters' or 'options', got {readout!r}")
        self.readout = readout
        self.margin = margin
        self.letter_ids: list[int] | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        gguf_file: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        batch_size: int = 32,
        cache_dir: str | os.PathLike | None = None,
        readout: Literal["letters", "options"] = "letters",
        margin: float = 2.0,
    ) -> "LLMExaminer":
        model, tokenizer = load_causal_lm(path, gguf_file=gguf_file, device=device, dtype=dtype, cache_dir=cache_dir)
        return cls(model, tokenizer, batch_size=batch_size, readout=readout, margin=margin)

    def answer(self, captions: Sequence[str], questions: Sequence[Question]) -> list[str]:
        if self.readout == "letters":
            return [LETTERS[k] for k in self.letter_logits(captions, questions).argmax(dim=1).tolist()]
        gains = self.option_gains(captions, questions)
        best = gains.max(dim=1)
        return [LETTERS[k] if g >= self.margin else "E" for g, k in zip(best.values.tolist(), best.indices.tolist())]

    # --- letters -------------------------------------------------------------------------------
    def prompt(self, caption: str, question: Question) -> str:
        return self.render(letters_question(caption, question))

    def find_letter_ids(self, prompt: str) -> list[int]:
        base = self.encode([prompt])[0]
        unk = getattr(self.tokenizer, "unk_token_id", None)
        # after whitespace the letter follows directly; after "Answer:" it is the word " A"
        gaps = ("", " ") if prompt[-1:].isspace() else (" ", "")
        for gap in gaps:
            ids = []
            for letter in LETTERS:
                full = self.encode([prompt + gap + letter])[0]
                if len(full) <= len(base) or full[: len(base)] != base:
                    break
                ids.append(full[len(base)])
            if len(ids) == 5 and len(set(ids)) == 5 and unk not in ids:
                return ids
        raise ValueError(
            "cannot find five distinct token ids for the answer letters A–E after the prompt "
            f"(tokenizer {type(self.tokenizer).__name__}); the examiner needs them in the vocabulary"
        )

    @torch.inference_mode()
    @collective_call
    def letter_logits(self, captions: Sequence[str], questions: Sequence[Question]) -> torch.Tensor:
        """[N, 5] logits of A–E at the answer position for each pair (deduplicated internally)."""
        _check_pairs(captions, questions, "questions")
        if not captions:
            return torch.zeros((0, 5))
        pairs, inverse = distinct_pairs(captions, questions)
        prompts = [self.prompt(*pair) for pair in pairs]
        if self.letter_ids is None:
            self.letter_ids = self.find_letter_ids(prompts[0])
        letter_ids = torch.tensor(self.letter_ids, device=self.device)
        ids = self.encode(prompts)
        if self.share_prefix:  # the instruction, each caption, each shared sentence: read once
            reader = PrefixReader(self.model, self.pad_id, self.batch_size, forward=self.forward)
            return reader.last_logits(ids, self.letter_ids)[inverse]
        scores = torch.empty((len(pairs), 5), dtype=torch.float32)
        for group in self.batches(ids):  # one forward pass per batch
            batch = self.batch_tensors([ids[i] for i in group])
            positions = (batch["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
            logits = self.forward(**batch, position_ids=positions, logits_to_keep=1).logits  # [B, 1, V]
            scores[group] = logits[:, -1, letter_ids].float().cpu()
        return scores[inverse]

    # --- options ---------------------------------------------------------------------------------
    @staticmethod
    def option_texts(caption: str, question: Question) -> list[tuple[str, str]]:
        """(context, continuation) per option A–D: the passage up to the blank is context, the
        option and the rest of the passage are scored. A question without a blank is answered
        after "Answer:"."""
        parts = BLANK.split(question.passage, maxsplit=1)
        head = f"Caption: {caption}\nAccording to the caption:"
        if len(parts) == 1:
            before, after = " " + question.passage + "\nAnswer: ", ""
        else:
            before, after = " " + parts[0], parts[1]
        stem = before.rstrip()
        gap = before[len(stem) :]  # the space before the blank belongs to the option's first word
        return [(head + stem, gap + option + after) for option in question.options[:4]]

    @torch.inference_mode()
    @collective_call
    def option_gains(self, captions: Sequence[str], questions: Sequence[Question]) -> torch.Tensor:
        """[N, 4]: log p(passage with option k | caption) − log p(same | empty caption), nats."""
        _check_pairs(captions, questions, "questions")
        if not captions:
            return torch.zeros((0, 4))
        texts = [t for c, q in zip(captions, questions) for t in self.option_texts(c, q)]
        texts += [t for q in questions for t in self.option_texts("", q)]
        distinct, inverse = _unique(texts)
        logprobs = self.continuation_logprobs(distinct)[torch.tensor(inverse)]
        n = len(captions)
        return (logprobs[: 4 * n] - logprobs[4 * n :]).view(n, 4)

    def continuation_logprobs(self, texts: Sequence[tuple[str, str]]) -> torch.Tensor:
        """Summed log-probability of each continuation after its context; one pass per batch."""
        ids, lengths = [], []
        for context, continuation in texts:
            head = self.tokenizer(context, add_special_tokens=True).input_ids
            tail = self.tokenizer(continuation, add_special_tokens=False).input_ids
            if not head or not tail:
                raise ValueError(f"empty context or continuation to score: {context!r} / {continuation!r}")
            ids.append(head + tail)
            lengths.append(len(tail))
        out = torch.empty(len(texts), dtype=torch.float32)
        for group in self.batches(ids):
            batch = self.batch_tensors([ids[i] for i in group])
            positions = (batch["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
            keep = max(lengths[i] for i in group) + 1  # every continuation sits at the right end
            logits = self.forward(**batch, position_ids=positions, logits_to_keep=keep).logits  # [B, keep, V]
            targets = batch["input_ids"][:, 1 - keep :]  # [B, keep-1]
            token_lp = logits[:, :-1].float().log_softmax(-1).gather(2, targets[..., None])[..., 0]
            for row, i in enumerate(group):
                out[i] = token_lp[row, keep - 1 - lengths[i] :].sum().cpu()
        return out

    # --- free generation (benchmark only) ---------------------------------------------------------
    def answer_by_generation(
        self, captions: Sequence[str], questions: Sequence[Question], max_new_tokens: int = 8
    ) -> list[str]:
        """Free greedy generation on the letters prompt, parsed for the first standalone A–E ("E"
        when none is found). For the examiner benchmark only: it costs ``max_new_tokens`` decoding
        steps and can fail to parse, which :meth:`answer` cannot."""
        _check_pairs(captions, questions, "questions")
        texts = self.generate([self.prompt(c, q) for c, q in zip(captions, questions)], max_new_tokens)
        return [parse_letter(t) or "E" for t in texts]
