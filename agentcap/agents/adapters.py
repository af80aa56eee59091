"""LoRA adapters through ``peft``: one named adapter per agent, optionally over a shared base.

A paper-size policy cannot carry full AdamW state, so an agent may train a LoRA adapter instead
of its weights (``agents.<role>.peft``). What this room guarantees:

1. Only the agent's own adapter has ``requires_grad`` (so only it gets gradients and optimiser
   state); the base stays frozen for the whole run. peft's own ``set_adapter`` /
   ``disable_adapter`` also switch ``requires_grad``, so every call here restores the flags the
   schedule set.
2. Roles on the same base (``share_base_with``) hold *one* model in memory, each with its adapter
   (named after the role). Before an agent generates or is scored, its adapter is made the active
   one (:meth:`Adapters.active`), so a frozen role acts with its own adapter while another trains.
3. The KL reference of an adapter agent is the same model with adapters disabled
   (:meth:`Adapters.disabled`, peft's ``disable_adapter``; ``agents.reference``), not a copy.
4. Checkpoints hold adapters, not the base: the agent's state dict keeps only its own adapter
   tensors plus a fingerprint of the base; loading fills the base keys with the live weights and
   refuses a base whose fingerprint differs (another model folder, another random init).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn

FINGERPRINT_KEY = "adapter_base_fingerprint"


@dataclass
class LoraSpec:
    """A LoRA adapter (``agents.<role>.peft``).

    Args:
        r: rank of the update B·A.
        alpha: scaling numerator; the update is scaled by alpha / r.
        dropout: LoRA dropout. Agents always run in eval mode (sampler and learner must see the
            same policy, or the first PPO ratio is not 1), so only 0 is accepted.
        target_modules: module names to adapt (``["q_proj", "v_proj"]``…) or ``all-linear``
            (every linear layer but the output head; Hugging Face models only).
        modules_to_save: modules trained in full beside the adapter (peft's ``modules_to_save``),
            e.g. ``["multi_modal_projector"]``, the new projector of an assembled audio LM. Each
            adapter gets its own copy (roles sharing a base do not share it); the KL reference
            (adapters disabled) runs the original module; checkpoints hold the copy.
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | str = field(default_factory=lambda: "all-linear")
    modules_to_save: list[str] | None = None

    def lora_config(self, role: str):
        from peft import LoraConfig

        if self.r < 1:
            raise ValueError(f"agents.{role}.peft.r: must be ≥ 1, got {self.r}")
        if self.dropout != 0.0:
            raise ValueError(
                f"agents.{role}.peft.dropout: {self.dropout} — agents always run in eval mode (the sampler "
                "and the learner must see one policy), so LoRA dropout would never act; set it to 0"
            )
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=0.0, target_modules=self.target_modules,
                          modules_to_save=list(self.modules_to_save) if self.modules_to_save else None)


@contextlib.contextmanager
def keep_requires_grad(model: nn.Module) -> Iterator[None]:
    """Undo peft's side effect on ``requires_grad`` when switching or disabling adapters."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


class Adapters:
    """One agent's adapter on a (possibly shared) peft-wrapped base.

    Not an ``nn.Module`` on purpose: the agent registers the plain HF model, whose layers peft
    modified in place; registering the peft wrapper too would list every tensor twice.
    """

    def __init__(self, peft_model, name: str):
        self.peft_model = peft_model
        self.name = name
        self.base_fingerprint = fingerprint(self.base_parameters())

    @property
    def model(self) -> nn.Module:
        """The HF model with LoRA layers injected (what the agent's family runs)."""
        return self.peft_model.get_base_model()

    @property
    def names(self) -> list[str]:
        """Every adapter on this base (several when roles share it)."""
        return list(self.peft_model.peft_config)

    def is_adapter_key(self, key: str, name: str | None = None) -> bool:
        """``…lora_A.<name>.weight``, ``…modules_to_save.<name>.weight`` and the like: a tensor of
        adapter ``name`` (any adapter if None)."""
        parts = key.split(".")
        names = self.names if name is None else [name]
        return any((p.startswith("lora_") or p == "modules_to_save") and i + 1 < len(parts) and parts[i + 1] in names
                   for i, p in enumerate(parts))

    def own_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.model.named_parameters() if self.is_adapter_key(n, self.name)]

    def base_parameters(self) -> list[torch.Tensor]:
        return [p for n, p in self.model.named_parameters() if not self.is_adapter_key(n)]

    def set_trainable(self, trainable: bool) -> None:
        """The base never trains; this agent's adapter trains when the agent does; other roles'
        adapters keep whatever their own agents set."""
        for n, p in self.model.named_parameters():
            if self.is_adapter_key(n, self.name):
                p.requires_grad_(trainable)
            elif not self.is_adapter_key(n):
                p.requires_grad_(False)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Run the shared model with this agent's adapter (and only it)."""
        if self.peft_model.active_adapters != [self.name]:
            with keep_requires_grad(self.model):
                self.peft_model.base_model.set_adapter(self.name)
        yield

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model: the KL reference of an adapter agent."""
        with keep_requires_grad(self.model), self.peft_model.disable_adapter():
            yield

    # --- checkpoints: adapters only -----------------------------------------------------------
    def install_state_hooks(self, agent: nn.Module) -> None:
        agent.register_state_dict_post_hook(lambda *args: self._drop_base(*args))
        agent.register_load_state_dict_pre_hook(lambda *args: self._fill_base(*args))

    def _drop_base(self, module, state_dict, prefix, local_metadata) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            if not self.is_adapter_key(key[len(prefix):], self.name):
                del state_dict[key]
        state_dict[prefix + FINGERPRINT_KEY] = self.base_fingerprint.clone()

    def _fill_base(self, module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        saved = state_dict.pop(prefix + FINGERPRINT_KEY, None)
        if saved is not None and not torch.allclose(saved.double(), self.base_fingerprint, rtol=1e-5, atol=0.0):
            raise ValueError(
                f"agents.{self.name}: the checkpoint's adapter was trained on another base model "
                f"(fingerprint {saved.tolist()} vs {self.base_fingerprint.tolist()}); load the same "
                "model folder (or the same tiny/toy seed) that the run trained"
            )
        own = {prefix + "model." + n for n, _ in self.model.named_parameters() if self.is_adapter_key(n, self.name)}
        for key, value in self.model.state_dict(prefix=prefix + "model.", keep_vars=True).items():
            if key not in state_dict and key not in own:
                state_dict[key] = value.detach()  # the live base (or another role's adapter) loads as itself


def fingerprint(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """Σ|w| and Σw² over the base (float64): cheap, and any other base gives other numbers.
    Over FSDP2 shards each process sums its own rows, then one all-reduce (a collective); None for a
    base still on the meta device (``agentcap.parallel.loading``: fingerprinted once loaded)."""
    if any(t.is_meta for t in tensors):
        return None
    total = torch.zeros(2, dtype=torch.float64)
    sharded = False
    with torch.no_grad():
        for t in tensors:
            if hasattr(t, "to_local"):  # a DTensor shard: rows no other process holds
                t, sharded = t.to_local(), True
            t = t.detach().double()
            total += torch.stack([t.abs().sum(), (t * t).sum()]).cpu()
    if sharded:
        import torch.distributed as dist

        dist.all_reduce(total)
    return total


def attach_adapter(model: nn.Module, name: str, spec: LoraSpec, share: Adapters | None = None) -> Adapters:
    """Inject the adapter ``name`` into ``model`` (a new peft model) or into ``share``'s base.

    Adapter weights are created in float32 even over a bf16 base (peft's autocast_adapter_dtype),
    so the trained tensors keep fp32 master precision.
    """
    from peft import get_peft_model

    config = spec.lora_config(name)
    if share is not None:
        with keep_requires_grad(share.model):
            share.peft_model.add_adapter(name, config)
        return Adapters(share.peft_model, name)
    return Adapters(get_peft_model(model, config, adapter_name=name), name)  # freezes the base
