"""How a run trains: ``GRPOModule`` (the algorithm) and the rooms it calls: the update step
(``update``; ``harness`` runs it outside a Trainer for benchmarks and the GPU check), its checkpoint
and evaluation hooks, the trainable agent's optimiser, old log-probs, engines per stage, what each
step logs, callbacks; loading a trained run and the config guard of a resumed one."""
