"""An agent: a named role bound to a model, its tokenizer / processor, generation settings and a
trainable flag.

Generation is always batched over every observation waiting on the agent; the old log-probs the
clipped objective needs are recomputed with the same forward pass the update uses, so sampler and
learner can never disagree about them (they may differ from generate's internal scores by padding
and kernel choice).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
import torch.nn as nn

from agentcap.agents.adapters import Adapters, LoraSpec, attach_adapter, fingerprint
from agentcap.agents.backends.base import VLLMOptions
from agentcap.agents.backends.build import build_backend
from agentcap.agents.checkpointing import enable_gradient_checkpointing
from agentcap.agents.families import FAMILIES, Family, Observation
from agentcap.agents.generation import Generation
from agentcap.agents.hub import MissingWeightsError, resolve_model
from agentcap.agents.literal import literal
from agentcap.agents.logprobs import chosen_logprobs, head_removed, logits_logprobs, plain_head
from agentcap.agents.sampling import number_token_ids
from agentcap.agents.tiny import build_tiny
from agentcap.agents.tokenizer import build_word_tokenizer, saved_word_tokenizer
from agentcap.agents.tokens import pad_right, trim_after_eos  # noqa: F401  (trim_after_eos: re-exported)
from agentcap.agents.toy import ToyConfig, ToyMediaLM
from agentcap.core.settings import ConfigError, check
from agentcap.parallel import loading


@dataclass
class AgentConfig:
    """How to build one agent. Exactly one of ``model`` (a local path), ``toy`` or ``tiny``.

    Args:
        model: local folder of a Hugging Face model (or of a saved toy model), or a Hub id
            (``org/name``, ``@revision`` optional) read from the HF cache (``agentcap.agents.hub``).
        family: how observations become model inputs; ``auto`` reads the model's config.
        toy: fields of :class:`agentcap.agents.toy.ToyConfig` for the offline demo's media LM.
        tiny: an HF config (``model_type`` plus fields) to build a tiny random model, for tests.
        tokenizer: local tokenizer / processor folder or Hub id; defaults to ``model``.
        build_tokenizer_from: text files whose words form a word-level tokenizer (offline demos).
        max_new_tokens: generation budget per action.
        temperature: sampling temperature; log-probs are taken at the same temperature.
        top_p: nucleus sampling mass.
        lr: learning rate of this agent's optimiser, when it trains.
        dtype: parameter dtype. A trained agent keeps float32 parameters (master weights; use
            ``--trainer.precision bf16-mixed`` for bf16 compute); bf16 suits frozen agents and
            the base under an adapter.
        gguf_file: file name inside ``model`` for GGUF checkpoints.
        trust_remote_code: off unless you trust the model folder's code.
        backend: who samples the actions: ``hf`` (the model's ``generate``), ``vllm`` (an engine
            whose weights are synced after every optimiser step; needs ``model`` to be a plain HF folder)
            or ``served`` (``vllm serve`` processes of their own, synced the same way: ``vllm.served``).
        vllm: engine options when ``backend`` is ``vllm`` or ``served``.
        peft: train a LoRA adapter (rank, alpha, target modules) instead of the weights.
        share_base_with: another role whose base model this one shares, one adapter each (both
            need ``peft``); this role then names no model of its own, or the same one.
        gradient_checkpointing: recompute each layer's activations in the backward pass (less
            memory, about one more forward); dropout stays off.
        share_prompts: HF backend: prefill a prompt that repeats in a batch (an item's G rollouts)
            once and copy its KV cache to the rows that repeat it; off gives the plain prefill.
        greedy_numbers: HF backend: sampled responses write their numbers greedily (whether a number
            comes next is drawn, which one is the likeliest; ``agents.sampling``), and the policy loss
            leaves those number tokens out, since π did not draw them. For timed captions whose groups
            would otherwise differ only in their digits (docs/real.md).
        number_beta: with ``greedy_numbers``: a KL coefficient on those numbers alone (k3 against the
            stage's reference, each number weighted like a trained token), so that the timing they
            write stays near the reference's while the policy term trains the words around them.
            0 leaves them out of the loss; needs ``--model.beta > 0`` (the reference is built then).
    """

    model: str | None = None
    family: Literal["auto", "causal_lm", "toy", "vision", "audio"] = "auto"
    toy: dict[str, Any] | None = None
    tiny: dict[str, Any] | None = None
    tokenizer: str | None = None
    build_tokenizer_from: list[str] = field(default_factory=list)
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 1e-5
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gguf_file: str | None = None
    trust_remote_code: bool = False
    backend: Literal["hf", "vllm", "served"] = "hf"
    vllm: VLLMOptions = field(default_factory=VLLMOptions)
    peft: LoraSpec | None = None
    share_base_with: str | None = None
    gradient_checkpointing: bool = False
    share_prompts: bool = True
    greedy_numbers: bool = False
    number_beta: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.vllm, dict):
            known = set(VLLMOptions.__dataclass_fields__)
            unknown = sorted(set(self.vllm) - known)
            if unknown:
                raise ValueError(f"vllm: unknown option(s) {unknown}; known: {sorted(known)}")
            self.vllm = VLLMOptions(**self.vllm)

    def check(self, role: str) -> None:
        """Refuse a numeric field outside its range, before any weights load (``ConfigError``
        naming ``--model.agents.<role>.<field>``)."""
        key = f"--model.agents.{role}"
        check(f"{key}.max_new_tokens", self.max_new_tokens, "≥ 1")
        check(f"{key}.temperature", self.temperature, "> 0",
              " (rollouts sample at this temperature and log-probs divide the logits by it, so 0 is not greedy "
              "here: GRPO needs sampling; greedy decoding is an evaluate stage's `greedy: true`, the default)")
        check(f"{key}.top_p", self.top_p, "in (0, 1]")
        check(f"{key}.lr", self.lr, "> 0")
        check(f"{key}.vllm.gpu_memory_utilization", self.vllm.gpu_memory_utilization, "in (0, 1]")
        check(f"{key}.vllm.tensor_parallel_size", self.vllm.tensor_parallel_size, "≥ 1")
        check(f"{key}.vllm.max_model_len", self.vllm.max_model_len, "≥ 1")
        check(f"{key}.vllm.seed", self.vllm.seed, "≥ 0")
        check(f"{key}.vllm.sync_tolerance", self.vllm.sync_tolerance, "> 0")
        if self.greedy_numbers and self.backend != "hf":
            raise ConfigError(f"{key}.greedy_numbers needs backend: hf (the numbers are collapsed in HF generate's "
                              f"logits), got backend {self.backend!r}")
        check(f"{key}.number_beta", self.number_beta, "≥ 0")
        if self.number_beta > 0 and not self.greedy_numbers:
            raise ConfigError(f"{key}.number_beta is the KL on the greedily written numbers: it needs "
                              f"{key}.greedy_numbers: true, got number_beta {self.number_beta!r} without it")
        if self.peft is not None:
            check(f"{key}.peft.r", self.peft.r, "≥ 1")
            check(f"{key}.peft.alpha", self.peft.alpha, "> 0")
            if self.peft.dropout != 0:
                raise ConfigError(f"{key}.peft.dropout must be 0 (agents run in eval mode, so LoRA dropout "
                                  f"would never act), got {self.peft.dropout!r}")


class Agent(nn.Module):
    """A role bound to a model (see module docstring)."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        tokenizer,
        family: str = "causal_lm",
        processor=None,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        lr: float = 1e-5,
        adapters: Adapters | None = None,
        share_prompts: bool = True,
        greedy_numbers: bool = False,
        number_beta: float = 0.0,
    ):
        super().__init__()
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self.processor = processor
        self.family: Family = FAMILIES[family](model, tokenizer, processor)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.lr = lr
        self.share_prompts = share_prompts  # HF backend: one prefill per distinct prompt of a batch
        # sampled numbers are the likeliest ones, and the policy loss skips them (trained_tokens)
        self.greedy_ids = number_token_ids(tokenizer) if greedy_numbers else None
        self.number_beta = number_beta  # their KL to the reference (training.update.policy_loss)
        self.trainable = False
        self.adapters = adapters  # LoRA: only the adapter trains, the checkpoint holds only it
        # parameters the model itself keeps fixed (e.g. sinusoidal audio positions) stay fixed
        self._always_frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        if adapters is not None:
            adapters.install_state_hooks(self)
        self.set_trainable(False)
        self.backend = build_backend(self)

    def use_backend(self, backend: str, options: VLLMOptions | None = None, model_path: str | None = None,
                    share=None) -> None:
        """Sample with ``backend`` from now on (``build_agent`` calls it from the config); ``share``: the
        vLLM backend of the role whose base this one shares."""
        self.backend = build_backend(self, backend, options, model_path, where=f"agents.{self.name}", share=share)

    def sync_weights(self) -> None:
        """After an optimiser step of this (trainable) agent: its sampler takes the new weights
        before its next rollout. Lazily: a stage of many SFT steps costs one sync, not one per step."""
        if self.trainable:
            self.backend.weights_changed()

    def set_trainable(self, trainable: bool) -> None:
        """Frozen agents have no grad, so they carry no optimiser state; an adapter agent trains
        its adapter only."""
        self.trainable = trainable
        if self.adapters is not None:
            self.adapters.set_trainable(trainable)
        else:
            for name, param in self.model.named_parameters():
                param.requires_grad_(trainable and name not in self._always_frozen)
        self.model.eval()

    def trainable_parameters(self) -> list[nn.Parameter]:
        """This agent's parameters with gradients (a shared base also lists other roles' adapters)."""
        own = self.adapters.own_parameters() if self.adapters is not None else self.model.parameters()
        return [p for p in own if p.requires_grad]

    def active(self):
        """The context every forward of this agent runs in: its own adapter on a shared base."""
        return self.adapters.active() if self.adapters is not None else contextlib.nullcontext()

    def train(self, mode: bool = True):
        """Always eval mode: with dropout on, the sampler and the learner would see different
        policies and the first PPO ratio would not be 1."""
        return super().train(False)

    @property
    def adapter_base_fingerprint(self) -> torch.Tensor | None:
        """The base's fingerprint that an adapter agent's state dict carries (``Adapters``' hooks), as an
        attribute too: ``torch.distributed.checkpoint`` (Lightning's ``grpo_fsdp`` checkpoints) resolves
        every state-dict key to an attribute, and refused this one without it."""
        return self.adapters.base_fingerprint if self.adapters is not None else None

    @property
    def eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(gen_eos)
        return sorted(i for i in ids if i is not None)

    # --- generation ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        observations: Sequence[Observation],
        greedy: bool = False,
        batch_size: int = 64,
        seeds: Sequence[int] | None = None,
        old_logprobs: bool = True,
    ) -> list[Generation]:
        """One batched sampling call per ``batch_size`` observations; returns texts, ids and, with
        ``old_logprobs``, the learner's log-probs (one more forward: GRPO skips it, see
        ``agentcap.training.old_policy``).

        With ``seeds`` (one per observation) each row samples from its own generator
        (:class:`~agentcap.agents.sampling.RowSampler`), so a row's tokens do not depend on the
        batch it shares or on the process that runs it; without, from the global RNG.
        """
        # an engine holds its own weights and adapters: the shared model's active adapter is left alone
        # (another thread may be running it), and the learner's log-probs enter it themselves
        holds = getattr(self.backend, "holds_weights", False)
        with contextlib.nullcontext() if holds else self.active():
            return self._generate(observations, greedy, batch_size, seeds, old_logprobs)

    def _generate(
        self,
        observations: Sequence[Observation],
        greedy: bool,
        batch_size: int,
        seeds: Sequence[int] | None,
        old_logprobs: bool,
    ) -> list[Generation]:
        results: list[Generation] = []
        for start in range(0, len(observations), batch_size):
            chunk = list(observations[start : start + batch_size])
            inputs = self.family.encode(chunk)
            row_seeds = None if seeds is None else seeds[start : start + batch_size]
            sampled = self.backend.sample(chunk, inputs, greedy, row_seeds)
            completion, mask = pad_right([x.completion_ids for x in sampled], self.tokenizer.pad_token_id, self.family.device)
            logprobs = self.completion_logprobs(inputs, completion, mask) if old_logprobs else None
            for i, x in enumerate(sampled):  # the backend's records, completed with text and old log-probs
                n = int(mask[i].sum())
                ids = completion[i, :n]
                old = None if logprobs is None else logprobs[i, :n].cpu()
                results.append(replace(
                    x, text=self.tokenizer.decode(ids, skip_special_tokens=True).strip(), completion_ids=ids.cpu(),
                    old_logprobs=old, sampler_logprobs=old if x.sampler_logprobs is None else x.sampler_logprobs,
                ))
        return results

    # --- scoring ------------------------------------------------------------------------------
    def completion_logprobs(
        self,
        inputs: dict[str, Any],
        completion: torch.Tensor,
        mask: torch.Tensor,
        with_entropy: bool = False,
        temperature: float | None = None,
    ):
        """log π(completion token | prompt, earlier tokens): [N, T].

        At the sampling temperature by default (the policy that produced the rollouts); SFT passes
        ``temperature=1`` so the supervised loss trains the model itself, not its tempered copy.
        With ``with_entropy`` also returns the per-token entropy of the same distribution.
        """
        temperature = self.temperature if temperature is None else temperature
        with self.active():  # this role's adapter on a shared base
            model = self.family.model  # the live policy, or a KL reference swapped in (agents.reference)
            head = plain_head(model)
            if head is None:
                logits = self.family.logits(inputs, completion, mask, self.share_prompts).float() / temperature
                logprobs, entropy = logits_logprobs(logits, completion, with_entropy)
                logprobs = logprobs * mask
                return (logprobs, entropy * mask) if with_entropy else logprobs
            # the head applied chunk-wise to the completion tokens only: no [N, T, V] tensor survives
            path, linear = head
            with head_removed(model, path):
                hidden = self.family.logits(inputs, completion, mask, self.share_prompts)  # [N, T, H]
            keep = mask.bool()
            chosen, entropy_kept = chosen_logprobs(hidden[keep], linear.weight, completion[keep], temperature)
            logprobs = chosen.new_zeros(completion.shape).masked_scatter(keep, chosen)
        if not with_entropy:
            return logprobs
        return logprobs, entropy_kept.new_zeros(completion.shape).masked_scatter(keep, entropy_kept)

    def encode(self, observations: Sequence[Observation]) -> dict[str, Any]:
        return self.family.encode(list(observations))

    def trained_tokens(self, completion: torch.Tensor) -> torch.Tensor:
        """Where the policy loss trains a sampled completion (any shape of ids): everywhere, or, with
        ``greedy_numbers``, everywhere but the numbers, which were not drawn from π."""
        if self.greedy_ids is None:
            return torch.ones_like(completion, dtype=torch.bool)
        return ~torch.isin(completion, self.greedy_ids.to(completion.device))

    def encode_completions(self, texts: Sequence[str]) -> list[torch.Tensor]:
        """Token ids of target completions (SFT), ending in EOS like a sampled action; the text is data:
        an ``</s>`` or ``<|im_end|>`` in it stays literal (``agentcap.agents.literal``), the EOS is ours."""
        eos = self.tokenizer.eos_token_id
        out = []
        for text in texts:
            ids = self.tokenizer(literal(text, self.tokenizer), add_special_tokens=False)["input_ids"]
            out.append(torch.tensor(list(ids) + [eos], dtype=torch.long))
        return out


# --- building agents from configs -------------------------------------------------------------
def build_agent(
    name: str, config: AgentConfig, extra_texts: Sequence[str] = (), demo_hint: str = "configs/demo/",
    vocabulary: str | None = None,
) -> Agent:
    """Load or build the model, tokenizer and family named by ``config``.

    ``extra_texts`` join ``build_tokenizer_from`` when a word-level tokenizer is built (the module
    passes the environment's prompts and demonstrations, so every prompt word has an id);
    ``vocabulary`` is where that word list is saved and, once saved, reused instead.

    Under ``grpo_fsdp`` (:func:`agentcap.parallel.loading.load_by_shard`) the model is built on the
    meta device wherever its weights will come later, shard by shard (:mod:`agentcap.parallel.loading`).
    """
    config.check(name)
    if sum(x is not None for x in (config.model, config.toy, config.tiny)) != 1:
        raise ValueError(f"agents.{name}: give exactly one of model / toy / tiny")
    dtype = getattr(torch, config.dtype)
    tokenizer = _load_tokenizer(name, config, extra_texts, vocabulary)
    if config.toy is not None:
        built = _toy_model(config, tokenizer)
    elif config.tiny is not None:
        built = _tiny_model(config, tokenizer, extra_texts)
    else:
        built = _pretrained_model(name, config, tokenizer, dtype, demo_hint)
    model = built.model.to(dtype)
    if loading.loads_by_shard() and (built.folder is not None or config.model is None):
        folder = built.folder
        full = None if folder is None else lambda: _load_hf_model(folder, config, dtype).to(dtype)
        loading.defer(model, loading.Pending(folder, full))
    if built.tokenizer is None:
        raise ValueError(f"agents.{name}: no tokenizer (set tokenizer, model or build_tokenizer_from)")
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model, name)
    with loading.keeping_values(model):  # an adapter attached on meta keeps its init values
        adapters = None if config.peft is None else attach_adapter(model, name, config.peft)
    _fingerprint_once_loaded(model, adapters)
    agent = _agent(name, config, model, built.tokenizer, built.family, built.processor, adapters)
    if config.backend != "hf":
        agent.use_backend(config.backend, config.vllm, resolve_model(config.model, f"agents.{name}.model"))
    return agent


@dataclass
class _Built:
    """A model as one of the four sources gives it (``folder``: its weights load by shard under grpo_fsdp)."""

    model: nn.Module
    family: str
    tokenizer: Any
    processor: Any = None
    folder: str | None = None


def _toy_model(config: AgentConfig, tokenizer) -> _Built:
    """The offline demos' media LM, sized to its word-level tokenizer."""
    toy = dict(config.toy)
    toy.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id,
    )
    with _on_meta_if(loading.builds_on_meta(None)):
        return _Built(ToyMediaLM(ToyConfig(**toy)), "toy", tokenizer)


def _tiny_model(config: AgentConfig, tokenizer, extra_texts: Sequence[str]) -> _Built:
    """A tiny random model of a real HF architecture: a preset of ``agentcap.agents.tiny`` (``kind``,
    with its real processor) or any HF config (``model_type`` plus fields)."""
    spec = dict(config.tiny)
    if "kind" in spec:
        with _on_meta_if(loading.builds_on_meta(None)):
            parts = build_tiny(spec.pop("kind"), tokenizer=tokenizer, texts=extra_texts, **spec)
        family = parts.family if config.family == "auto" else config.family
        return _Built(parts.model, family, parts.tokenizer, parts.processor)
    with _on_meta_if(loading.builds_on_meta(None)):
        model = _random_hf_model(spec)
    return _Built(model, _guess_family(model.config) if config.family == "auto" else config.family, tokenizer)


def _pretrained_model(name: str, config: AgentConfig, tokenizer, dtype: torch.dtype, demo_hint: str) -> _Built:
    """A local folder or a cached Hub id: a saved toy model, or an HF model with its processor for
    vision and audio families (the processor's tokenizer replaces the folder's)."""
    path = resolve_model(config.model, f"agents.{name}.model")  # a Hub id: its cached snapshot
    if not os.path.isdir(path):
        raise MissingWeightsError(
            f"agents.{name}.model: {path!r} is neither a local folder nor a Hub id (org/name). Give "
            f"a model folder or a Hub id, or run an offline demo recipe from {demo_hint} "
            "(e.g. `agentcap fit --config configs/demo/read.yaml`)."
        )
    if os.path.isfile(os.path.join(path, "toy_config.json")):
        return _Built(ToyMediaLM.from_pretrained(path), "toy", tokenizer)
    folder = path if config.gguf_file is None else None
    model = _load_hf_model(path, config, dtype, on_meta=folder is not None and loading.builds_on_meta(folder))
    family = _guess_family(model.config) if config.family == "auto" else config.family
    if family not in ("vision", "audio"):
        return _Built(model, family, tokenizer, folder=folder)
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(
        resolve_model(config.tokenizer, f"agents.{name}.tokenizer") or path, trust_remote_code=config.trust_remote_code
    )
    return _Built(model, family, processor.tokenizer, processor, folder)


def _agent(name: str, config: AgentConfig, model, tokenizer, family: str, processor, adapters) -> Agent:
    """The role: a model with its tokenizer and the config's generation and training settings."""
    return Agent(
        name,
        model,
        tokenizer,
        family=family,
        processor=processor,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        lr=config.lr,
        adapters=adapters,
        share_prompts=config.share_prompts,
        greedy_numbers=config.greedy_numbers,
        number_beta=config.number_beta,
    )


def build_agents(
    configs: dict[str, AgentConfig], extra_texts: Sequence[str] = (), vocabulary=lambda name: None
) -> dict[str, Agent]:
    """Every configured agent, in config order; a ``share_base_with`` role reuses that role's model
    (and tokenizer). ``vocabulary(name)``: where a word-level tokenizer's vocabulary is saved."""
    for name, config in configs.items():  # every role's settings before the first weights load
        config.check(name)
    built: dict[str, Agent] = {}
    for name, config in configs.items():
        if config.share_base_with is None:
            built[name] = build_agent(name, config, extra_texts, vocabulary=vocabulary(name))
    for name, config in configs.items():
        if config.share_base_with is not None:
            built[name] = _share_base(name, config, configs, built)
    return {name: built[name] for name in configs}


def _share_base(name: str, config: AgentConfig, configs: dict[str, AgentConfig], built: dict[str, Agent]) -> Agent:
    """A role with its own adapter on another role's (frozen, shared) base model."""
    owner = config.share_base_with
    where = f"agents.{name}.share_base_with"
    if owner not in built:
        known = sorted(n for n, c in configs.items() if c.share_base_with is None)
        raise ValueError(f"{where}: {owner!r} is not a role with a model of its own (one of {known})")
    base = built[owner]
    if config.peft is None or base.adapters is None:
        raise ValueError(f"{where}: both {name!r} and {owner!r} need a `peft` adapter to share a base")
    mine, theirs = (config.model, config.toy, config.tiny), (configs[owner].model, configs[owner].toy, configs[owner].tiny)
    if any(x is not None for x in mine) and mine != theirs:
        raise ValueError(f"{where}: {name!r} names another model than {owner!r}; give none, or the same one")
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(base.model, name)
    with loading.keeping_values(base.model):  # an adapter attached on meta keeps its init values
        adapters = attach_adapter(base.model, name, config.peft, share=base.adapters)
    _fingerprint_once_loaded(base.model, adapters)
    agent = _agent(name, config, base.model, base.tokenizer, base.family.name, base.processor, adapters)
    agent.family = copy.copy(base.family)  # keeps family settings (frames_as…) of the same model
    if config.backend == "vllm":  # one engine: the base once, an adapter per role
        if getattr(base.backend, "shared", None) is None:
            raise ValueError(f"agents.{name}.backend: vllm with share_base_with needs agents.{owner}.backend: vllm "
                             "too (one engine holds the base and an adapter per role)")
        agent.use_backend("vllm", config.vllm, base.backend.model_path, share=base.backend)
    elif config.backend == "served":  # the same servers, an adapter of its own
        agent.use_backend("served", config.vllm, resolve_model(configs[owner].model, f"agents.{owner}.model"))
    return agent


def _load_tokenizer(name: str, config: AgentConfig, extra_texts: Sequence[str] = (), vocabulary: str | None = None):
    if config.build_tokenizer_from and vocabulary is not None:
        return saved_word_tokenizer(vocabulary, lambda: _load_tokenizer(name, config, extra_texts))
    if config.build_tokenizer_from:
        texts = list(extra_texts)
        for path in config.build_tokenizer_from:
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"agents.{name}.build_tokenizer_from: {path!r} not found (generate the toy world "
                    "first: see the README's demo command)"
                )
            with open(path, encoding="utf-8") as handle:
                texts.extend(handle.read().splitlines())
        return build_word_tokenizer(texts)
    source = config.tokenizer or config.model
    if source is None:
        return None
    source = resolve_model(source, f"agents.{name}.{'tokenizer' if config.tokenizer else 'model'}")
    if not os.path.isdir(source):
        return None  # reported by the model branch with the demo hint
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": config.gguf_file} if config.gguf_file else {}
    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=config.trust_remote_code, **kwargs)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _load_hf_model(path: str, config: AgentConfig, dtype, on_meta: bool = False):
    """The folder's model; ``on_meta``: its architecture only, parameters on the meta device, to be
    filled shard by shard after sharding (``agentcap.parallel.loading``)."""
    import transformers

    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": config.trust_remote_code}
    if config.gguf_file:
        kwargs["gguf_file"] = config.gguf_file
    hf_config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=config.trust_remote_code)
    if hf_config.model_type == "qwen2_5_omni":  # the thinker writes the text; talker and vocoder stay on disk
        cls = transformers.Qwen2_5OmniThinkerForConditionalGeneration
        hf_config, kwargs["config"] = hf_config.thinker_config, hf_config.thinker_config
    else:
        found = [getattr(transformers, auto) for auto in ("AutoModelForImageTextToText", "AutoModelForMultimodalLM",
                                                          "AutoModelForCausalLM")]
        found = [auto for auto in found if type(hf_config) in auto._model_mapping]
        if not found:
            raise ValueError(f"{path}: model type {hf_config.model_type!r} has no generative head agentcap can load")
        cls = found[0]
    if not on_meta:
        return cls.from_pretrained(path, **kwargs)
    with loading.parameters_on_meta():
        model = cls.from_config(hf_config, dtype=dtype, trust_remote_code=config.trust_remote_code) \
            if hasattr(cls, "_model_mapping") else cls._from_config(hf_config, dtype=dtype)
    if os.path.isfile(os.path.join(path, "generation_config.json")):  # what from_pretrained also reads
        model.generation_config = transformers.GenerationConfig.from_pretrained(path)
    return model.eval()


def _fingerprint_once_loaded(model: nn.Module, adapters: Adapters | None) -> None:
    """A base that loads by shard is fingerprinted once its weights are in, from its shards, on
    every process alike (rank 0's init-time value could differ in the last bits)."""
    record = loading.pending(model)
    if adapters is not None and record is not None:
        record.after.append(lambda: setattr(adapters, "base_fingerprint", fingerprint(adapters.base_parameters())))


@contextlib.contextmanager
def _on_meta_if(meta: bool):
    with loading.parameters_on_meta() if meta else contextlib.nullcontext():
        yield


def _random_hf_model(spec: dict[str, Any]):
    """Build a random model of a real architecture class from an HF config dict (tests, demos)."""
    import transformers

    spec = dict(spec)
    architecture = spec.pop("architecture", None)
    model_type = spec.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **spec)
    if architecture:
        return getattr(transformers, architecture)(hf_config)
    for auto in ("AutoModelForImageTextToText", "AutoModelForMultimodalLM", "AutoModelForCausalLM"):
        cls = getattr(transformers, auto)
        if type(hf_config) in cls._model_mapping:
            return cls.from_config(hf_config)
    raise ValueError(f"tiny model_type {model_type!r} has no generative head")


def _guess_family(hf_config) -> str:
    kind = getattr(hf_config, "model_type", "")
    if "vl" in kind:
        return "vision"
    if "audio" in kind or "omni" in kind:
        return "audio"
    return "causal_lm"
