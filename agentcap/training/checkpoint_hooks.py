"""What a checkpoint adds to the weights, so that `agentcap fit` resumes inside any stage.

The schedule tick is the progress; the active stage's optimiser and lr-schedule state, KL
reference and replayed Instruct items come back when that stage begins again (:meth:`CheckpointHooks.restored_for`). A
checkpoint written by another schedule is refused: its ticks would mean other stages. Under sharded
checkpoints the optimiser and reference stay sharded (``resume.sharded``); the entries' names: ``resume.entries`` and come back as
:class:`~agentcap.resume.sharded.Shards`, read by each process when the stage begins.
"""

from __future__ import annotations

from typing import Any

from agentcap.parallel.sharding import optimizer_state
from agentcap.resume import entries


class CheckpointHooks:
    """Lightning's checkpoint hooks for :class:`agentcap.training.module.GRPOModule` (a mixin)."""

    _restored: dict[str, Any] | None = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        active = None if self._stage_index is None else self.schedule.stages[self._stage_index]
        # a sharded checkpoint (grpo_fsdp) keeps each process's shards; any other gathers full tensors
        full = not getattr(getattr(self._trainer, "strategy", None), "sharded_checkpoints", False)
        checkpoint[entries.ENTRY] = {
            entries.TICK: self.tick,
            entries.SUMMARY: self.summary,
            entries.STAGE_INDEX: self._stage_index,
            entries.STAGES: [stage.name for stage in self.schedule.stages],
            entries.OPTIMIZER: None if self._optimizer is None else optimizer_state(self._trainable(), self._optimizer, full),
            entries.SCHEDULER: None if self._scheduler is None else self._scheduler.state_dict(),
            # a LoRA agent's reference is its own base (no state) or its stage-start adapter; a full fine-tune's is a copy
            entries.REFERENCE: None if self._reference is None else self._reference.state(full),
            entries.REPLAY: self.replay.state(active),
            entries.ROLLOUTS: self.pipeline.state(),  # max_staleness: batches in flight, as the snapshots that sample them
        }
        # Lightning's copies of the stage's optimiser and schedule (the trainer holds them for its
        # callbacks, training.optim.show_to_lightning): the entry above has them, once
        if "optimizer_states" in checkpoint:
            checkpoint["optimizer_states"], checkpoint["lr_schedulers"] = [], []

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(entries.ENTRY)
        if state is None:
            return
        _drop_reference(checkpoint)
        self.schedule.check_resumable(state.get(entries.STAGES), self.run_dir)
        self.tick, self.summary = int(state[entries.TICK]), dict(state[entries.SUMMARY])
        self._restored = state
        self.pipeline.load_state(state.get(entries.ROLLOUTS))  # batches in flight at the checkpoint (rollout.pipeline)
        for agent in self.agents.values():  # the weights about to be loaded must reach any engine
            agent.backend.weights_changed()
        # progress is the tick; Lightning's own loop counters would end the resumed epoch early
        checkpoint.pop("loops", None)

    def restored_for(self, index: int) -> dict[str, Any] | None:
        """The checkpoint's state for stage ``index`` when a resume lands inside it (taken once)."""
        restored, self._restored = self._restored, None
        return restored if restored is not None and restored.get(entries.STAGE_INDEX) == index else None


def _drop_reference(checkpoint: dict[str, Any]) -> None:
    """Checkpoints written before the reference stopped being a submodule also hold it as module
    weights (``_reference.*``); it comes back from the "reference" entry when its stage begins."""
    weights = checkpoint.get("state_dict", {})
    for key in [k for k in weights if k.startswith("_reference.")]:
        del weights[key]
