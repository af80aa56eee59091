"""How a run resumes: the config guard of a run_dir, tick checkpoints (written, rotated, found again),
what a checkpoint adds to the weights, and loading a trained run for the commands."""
