"""The names of what a checkpoint adds to the weights, under ``checkpoint[ENTRY]``.

One place for the writer (``training.checkpoint_hooks``) and the readers (the module when a stage
begins, ``resume.sharded``); the strings are those every earlier checkpoint was written with.
"""

#: The module's extra state in a Lightning checkpoint.
ENTRY = "agentcap"
TICK = "tick"  # the schedule tick: the run's progress
SUMMARY = "summary"  # the evaluations so far (summary.json)
STAGE_INDEX = "stage_index"  # the stage running at the checkpoint (None before the first)
STAGES = "stages"  # the schedule's stage names: a checkpoint of another schedule is refused
OPTIMIZER = "optimizer"  # the trainable agent's optimiser state
SCHEDULER = "scheduler"  # its lr schedule
REFERENCE = "reference"  # the KL reference of a full fine-tune (None for LoRA: the base is the reference)
REPLAY = "replay"  # the Instruct items a harvest stage replays
ROLLOUTS = "rollouts"  # max_staleness ≥ 1: batches in flight, as the snapshots that sample them

#: The entries that are sharded like the weights in a sharded (DCP) checkpoint.
SHARDED = (OPTIMIZER, REFERENCE)
