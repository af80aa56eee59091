"""tools/encoder_probe.py: a linear probe of sound presence on an audio tower's features."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import encoder_probe  # noqa: E402


def test_auc_counts_ordered_pairs_and_ties_half():
    assert encoder_probe.auc([3, 2, 1, 0], [True, True, False, False]) == 1.0
    assert encoder_probe.auc([0, 1, 2, 3], [True, True, False, False]) == 0.0
    assert encoder_probe.auc([1, 1], [True, False]) == 0.5
    assert math.isnan(encoder_probe.auc([1, 2], [True, True]))


def test_found_at_keeps_false_alarms_within_the_share():
    scores = [0.9, 0.8, 0.3, 0.7, 0.2, 0.1, 0.05, 0.0, -1, -2]
    labels = [True, True, True, False, False, False, False, False, False, False]
    assert encoder_probe.found_at(scores, labels, 0.0) == (2, 3, 0)  # above the best absent score (0.7)
    assert encoder_probe.found_at(scores, labels, 1 / 7) == (3, 3, 1)  # one of seven absent may pass
    assert encoder_probe.found_at(scores, labels, 1.0) == (3, 3, 7)


def test_logistic_probe_separates_what_one_feature_tells():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 8, generator=g)
    y = (x[:, 3] > 0).float()
    w, b = encoder_probe.fit_logistic(x, y)
    assert int(w.abs().argmax()) == 3
    assert encoder_probe.auc((x @ w + b).tolist(), y.bool().tolist()) > 0.99


def test_presence_reads_the_event_labels():
    rows = [{"events": [{"label": "bell"}, {"label": "speech"}]}, {"events": []}]
    assert encoder_probe.presence(rows, ["bell", "chime"]).tolist() == [[1.0, 0.0], [0.0, 0.0]]
