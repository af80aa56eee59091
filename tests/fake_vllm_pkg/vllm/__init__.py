"""A stand-in ``vllm`` package for `agentcap fit` subprocesses of the tests (on ``PYTHONPATH`` only
there): ``LLM(model=folder, …)`` loads the folder with transformers into tests/fake_vllm.py's
recording engine, which samples with each request's seed as vLLM does."""

from __future__ import annotations

import torch

from fake_vllm import FakeLLM, SamplingParams  # noqa: F401  (tests/ is on PYTHONPATH too)

__version__ = "0.0.fake"


def LLM(model: str, dtype: str = "auto", **_options):  # noqa: N802  (vLLM's name)
    from transformers import AutoModelForCausalLM

    kwargs = {} if dtype == "auto" else {"dtype": getattr(torch, dtype)}
    hf = AutoModelForCausalLM.from_pretrained(model, **kwargs).eval()
    return FakeLLM("engine", hf, [], sample=True)
