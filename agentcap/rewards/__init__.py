"""Rewards: per-sample functions (``agentcap.rewards.functional``) and their synced Metric classes."""

from agentcap.rewards.base import RewardMetric, weighted_sum
from agentcap.rewards.cloze import CaptionLength, EventTemporalAlignment, EvidenceSufficiency, GoldToPrediction
from agentcap.rewards.read import AnswerAccuracy, AnswerFormat, AnswerLength, Coherence, read_rewards

__all__ = [
    "AnswerAccuracy", "AnswerFormat", "AnswerLength", "CaptionLength", "Coherence", "EventTemporalAlignment",
    "EvidenceSufficiency", "GoldToPrediction", "RewardMetric", "read_rewards", "weighted_sum",
]
