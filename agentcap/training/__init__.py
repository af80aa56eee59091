"""How a stage trains: ``GRPOModule`` and its schedule, the trainable agent's optimiser, old
log-probs, and what each step logs."""
