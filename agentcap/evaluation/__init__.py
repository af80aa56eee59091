"""Evaluation: held-out rollouts scored by the environment's rewards, and the run's ``summary.json``."""

from agentcap.evaluation.rollouts import evaluate_rollouts, write_summary

__all__ = ["evaluate_rollouts", "write_summary"]
