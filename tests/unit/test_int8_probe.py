"""The int8 groundwork tool (issue #37): its rounding is the stated per-channel int8, and its accuracy report
measures against the model's own float32 numbers."""
from __future__ import annotations

import torch

from steer_ui.tools import int8_probe


def test_per_channel_int8_rounds_each_row_to_half_its_own_step():
    w = torch.randn(64, 48) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different sizes
    q, scale = int8_probe.per_channel_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    error = (q.float() * scale[:, None] - w).abs()
    assert bool((error <= scale[:, None] / 2 + 1e-7).all())
    assert bool((q.abs().amax(1) == 127).all())  # every row uses its whole range


def test_accuracy_reports_the_rounding_of_a_tiny_model():
    rows = int8_probe.accuracy("tiny:llama", min_weights=0)  # its layers are all small
    assert [r["int8"] for r in rows] == ["block linear layers", "block linear layers and the unembedding"]
    for row in rows:
        assert 0 < row["max_abs_dp"] < 0.5 and 0 <= row["top1_agreement"] <= 1
