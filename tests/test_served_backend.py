"""``backend: served`` against a fake vLLM server in a thread (http.server): vLLM's endpoints as the
backend uses them (``/v1/models``, ``/v1/completions`` with token-id prompts, ``prompt_logprobs`` and
``return_token_ids``, runtime LoRA loading, the development endpoints that reload full weights), with
log-probs computed by the fake's own copy of the model, so every sync's probe check runs for real.
The real ``vllm serve`` runs in tests/vllm_engine/test_served_engine.py."""

from __future__ import annotations

import copy
import glob
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from agentcap.agents.adapters import LoraSpec
from agentcap.agents.agent import AgentConfig, build_agent, build_agents
from agentcap.agents.backends import served as served_module
from agentcap.agents.backends.base import VLLMOptions
from agentcap.agents.backends.served import EngineUnavailable, ServedBackend, ServedEngineError
from agentcap.agents.backends.verify import WeightSyncError

LORA = LoraSpec(r=4, alpha=8)
OBS = {"agent": "policy", "messages": [{"role": "user", "content": "hello world"}], "media": {}}


class FakeVLLM:
    """An OpenAI-compatible server holding a copy of ``model`` under ``name``. ``apply``: whether loaded
    adapters / reloaded weights reach its model (False: a server that says yes and keeps the old ones);
    ``runtime_lora`` / ``dev_mode``: vLLM's env switches; ``stall``: answer nothing."""

    def __init__(self, model, name: str = "base", adapter: str | None = None, owned_by: str = "vllm"):
        self.model, self.original = copy.deepcopy(model), copy.deepcopy(model)
        self.name, self.adapter_name, self.owned_by = name, adapter, owned_by
        self.adapters: dict[str, dict] = {}
        self.apply, self.runtime_lora, self.dev_mode, self.stall = True, True, True, False
        self.weight_version: str | None = None
        self.calls: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.answer(self, "GET", None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                fake.answer(self, "POST", json.loads(body or b"{}"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def restart(self):
        """As a restarted `vllm serve`: its adapters and reloaded weights gone, the original model back."""
        self.adapters.clear()
        self.model = copy.deepcopy(self.original)
        self.weight_version = None

    # --- the endpoints -----------------------------------------------------------------------
    def answer(self, handler, method: str, body):
        path = handler.path
        self.calls.append(f"{method} {path}")
        if self.stall:
            time.sleep(30)
            return
        routes = {
            ("GET", "/v1/models"): self.models,
            ("POST", "/v1/completions"): self.completions,
            ("GET", "/weight_info"): lambda _: (200, {"weight_version": self.weight_version}),
        }
        if self.runtime_lora:
            routes[("POST", "/v1/load_lora_adapter")] = self.load_lora
            routes[("POST", "/v1/unload_lora_adapter")] = self.unload_lora
        if self.dev_mode:
            routes[("POST", "/collective_rpc")] = self.collective_rpc
            routes[("POST", "/update_weight_version")] = self.update_version
            routes[("POST", "/reset_prefix_cache")] = lambda _: (200, b"")
        route = routes.get((method, path))
        status, reply = route(body) if route else (404, {"detail": "Not Found"})
        data = reply if isinstance(reply, bytes) else (reply.encode() if isinstance(reply, str) else json.dumps(reply).encode())
        handler.send_response(status)
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def models(self, _):
        cards = [{"id": self.name, "object": "model", "owned_by": self.owned_by, "root": "/models/x", "parent": None}]
        cards += [{"id": n, "object": "model", "owned_by": "vllm", "root": "/x", "parent": self.name} for n in self.adapters]
        return 200, {"object": "list", "data": cards}

    def load_lora(self, body):
        from safetensors.torch import load_file

        if body["lora_name"] in self.adapters:
            return 400, {"error": {"message": f"The lora adapter '{body['lora_name']}' has already been loaded."}}
        self.adapters[body["lora_name"]] = load_file(os.path.join(body["lora_path"], "adapter_model.safetensors"))
        return 200, f"Success: LoRA adapter '{body['lora_name']}' added successfully."

    def unload_lora(self, body):
        if self.adapters.pop(body["lora_name"], None) is None:
            return 404, {"error": {"message": "not found"}}
        return 200, "Success"

    def collective_rpc(self, body):
        from safetensors.torch import load_file

        assert body["method"] == "reload_weights"
        if self.apply:
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for file in sorted(glob.glob(os.path.join(body["kwargs"]["weights_path"], "*.safetensors"))):
                    for name, tensor in load_file(file).items():
                        params[name].copy_(tensor)
        return 200, {"results": [None]}

    def update_version(self, body):
        self.weight_version = body["new_version"]
        return 200, {"success": True}

    @torch.no_grad()
    def completions(self, body):
        from peft import set_peft_model_state_dict

        model = body["model"]
        if model != self.name and model not in self.adapters:
            return 404, {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}
        with self.lock:
            if model != self.name and self.apply:
                set_peft_model_state_dict(self.model, self.adapters[model], adapter_name=self.adapter_name)
            use_adapter = model != self.name and self.adapter_name is not None
            if not use_adapter and self.adapter_name is not None:
                with self.model.disable_adapter():
                    choice = self._choice(body)
            else:
                choice = self._choice(body)
        return 200, {"id": "cmpl-1", "object": "text_completion", "model": model, "choices": [choice]}

    def _choice(self, body):
        ids = list(body["prompt"])
        if body.get("prompt_logprobs") is not None:
            lp = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            steps = [None] + [{str(t): {"logprob": float(lp[i, t]), "rank": 1}} for i, t in enumerate(ids[1:])]
            return {"index": 0, "text": "", "prompt_logprobs": steps, "token_ids": [0]}
        generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
        tokens, logprobs = [], []
        for _ in range(body["max_tokens"]):
            lp = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0, -1].float() / (body["temperature"] or 1.0), -1)
            token = int(lp.argmax()) if not body["temperature"] else int(torch.multinomial(lp.exp(), 1, generator=generator))
            tokens.append(token)
            logprobs.append(float(lp[token]))
            ids.append(token)
            if token in body.get("stop_token_ids", []):
                break
        return {"index": 0, "text": "", "token_ids": tokens,
                "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": logprobs}}


def lora_agent(name: str = "policy"):
    return build_agent(name, AgentConfig(tiny={"kind": "qwen2"}, peft=LORA, max_new_tokens=4))


def full_agent(name: str = "policy"):
    agent = build_agent(name, AgentConfig(tiny={"kind": "qwen2"}, max_new_tokens=4))
    agent.set_trainable(True)
    return agent


def serve(agent, fake: FakeVLLM, tmp_path, **served):
    options = VLLMOptions(served={"urls": [fake.url], "model": "base", "folder": str(tmp_path / "sync"), **served})
    agent.use_backend("served", options, None)
    return agent.backend


@pytest.fixture
def fakes():
    started = []
    yield started
    for fake in started:
        fake.close()


def fake_for(agent, fakes, kind: type[FakeVLLM] = FakeVLLM, **kwargs) -> FakeVLLM:
    adapters = agent.adapters
    model = adapters.peft_model if adapters is not None else agent.model
    fake = kind(model, adapter=adapters.name if adapters is not None else None, **kwargs)
    fakes.append(fake)
    return fake


def train(agent, scale: float = 0.3) -> None:
    """An 'optimiser step' that moves every log-prob: the adapter's factors (LoRA) or every weight."""
    with torch.no_grad():
        for name, p in agent.model.named_parameters():
            if agent.adapters is None or "lora_" in name:
                p.add_(torch.randn_like(p) * scale)
    agent.backend.weights_changed()


def test_adapter_versions_load_at_run_time_and_each_sync_is_verified(tmp_path, fakes):
    agent = lora_agent()
    fake = fake_for(agent, fakes)
    backend = serve(agent, fake, tmp_path)
    assert isinstance(backend, ServedBackend)
    for version in (1, 2, 3):
        train(agent)
        out = backend.sample([OBS, OBS], {}, greedy=False, seeds=[1, 2])
        assert backend.version == version and backend.gap is not None and backend.gap < 1e-4
        name = f"{served_module.TRAINER}.policy.v{version}"
        assert list(fake.adapters) == [name], "the previous version is unloaded"
        assert sorted(os.listdir(backend.adapter.root)) == [f"v{version}"], "one version on disk"
        assert len(out) == 2 and all(0 < len(g.completion_ids) <= 4 for g in out)
        assert all(g.sampler_logprobs.shape == g.completion_ids.shape for g in out)
    # the sampled log-probs are the learner's own (the fake holds the same adapter)
    generation = out[0]
    inputs = agent.encode([OBS])
    completion = generation.completion_ids[None]
    learner = agent.completion_logprobs(inputs, completion, torch.ones_like(completion), temperature=agent.temperature)
    assert torch.allclose(learner[0].float(), generation.sampler_logprobs, atol=1e-4)


def test_an_adapter_the_server_did_not_apply_fails_the_probe(tmp_path, fakes):
    agent = lora_agent()
    fake = fake_for(agent, fakes)
    fake.apply = False  # says "Success" and keeps serving the base
    backend = serve(agent, fake, tmp_path)
    train(agent)
    with pytest.raises(WeightSyncError, match=r"agents\.policy: weight sync 1 did not reach"):
        backend.sync()


def test_full_weights_reload_from_the_shared_folder_and_are_verified(tmp_path, fakes):
    agent = full_agent()
    fake = fake_for(agent, fakes)
    backend = serve(agent, fake, tmp_path)
    train(agent, 0.05)
    backend.sample([OBS], {}, greedy=True)
    assert fake.weight_version == f"{served_module.TRAINER}.policy.v1" and backend.gap < 1e-4
    assert fake.calls.count("POST /reset_prefix_cache") == 1
    train(agent, 0.05)
    backend.sync()
    assert sorted(os.listdir(backend.root)) == ["v2"]
    fake.apply = False
    train(agent, 0.05)
    with pytest.raises(WeightSyncError, match="weight sync 3"):
        backend.sync()


def test_full_weights_need_the_development_endpoints(tmp_path, fakes):
    agent = full_agent()
    fake = fake_for(agent, fakes)
    fake.dev_mode = False
    backend = serve(agent, fake, tmp_path)
    with pytest.raises(ServedEngineError, match="VLLM_SERVER_DEV_MODE=1"):
        backend.sync()


def test_runtime_lora_off_is_named(tmp_path, fakes):
    agent = lora_agent()
    fake = fake_for(agent, fakes)
    fake.runtime_lora = False
    with pytest.raises(ServedEngineError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        serve(agent, fake, tmp_path).sync()


def test_a_url_that_is_not_a_vllm_server(tmp_path, fakes):
    agent = lora_agent()
    fake = fake_for(agent, fakes, owned_by="openai")
    with pytest.raises(ServedEngineError, match=r"is not a vLLM server \(its models are owned by \['openai'\]"):
        serve(agent, fake, tmp_path).sync()
    class Web(BaseHTTPRequestHandler):  # some other web server: an HTML 404 page
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    plain = ThreadingHTTPServer(("127.0.0.1", 0), Web)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    try:
        backend = serve(agent, fake, tmp_path, urls=[f"http://127.0.0.1:{plain.server_address[1]}/v1"], retries=0)
        with pytest.raises(ServedEngineError, match=r"is not a vLLM server \(GET /v1/models answered 404") as caught:
            backend.sync()
        assert "\n" not in str(caught.value)
    finally:
        plain.shutdown()
        plain.server_close()


def test_a_server_holding_another_model(tmp_path, fakes):
    agent = lora_agent()
    fake = fake_for(agent, fakes)
    fake.name = "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(ServedEngineError, match=r"holds model\(s\) \['Qwen/Qwen2.5-7B-Instruct'\], not 'base'"):
        serve(agent, fake, tmp_path).sync()


def test_a_server_restarted_between_syncs(tmp_path, fakes):
    agent = lora_agent()
    fake = fake_for(agent, fakes)
    backend = serve(agent, fake, tmp_path)
    train(agent)
    backend.sample([OBS], {}, greedy=True)
    fake.restart()
    with pytest.raises(ServedEngineError, match=r"restarted since sync 1: its adapter '.*policy\.v1' is gone"):
        backend.sample([OBS], {}, greedy=True)  # the rollout asks for the lost adapter: refused, nothing sampled
    train(agent)
    with pytest.raises(ServedEngineError, match="restarted since sync 1"):
        backend.sync()


def test_a_full_weight_server_restarted_between_syncs(tmp_path, fakes):
    agent = full_agent()
    fake = fake_for(agent, fakes)
    backend = serve(agent, fake, tmp_path)
    backend.sync()
    fake.restart()  # it would answer with its original weights: the weight version says so first
    with pytest.raises(ServedEngineError, match=r"restarted since sync 1 .*weight version is None"):
        backend.sample([OBS], {}, greedy=True)


def test_two_trainers_on_one_server(tmp_path, fakes, monkeypatch):
    agent = lora_agent()
    fake = fake_for(agent, fakes)
    backend = serve(agent, fake, tmp_path)
    train(agent)
    backend.sync()
    other = lora_agent()  # a second trainer process: another name on the server
    monkeypatch.setattr(served_module, "TRAINER", "agentcap-0therrun")
    other_backend = serve(other, fake, tmp_path / "other")
    with pytest.raises(ServedEngineError, match=r"holds '.*policy\.v1' of another trainer"):
        other_backend.sync()
    monkeypatch.undo()
    fake.adapters["agentcap-0therrun.policy.v1"] = {}  # the other one got its adapter in after all
    train(agent)
    with pytest.raises(ServedEngineError, match="of another trainer .*two trainers on one server"):
        backend.sync()


def test_a_stalled_or_dead_server_gets_the_judges_deadline(tmp_path, fakes):
    agent = lora_agent()
    fake = fake_for(agent, fakes)
    backend = serve(agent, fake, tmp_path, timeout=1.0, retries=1, backoff=0.05)
    train(agent)
    backend.sync()
    fake.stall = True
    start = time.monotonic()
    with pytest.raises(EngineUnavailable, match=r"rollout server .*/v1/completions .* did not answer after 2 attempts"):
        backend.sample([OBS], {}, greedy=True)
    assert time.monotonic() - start < 10
    fake.stall = False
    fake.close()
    fakes.remove(fake)
    with pytest.raises(EngineUnavailable, match="ConnectError"):
        backend.sample([OBS], {}, greedy=True)


def test_rollouts_spread_over_servers_and_every_server_is_verified(tmp_path, fakes):
    agent = lora_agent()
    a, b = fake_for(agent, fakes), fake_for(agent, fakes)
    options = VLLMOptions(served={"urls": [a.url, b.url], "model": "base", "folder": str(tmp_path / "s")})
    agent.use_backend("served", options, None)
    train(agent)
    out = agent.backend.sample([OBS] * 3, {}, greedy=True)
    assert len(out) == 3 and len(a.adapters) == len(b.adapters) == 1
    assert a.calls.count("POST /v1/completions") == 1 + 2 and b.calls.count("POST /v1/completions") == 1 + 1


def test_config_and_shared_base_roles(tmp_path):
    with pytest.raises(ValueError, match="either urls .* or start"):
        build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}, backend="served"))
    served = {"urls": ["http://127.0.0.1:9/v1"], "model": "base", "folder": str(tmp_path)}
    tied = build_agent("policy", AgentConfig(tiny={"kind": "qwen2"}))
    tied.model.config.tie_word_embeddings = True
    with pytest.raises(ValueError, match="tied to its input embedding.*untied_copy"):  # vLLM's reload leaves the head
        tied.use_backend("served", AgentConfig(vllm={"served": served}).vllm, None)
    with pytest.raises(ValueError, match=r"vllm\.served: unknown option\(s\) \['url'\]"):
        AgentConfig(tiny={"kind": "qwen2"}, backend="served", vllm={"served": {"url": "http://x/v1"}})
    served = {"urls": ["http://127.0.0.1:9/v1"], "model": "base", "folder": str(tmp_path)}
    agents = build_agents({
        "captioner": AgentConfig(tiny={"kind": "qwen2"}, peft=LORA, backend="served", vllm={"served": served}),
        "instruct": AgentConfig(share_base_with="captioner", peft=LORA, backend="served", vllm={"served": served}),
    })
    backends = [agents[n].backend for n in ("captioner", "instruct")]
    assert all(isinstance(b, ServedBackend) for b in backends)
    assert backends[0].held_name != backends[1].held_name, "one adapter name per role on the same server"
