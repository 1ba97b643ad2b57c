"""tools/vnni_peak.py and pass_ab --sweep-parts: the ceiling docs/bench.md sets the batched ratios against."""
from pathlib import Path

import pytest

from steer_ui.model.int8 import _w8a16_kernel
from steer_ui.tiny import tiny_handle
from steer_ui.tools import pass_ab, vnni_peak


def _has_vnni() -> bool:
    cpu = Path("/proc/cpuinfo")
    return cpu.is_file() and "avx512_vnni" in cpu.read_text(errors="replace")


def test_the_instruction_rate_is_measured_where_the_cpu_has_vnni_and_refused_elsewhere():
    rate = vnni_peak.products_per_second(1, 1, loops=200_000)
    if rate is None:
        pytest.skip("no C compiler here")
    if _has_vnni():
        assert 1e8 < rate < 1e11  # a real core: billions a second, not a folded loop's trillions
    else:
        assert rate == -1.0


def test_the_packed_product_is_timed_on_each_shape_and_row_count():
    fn = _w8a16_kernel()
    if fn is None or fn.packed is None:
        pytest.skip("no packed int16 path on this machine")
    rates = vnni_peak.packed_rates(1, rows=(1, 3), shapes=((256, 640, 32, False), (640, 2048, 16, False)))
    assert [(r["shape"], r["rows"]) for r in rates] == [("256 x 640", 1), ("256 x 640", 3), ("640 x 2048", 1),
                                                         ("640 x 2048", 3)]
    assert all(r["ms"] > 0 and r["g_macs_per_s"] > 0 for r in rates)


def test_the_sweep_s_parts_add_up_and_the_timers_are_taken_off_again():
    handle = tiny_handle("gemma3", layers=6, int8=True)
    final_last = pass_ab.fused_pass.final_last
    out = pass_ab.sweep_parts(handle, 2, reps=2)
    assert "logits" not in vars(handle.arch) and pass_ab.fused_pass.final_last is final_last
    for side in ("separate", "batched"):
        assert len(out[side]) == 2
        for turn in out[side]:
            assert turn["blocks_ms"] > 0 and turn["unembedding_ms"] > 0 and turn["rest_ms"] >= 0  # the pass ran
            assert turn["blocks_ms"] + turn["unembedding_ms"] + turn["rest_ms"] == pytest.approx(turn["total_ms"],
                                                                                                  abs=0.01)
    assert len(out["sweep_speedup_per_turn"]) == 2
