"""Evaluation as the papers report it: held-out rollouts scored by the environment's rewards and the
papers' metrics, the run's ``summary.json``, and the results table."""
