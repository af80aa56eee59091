"""How ranks stay in step: global sums and shares of a batch, FSDP2 sharding per agent and judge,
lock-step passes of sharded models, and the Lightning strategies (``grpo_ddp``, ``grpo_fsdp``)."""
