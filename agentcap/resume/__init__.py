"""A run's files on disk, as resuming reads them: the run folder's lock, tick checkpoints (one file,
or DCP shards one per rank: written, rotated, found again), the recorded config and the numerics it
ran on. Nothing here knows the module: its checkpoint hooks live with it (``training.checkpoint_hooks``)."""
