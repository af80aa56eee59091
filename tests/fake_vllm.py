"""A recording stand-in for vLLM, for tests without it: a fake ``vllm`` module (the ``fake_vllm``
fixture) and a fake ``LLM`` that keeps its own copy of the model. ``load_weights`` writes into the
copy, a level-2 sleep wipes it, and the probe's log-probs come from it, so the backend's verification
runs for real; it refuses a sync or a generate while asleep, and a sync during a generate. Every
event goes into a shared log, and the thread it ran in into the engine's ``threads``. The real CPU-build engine is exercised in tests/vllm_engine."""

from __future__ import annotations

import copy
import sys
import threading
import types
from dataclasses import dataclass, field

import pytest
import torch
from tiny_agents import tiny_agent

from agentcap.agents.backends.base import VLLMOptions
from agentcap.agents.backends.vllm import VLLMBackend


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
        self.__dict__.setdefault("prompt_logprobs", None)


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Completion:
    token_ids: list[int]
    logprobs: list[dict[int, _Logprob]]


@dataclass
class _Output:
    outputs: list[_Completion]
    prompt_logprobs: list | None = None


class _Model:
    """The engine's model: its own copy of the learner's weights."""

    def __init__(self, model, engine):
        self.model, self.engine = model, engine

    def load_weights(self, weights):
        assert "weights" not in self.engine.asleep, f"{self.engine.role}: weights synced into a sleeping engine"
        assert not self.engine.generating, f"{self.engine.role}: weights synced during a generation"
        self.engine.threads.append(threading.current_thread().name)
        params = dict(self.model.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)
        self.engine.log.append(f"{self.engine.role}.load")


@dataclass
class FakeLLM:
    role: str
    model: torch.nn.Module
    log: list[str]
    asleep: set[str] = field(default_factory=set)
    threads: list[str] = field(default_factory=list)  # the thread of each load and generate
    generating: bool = False
    sample: bool = False  # honour SamplingParams (seeded sampling, max_tokens, stop ids) instead of one argmax token

    def __post_init__(self):
        self.model = copy.deepcopy(self.model)
        runner = types.SimpleNamespace(model=_Model(self.model, self))
        self.worker = types.SimpleNamespace(model_runner=runner)

    def collective_rpc(self, method, args=()):
        return [method(self.worker, *args)]

    def sleep(self, level):
        assert not self.asleep, f"{self.role}: sleep while asleep"
        self.asleep = {"weights", "kv_cache"}
        if level == 2:  # discarded: whatever the memory holds on wake is not the weights
            with torch.no_grad():
                for p in self.model.parameters():
                    p.normal_()
        self.log.append(f"{self.role}.sleep({level})")

    def wake_up(self, tags=None):
        self.asleep -= {"weights", "kv_cache"} if tags is None else set(tags)
        self.log.append(f"{self.role}.wake({','.join(tags) if tags else 'all'})")

    def reset_prefix_cache(self):
        return True

    @torch.no_grad()
    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        assert not self.asleep, f"{self.role}: generate on a sleeping engine"
        probe = getattr(params, "prompt_logprobs", None) is not None
        self.log.append(f"{self.role}.{'probe' if probe else 'generate'}")
        self.threads.append(threading.current_thread().name)
        self.generating = True
        try:
            if self.sample and not probe:
                listed = params if isinstance(params, list) else [params] * len(prompts)
                return [self._sampled(prompt, p) for prompt, p in zip(prompts, listed)]
            return self._outputs(prompts, probe)
        finally:
            self.generating = False

    def _sampled(self, prompt, params) -> _Output:
        """Up to ``max_tokens`` tokens, each drawn from the tempered softmax with the request's own seed
        (argmax at temperature 0), with its processed log-prob, as vLLM returns them."""
        ids = list(prompt["prompt_token_ids"])
        generator = torch.Generator().manual_seed(int(params.seed or 0))
        tokens, logprobs = [], []
        for _ in range(params.max_tokens):
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            greedy = not params.temperature
            lp = torch.log_softmax(logits / (1.0 if greedy else params.temperature), -1)
            token = int(lp.argmax()) if greedy else int(torch.multinomial(lp.exp(), 1, generator=generator))
            tokens.append(token)
            logprobs.append({token: _Logprob(float(lp[token]))})
            ids.append(token)
            if token in (params.stop_token_ids or []):
                break
        return _Output([_Completion(tokens, logprobs)])

    def _outputs(self, prompts, probe: bool) -> list[_Output]:
        outputs = []
        for prompt in prompts:
            ids = torch.tensor([prompt["prompt_token_ids"]])
            logprobs = torch.log_softmax(self.model(input_ids=ids).logits[0].float(), -1)
            if probe:
                steps = [None] + [{t: _Logprob(float(logprobs[i, t]))} for i, t in enumerate(ids[0, 1:].tolist())]
                outputs.append(_Output([], steps))
            else:
                token = int(logprobs[-1].argmax())
                outputs.append(_Output([_Completion([token], [{token: _Logprob(float(logprobs[-1, token]))}])]))
        return outputs


def engine_agent(name: str, log: list[str], tmp_path, seed: int = 0):
    """A tiny agent whose vLLM backend drives a recording fake engine (already built)."""
    agent = tiny_agent("qwen2", name=name, seed=seed, max_new_tokens=1)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    agent.backend = VLLMBackend(agent, VLLMOptions(enable_sleep_mode=True), str(folder), f"agents.{name}")
    agent.backend._llm = FakeLLM(name, agent.model, log)
    return agent


def step(agent, lr: float = 0.5) -> None:
    """An optimiser step that changes every log-prob, then the agent's usual sync_weights."""
    with torch.no_grad():
        for p in agent.model.parameters():
            p.add_(torch.randn_like(p) * lr)
    agent.sync_weights()


def observation(name: str) -> dict:
    return {"agent": name, "messages": [{"role": "user", "content": "hello world"}], "media": {}}
