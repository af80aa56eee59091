"""The vLLM backend: a vLLM engine samples an agent's actions; its weights follow the learner.

The engine is colocated with the learner in the same process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
unless tensor parallel needs workers), so a weight sync hands tensors over by reference through
``LLM.collective_rpc``, one decoder layer at a time (``backends.weights``). It is built on first
use from the agent's model folder, which must therefore hold the same weights as the learner;
vLLM spawns processes, so scripts that create it need an ``if __name__ == "__main__":`` guard.

A LoRA agent's engine is built from the base folder with ``enable_lora`` and each sync sends only
the adapter, as a LoRA request per version (``backends.adapter_sync``). Every sync is verified on a
fixed probe (``backends.verify``): a sync that delivered nothing raises :class:`WeightSyncError`.

Sleep and wake (``agentcap.training.engines`` decides when, per stage): :meth:`sleep` frees the
engine's device memory, at level 1 keeping its weights in host memory, at level 2 discarding them,
after which the engine counts as stale and the next use re-syncs them from the learner. A sync
wakes the engine first (the weights first, then the KV cache), so weights never go into a
sleeping engine; generation and scoring wake it too.

Rollouts ahead of the update (``max_staleness`` ≥ 1, ``agentcap.rollout.pipeline``): the main thread
takes a :meth:`snapshot` of the learner between updates, and the rollout thread installs it with
:meth:`load_snapshot` just before the batch that must be sampled with it, verified against the
probe log-probs the snapshot carries; the engine is never written to mid-generation.

Log-probs are taken after temperature (``logprobs_mode="processed_logprobs"``), the distribution the
learner's ``completion_logprobs`` computes. Works with vLLM 0.26 (the GPU extra) and 0.32 (the CPU
build the tests run): both take a callable in ``collective_rpc``, ``prompt_token_ids`` prompts,
``LoRARequest(name, id, path)`` and ``wake_up(tags)``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentcap.agents.backends.adapter_sync import AdapterVersions, max_lora_rank
from agentcap.agents.backends.base import VLLMOptions
from agentcap.agents.backends.verify import DEFAULT_TOLERANCE, WeightSyncError, check_sync, learner_logprobs, make_probe
from agentcap.agents.backends.weights import gathered_weights, layers, trainable_weights

__all__ = ["VLLMBackend", "WeightSyncError"]
from agentcap.agents.generation import Generation
from agentcap.parallel.sharding import is_sharded


def _worker_model(worker):
    runner = worker.model_runner
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def _begin_reload(worker) -> bool:
    """Runs in the engine's worker. Newer vLLM (0.32) post-processes weights after loading (e.g. the
    CPU build repacks fp32 linears), so a second load must go through its layer-wise reload, which
    restores the checkpoint layout and processes each layer again once it is complete. vLLM 0.26
    has no such module and loads checkpoint-format weights into the live parameters directly."""
    try:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload
    except ImportError:
        return False
    initialize_layerwise_reload(_worker_model(worker))
    return True


def _load_weights(worker, weights):
    """Runs in the engine's worker: load (name, tensor) pairs into its model."""
    _worker_model(worker).load_weights(weights=weights)
    return len(weights)


def _end_reload(worker) -> None:
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    model = _worker_model(worker)
    model_config = worker.model_runner.vllm_config.model_config
    finalize_layerwise_reload(model, model_config)
    # tied output embedding: the reload processes the input embedding only, while the output head
    # keeps its kernel of the old weights (the CPU build's packed GEMM); tie again, process again
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = getattr(model_config.hf_config, "tie_word_embeddings", False)
    if tied and head is not None and embed is not None:
        head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


class SharedEngine:
    """What the roles on one engine share: the ``LLM``, its sleep state and its LoRA ids. One role
    per engine, or every role on a shared base (``share_base_with``): the engine then holds the base
    once and an adapter per role, each role's versions under LoRA ids of their own."""

    def __init__(self):
        self.llm = None
        self.level = 0  # 0 awake; 1 asleep, weights in host memory; 2 asleep, weights discarded
        self.asleep: set[str] = set()  # what still sleeps: "weights", "kv_cache"
        self.lora_ids = itertools.count(1)
        self.backends: list[VLLMBackend] = []  # the roles it serves, the one that built it first


class VLLMBackend:
    """Samples with a vLLM ``LLM``; :meth:`sync` brings the learner's current weights (or adapter)
    into it and checks that they arrived. ``share``: the backend of the role whose base this role
    shares; both then sample through that role's engine, each with its own adapter."""

    holds_weights = True  # generation never runs the learner's model (``Agent.generate``)

    def __init__(self, agent, options: VLLMOptions, model_path: str | None, where: str,
                 share: VLLMBackend | None = None):
        if agent.family.name == "toy":
            raise ValueError(
                f"{where}.backend: vllm cannot serve agentcap's toy media LM (not a vLLM architecture); "
                "use backend: hf"
            )
        if not model_path or not os.path.isdir(model_path):
            raise ValueError(
                f"{where}.backend: vllm needs `model:` to be a local Hugging Face model folder (got {model_path!r}); "
                "tiny/toy models are HF-only"
            )
        if os.path.isfile(os.path.join(model_path, "config.json")) is False:
            raise ValueError(f"{where}.model: {model_path!r} has no config.json; vLLM loads plain HF folders "
                             "(re-save a GGUF checkpoint with tools/resave_gguf.py)")
        self.agent, self.options, self.model_path, self.where = agent, options, model_path, where
        # the learner's dtype: vLLM's CPU build would otherwise run an fp32 folder in bf16
        self.agent_dtype = str(next(agent.model.parameters()).dtype).removeprefix("torch.")
        self.dtype = self.agent_dtype if options.dtype == "auto" else options.dtype
        tolerance = options.sync_tolerance
        self.tolerance = DEFAULT_TOLERANCE.get(self.dtype, 0.5) if tolerance is None else tolerance
        self.shared = share.shared if share is not None else SharedEngine()
        if share is not None and (agent.adapters is None or share.adapter is None):
            raise ValueError(f"{where}.backend: one vLLM engine serves roles that share a base through their "
                             "adapters; both roles need `peft`")
        self.shared.backends.append(self)
        # a LoRA agent's engine holds the base and takes each version of the adapter
        self.adapter = AdapterVersions(agent, self.shared.lora_ids) if agent.adapters is not None else None
        # the learner's weights changed since the last sync (a step, a checkpoint); an adapter
        # engine starts without its adapter
        self.stale = self.adapter is not None
        self.syncs = 0
        self.gap: float | None = None  # the probe's max |Δ log p| after the last sync
        self._probe = None

    # --- the engine ---------------------------------------------------------------------------
    _llm = property(lambda self: self.shared.llm, lambda self, llm: setattr(self.shared, "llm", llm))
    level = property(lambda self: self.shared.level, lambda self, level: setattr(self.shared, "level", level))
    _asleep = property(lambda self: self.shared.asleep, lambda self, tags: setattr(self.shared, "asleep", tags))

    @property
    def llm(self):
        if self._llm is None:
            try:
                from vllm import LLM
            except ImportError as error:
                raise ImportError(
                    f"{self.where}.backend: vllm is not installed ({error}); `pip install agentcap[vllm]` on a GPU "
                    "machine, or build the CPU environment with tools/setup_vllm.sh"
                ) from None
            o = self.options
            if o.tensor_parallel_size == 1:
                os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: sync by reference
            kwargs: dict[str, Any] = dict(
                model=self.model_path,
                tokenizer=self.model_path,
                dtype=self.dtype,
                gpu_memory_utilization=o.gpu_memory_utilization,
                tensor_parallel_size=o.tensor_parallel_size,
                enable_sleep_mode=o.enable_sleep_mode,
                enforce_eager=o.enforce_eager,
                seed=o.seed,
                logprobs_mode="processed_logprobs",
                trust_remote_code=False,
            )
            if o.max_model_len is not None:
                kwargs["max_model_len"] = o.max_model_len
            if self.adapter is not None:  # an adapter per role on the engine, every role's rank served
                roles = [b for b in self.shared.backends if b.adapter is not None]
                rank = max(max_lora_rank(b.adapter.rank, b.where) for b in roles)
                kwargs.update(enable_lora=True, max_loras=len(roles), max_lora_rank=rank)
            if self.agent.family.name in ("vision", "audio"):
                kwargs["limit_mm_per_prompt"] = {"image": 0, "video": 1} if self.agent.family.name == "vision" else {"audio": 1}
            try:
                self._llm = LLM(**kwargs)
            except (ValueError, NotImplementedError) as error:
                raise ValueError(f"{self.where}: vLLM cannot serve the model in {self.model_path!r}: {error}") from error
        return self._llm

    @property
    def built(self) -> bool:
        return self._llm is not None

    def weights_changed(self) -> None:
        """The learner moved on: the next use syncs (lazily, so a stage of SFT steps costs one sync)."""
        self.stale = True

    def sleep(self, level: int) -> int:
        """Free the engine's device memory until its next use; returns the level it sleeps at (0:
        it stays awake: not built yet, or sleep mode off; an engine already asleep keeps its level).
        Level 1 keeps the weights in host memory; level 2 discards them, so the next use re-syncs
        them from the learner. An adapter engine sleeps at level 1 at most: its base never changes
        and only the adapter is ever re-sent."""
        if not self.built or not self.options.enable_sleep_mode or self.level:
            return self.level
        level = 1 if self.adapter is not None else level
        self.llm.sleep(level=level)
        self.level, self._asleep = level, {"weights", "kv_cache"}
        if level == 2:
            for backend in self.shared.backends:
                backend.stale = True  # its weights are gone: the next use syncs them in again
        return level

    def wake(self, tags: list[str] | None = None) -> None:
        """Wake the engine (``tags=["weights"]``: only its weights, before a sync fills them)."""
        wanted = {"weights", "kv_cache"} if tags is None else set(tags)
        if self._asleep & wanted:
            self.llm.wake_up(tags=tags)
            self._asleep -= wanted
            if not self._asleep:
                self.level = 0

    def _ready(self) -> None:
        """Before a generate: synced if the learner moved on, and awake."""
        if self.stale:
            self.sync()
        self.wake()

    def prepare(self) -> None:
        """Built, probed, synced and awake now (in the main thread, on every rank: a sharded agent's
        sync is a collective), so that another thread can generate with it without syncing."""
        self.llm, self.probe
        self._ready()

    def prompt(self, observation: dict[str, Any], agent=None) -> dict[str, Any]:
        """vLLM prompt of one observation: token ids of the chat prompt, plus media for multimodal
        families (``agent``: whose tokenizer; the rollout thread's stand-in has its own)."""
        agent = agent or self.agent
        family = agent.family
        if family.name == "causal_lm":
            text = family.prompt_text(observation["messages"])
            ids = agent.tokenizer(text, add_special_tokens=False)["input_ids"]
            return {"prompt_token_ids": list(ids)}
        text = family.prompt_text(observation["messages"], family.placeholder(observation))
        media: dict[str, Any] = {}
        if family.name == "audio":
            waveform = family.waveform_of(observation)
            if waveform is not None:
                rate = getattr(getattr(family.processor, "feature_extractor", None), "sampling_rate", 16000)
                media["audio"] = (waveform, rate)
        elif family.name == "vision":
            frames = family.frames_of(observation)
            if frames is not None:
                media["video"] = frames
        else:
            raise ValueError(f"{self.where}.backend: vllm has no input path for family {family.name!r}")
        return {"prompt": text, "multi_modal_data": media} if media else {"prompt": text}

    def sample(
        self,
        observations: Sequence[dict[str, Any]],
        inputs: dict[str, Any],
        greedy: bool,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        self._ready()
        return self.sample_as(self.agent, observations, greedy, seeds)

    def sample_as(
        self, agent, observations: Sequence[dict[str, Any]], greedy: bool, seeds: Sequence[int] | None = None
    ) -> list[Generation]:
        """Sample with the weights the engine holds now, prompts tokenised by ``agent`` (this agent,
        or the rollout thread's stand-in for it); no sync."""
        from vllm import SamplingParams

        # one seed per request (one shared seed would give every rollout of a group the same
        # sample), drawn from torch's generator so seeded runs repeat, as HF sampling does
        if seeds is None:  # the driver passes per-trajectory seeds (global position); else torch's generator
            seeds = torch.randint(0, 2**31 - 1, (len(observations),)).tolist()
        seeds = [int(s) % (2**31 - 1) for s in seeds]
        params = [
            SamplingParams(
                n=1,
                temperature=0.0 if greedy else agent.temperature,
                top_p=1.0 if greedy else agent.top_p,
                max_tokens=agent.max_new_tokens,
                stop_token_ids=agent.eos_ids,
                logprobs=0,  # the sampled token's own log-prob
                seed=None if greedy else seed,
                detokenize=False,
            )
            for seed in seeds
        ]
        outputs = self._generate([self.prompt(o, agent) for o in observations], params)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs or [], ids)]
            results.append(Generation(torch.tensor(ids, dtype=torch.long),
                                      sampler_logprobs=torch.tensor(logprobs, dtype=torch.float32)))
        return results

    def score(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """The engine's log-probs of given completions after given prompts (token ids), at
        temperature 1: vLLM's prompt log-probs of prompt + completion. For checks of the sync and
        the sampler-learner gap."""
        self._ready()
        return self._score(prompts, completions)

    def _score(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        requests = [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompts, completions)]
        if self.adapter is None:
            outputs = self._generate(requests, params)
        else:  # vLLM 0.32 CPU: prompt log-probs of several LoRA requests at once fail in its LoRA logits op
            outputs = [out for request in requests for out in self._generate([request], params)]
        scores = []
        for out, prompt, completion in zip(outputs, prompts, completions):
            steps = out.prompt_logprobs[len(prompt) :]
            scores.append(torch.tensor([step[t].logprob for step, t in zip(steps, completion)], dtype=torch.float32))
        return scores

    def _generate(self, prompts: list[dict[str, Any]], params):
        """``LLM.generate``, with this agent's adapter when it has one; never into a sleeping engine."""
        assert not self._asleep, f"{self.where}: generate on a sleeping vLLM engine"
        request = None if self.adapter is None else self.adapter.request()
        extra = {} if request is None else {"lora_request": request}
        return self.llm.generate(prompts, params, use_tqdm=False, **extra)

    # --- weight sync --------------------------------------------------------------------------
    @torch.no_grad()
    def sync(self) -> int:
        """Bring the learner's weights into the engine and verify them; returns tensors sent.

        A full fine-tune sends every weight, one layer at a time; a LoRA agent sends its adapter
        as the next version. The engine is woken first (its weights, then its KV cache): weights
        never go into a sleeping engine. Every rank must call it (gathering a sharded parameter is
        a collective, and so is the learner's forward of the probe).
        """
        sent = self._install()
        self.verify()  # raises WeightSyncError, leaving the engine stale
        self.stale = False
        return sent

    def _install(self, weights: Mapping[str, torch.Tensor] | None = None) -> int:
        """The learner's weights (``weights``: those of a :meth:`snapshot` instead) into the engine,
        weights woken first; returns tensors sent."""
        self.wake(["weights"])
        if self.adapter is None:
            sent = self._load(layers(self.agent.model, weights))
        self.wake()
        if self.adapter is not None:
            sent = self._load_adapter(weights)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.syncs += 1
        return sent

    # --- snapshots: rollouts sampled ahead of the update ----------------------------------------
    @torch.no_grad()
    def snapshot(self) -> dict[str, Any]:
        """In the main thread, between two updates: the learner's trainable tensors and its
        log-probs of the probe, all :meth:`load_snapshot` needs later, from another thread."""
        # read here, not by the rollout thread: the learner's forwards swap its output head out meanwhile;
        # a sharded model's weights are gathered here too, to host memory (each gather is a collective)
        if self.adapter is not None:
            weights = self.adapter.tensors()
        elif is_sharded(self.agent.model):
            weights = gathered_weights(self.agent.model)
        else:
            weights = trainable_weights(self.agent.model, whole=True)
        return {"weights": weights, "probe": learner_logprobs(self.agent, self.probe)}

    @torch.no_grad()
    def load_snapshot(self, snapshot: Mapping[str, Any]) -> int:
        """In the rollout thread, between two generations: a :meth:`snapshot` into the engine,
        verified against the learner's probe log-probs it carries. The engine then holds weights
        older than the learner's: it counts as stale, so a later use outside the pipeline syncs."""
        self.stale = True
        sent = self._install(snapshot["weights"])
        self._check(snapshot["probe"])
        return sent

    def _load(self, groups) -> int:
        assert "weights" not in self._asleep, f"{self.where}: weights into a sleeping vLLM engine"
        sent = 0
        layerwise = all(self.llm.collective_rpc(_begin_reload))
        for group in groups:
            sent += sum(self.llm.collective_rpc(_load_weights, args=(group,))[:1])
        if layerwise:
            self.llm.collective_rpc(_end_reload)
        return sent

    def _load_adapter(self, weights: Mapping[str, torch.Tensor] | None = None) -> int:
        """Write the adapter's next version (``weights``: a snapshot's), load it into the engine
        and forget the older ones."""
        assert not self._asleep, f"{self.where}: an adapter into a sleeping vLLM engine"
        sent = self.adapter.save(weights)
        engine = self.llm.llm_engine
        engine.add_lora(self.adapter.request())
        for lora_id in self.adapter.drop_older():
            if lora_id in engine.list_loras():
                engine.remove_lora(lora_id)
        return sent

    def verify(self) -> float:
        """The engine's log-probs of the probe against the learner's (``backends.verify``)."""
        return self._check(learner_logprobs(self.agent, self.probe))

    @property
    def probe(self):
        """The fixed prompt + completion every sync is checked on, tokenised once (in the main
        thread: the rollout thread's checks reuse it)."""
        if self._probe is None:
            self._probe = make_probe(self.agent)
        return self._probe

    def _check(self, learner: torch.Tensor) -> float:
        probe = self.probe
        engine = self._score([probe.prompt_ids], [probe.completion_ids])[0]
        self.gap = check_sync(f"agents.{self.agent.name}", self.syncs, engine, learner, self.tolerance)
        return self.gap
