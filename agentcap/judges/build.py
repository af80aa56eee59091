"""Building a judge from its config entry: a rule, a local HF causal LM (loaded once per process,
``agentcap.judges.pool``), an OpenAI-compatible server or a vLLM engine (``agentcap.judges.served``)."""

from __future__ import annotations

from typing import Any, Literal

from agentcap.agents.hub import resolve_model
from agentcap.judges.examiner import Examiner, LLMExaminer
from agentcap.judges.pool import causal_lm
from agentcap.judges.rule import RuleExaminer
from agentcap.judges.served import (
    ServedExaminer,
    ServedTemporalExaminer,
    VLLMExaminer,
    served_judge_client,
)
from agentcap.judges.temporal import LLMTemporalExaminer, RuleTemporalExaminer, TemporalExaminer


# Local LLM judges load once per process (agentcap.judges.pool), whichever environment asks.
def build_examiner(
    spec: str | dict[str, Any], device: str = "cpu", readout: Literal["letters", "options"] = "letters"
) -> Examiner:
    """``rule`` (toy worlds only), the local folder or Hub id of an HF causal LM, an OpenAI-compatible server
    ``{url: http://HOST:8000/v1, model: NAME}`` shared by every rank, or ``{vllm: FOLDER}``: a vLLM
    engine in this process (both ``agentcap.judges.served``; letters readout only).

    ``readout="letters"`` answers by the next-token logits of A–E (the papers' examiner);
    ``"options"`` scores each option's text, for small models that cannot follow a letter format.
    """
    if isinstance(spec, dict):
        if readout != "letters":
            raise ValueError(f"examiner_readout: a served / vLLM examiner reads letters only (got {readout!r})")
        if "vllm" in spec:
            return VLLMExaminer(spec["vllm"], **{k: v for k, v in spec.items() if k != "vllm"})
        return ServedExaminer(served_judge_client(spec, "examiner"))
    if spec == "rule":
        return RuleExaminer()
    return LLMExaminer(*causal_lm(resolve_model(spec, "examiner"), device), readout=readout)


def build_temporal_examiner(spec: str | dict[str, Any], half_width: float, device: str = "cpu") -> TemporalExaminer:
    """``rule`` (the deterministic timestamp parser), the local folder of an HF causal LM, or an
    OpenAI-compatible server ``{url: http://HOST:8000/v1, model: NAME}`` shared by every rank (the
    cloze examiner's server can answer both)."""
    if isinstance(spec, dict):
        if "vllm" in spec:
            raise ValueError("temporal_examiner: a vLLM engine in process ({vllm: ...}) is not supported; "
                             "serve the model (`vllm serve`) and give {url, model} (docs/vllm.md)")
        return ServedTemporalExaminer(served_judge_client(spec, "temporal_examiner"), half_width=half_width)
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"temporal_examiner: expected 'rule', a model folder or {{url, model}}, got {spec!r}")
    if spec == "rule":
        return RuleTemporalExaminer(half_width=half_width)
    return LLMTemporalExaminer(*causal_lm(resolve_model(spec, "temporal_examiner"), device), half_width=half_width)
