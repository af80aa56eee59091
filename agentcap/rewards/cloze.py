"""Running-mean metrics for the AudioMap / ACE-Cap rewards; each delegates to its functional form.

The examiners are held as plain attributes (they are not ``nn.Module``s), so a metric's state
dict and ``.to(device)`` never carry the judge's weights; only the sum and count are synced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentcap.judges.examiner import Examiner, Question
from agentcap.judges.temporal import TemporalExaminer
from agentcap.rewards.base import RewardMetric
from agentcap.rewards.functional.cloze import event_temporal_reward, evidence_sufficiency, length_reward


class EvidenceSufficiency(RewardMetric):
    """Mean R_ESR (AudioMap Eq. 3) — the same number as ACE-Cap's G2P R_G (Eq. 3).

    ``update(captions, banks)`` with ``banks[i]`` the list of :class:`Question` for caption i.
    """

    def __init__(self, examiner: Examiner, r_pos: float = 1.0, r_abs: float = -0.5, r_neg: float = -1.0, **kwargs):
        super().__init__(**kwargs)
        self.examiner = examiner
        self.scores = {"r_pos": r_pos, "r_abs": r_abs, "r_neg": r_neg}

    def per_sample(self, captions: Sequence[str], banks: Sequence[Sequence[Question]]) -> torch.Tensor:
        return evidence_sufficiency(captions, banks, self.examiner, **self.scores)


#: ACE-Cap's name for the same metric.
GoldToPrediction = EvidenceSufficiency


class EventTemporalAlignment(RewardMetric):
    """Mean R_ECTR (AudioMap Eq. 5); ``update(captions, anchors_per_caption)``."""

    def __init__(self, examiner: TemporalExaminer, **kwargs):
        super().__init__(**kwargs)
        self.examiner = examiner

    def per_sample(
        self, captions: Sequence[str], anchors_per_caption: Sequence[Sequence[Mapping[str, Any]]]
    ) -> torch.Tensor:
        return event_temporal_reward(captions, anchors_per_caption, self.examiner)


class CaptionLength(RewardMetric):
    """Mean R_len (our definition, see :func:`length_reward`); ``update(captions, references)``."""

    def __init__(self, tolerance: float = 0.25, **kwargs):
        super().__init__(**kwargs)
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance}")
        self.tolerance = tolerance

    def per_sample(self, captions: Sequence[str], references: Sequence[str]) -> torch.Tensor:
        return length_reward(captions, references, self.tolerance)
