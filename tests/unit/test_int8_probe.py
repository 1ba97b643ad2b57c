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


def test_per_group_int8_rounds_each_group_to_half_its_own_step():
    w = torch.randn(16, 96)
    w[:, :32] *= 100  # one loud group per row: per-channel scales would drown the others
    q, scale = int8_probe.per_group_int8(w, 32)
    assert q.shape == w.shape and scale.shape == (16, 3)
    error = (q.float() * scale.repeat_interleave(32, 1) - w).abs()
    assert bool((error <= scale.repeat_interleave(32, 1) / 2 + 1e-6).all())
    _, channel = int8_probe.per_channel_int8(w)
    assert bool((scale[:, 1:] < channel[:, None] / 20).all())  # the quiet groups get their own, finer steps


def test_the_dequantised_product_is_the_float_product_of_the_same_weights():
    w = torch.randn(300, 64)
    q, scale = int8_probe.per_group_int8(w, 32)
    exact = q.float() * scale.repeat_interleave(32, 1)
    x = torch.randn(3, 64)
    assert torch.allclose(int8_probe.dequantised_product(q, scale, x, rows=128), x @ exact.T, atol=1e-5)


def test_accuracy_reports_the_rounding_of_a_tiny_model():
    rows = int8_probe.accuracy("tiny:llama", min_weights=0, sensitivity=2,  # its layers are all small
                               mixes=((32, ("layers.1.",)),))
    measured = [r for r in rows if "max_abs_dp" in r]
    assert len(measured) == 7
    assert 0 < rows[0]["max_abs_dw"] < 0.01  # a random unembedding is not on an int8 grid: rounded, finely
    for row in measured:
        assert 0 < row["max_abs_dp"] < 0.5 and 0 <= row["top1_agreement"] <= 1
    by_name = {r["int8"]: r for r in measured}
    worst = next(r for r in rows if "worst" in r)["worst"]
    assert len(worst) == 2 and worst[0]["max_abs_dp"] >= worst[1]["max_abs_dp"] > 0
    # finer scales round less: per group of 32 costs less than per output channel on the same layers
    assert by_name["per group of 32 inputs: block linear layers"]["max_abs_dp"] < \
        by_name["per output channel: block linear layers"]["max_abs_dp"]


def test_kernel_rows_times_every_path_this_machine_has():
    from steer_ui.model.int8 import _kernel, kernel_available

    rows = int8_probe.kernel_rows(1, row_counts=(1, 7), shapes=((4096, 64),))
    assert [(r["shape"], r["rows"]) for r in rows] == [("4096x64", 1), ("4096x64", 7)]
    for r in rows:
        assert r["float32_ms"] > 0 and r["float32_gflops"] > 0
        if kernel_available():
            assert r["native_ms"] > 0
            assert ("avx2_ms" in r) == _kernel().wide  # the AVX2 path beside an AVX-512 native one
