"""Issue #46, finding 2: a comparison is planned before any model work (its share of the working memory, its time
at the engine's measured speed), waits saying what for, and one that runs past its limit returns what finished."""
from __future__ import annotations

import threading
import time

import pytest

from steer_ui import steerability
from steer_ui.admission import comparison_work, long_job_bytes, plan_comparison
from steer_ui.guards import Guard
from steer_ui.messages import UserError
from steer_ui.model.budget import kv_bytes
from steer_ui.model.engine import Engine, EngineStats
from steer_ui.model.generation import Request, Sampling
from steer_ui.policy import Policy
from steer_ui.service import RANDOM, Service

MB = 1 << 20


def _measured(prefill: float, decode: float) -> EngineStats:
    stats = EngineStats()
    stats.observe_prefill(prefill * 300, 300)
    stats.observe_step(decode * 6, 6)
    return stats


def test_the_measured_speed_is_a_median_that_one_slow_first_pass_does_not_move():
    stats = EngineStats()
    stats.observe_prefill(30.0, 300)  # a first pass that paid for a compiler and a cold cache
    stats.observe_prefill(0.9, 30)  # a short prompt: its pass's fixed cost, not a per-token rate
    for _ in range(4):
        stats.observe_prefill(0.3, 300)
    stats.observe_step(5.0, 3)
    for _ in range(4):
        stats.observe_step(0.03, 3)
    assert stats.prefill_seconds_per_token_row == pytest.approx(0.001)
    assert stats.decode_seconds_per_row == pytest.approx(0.01)
    assert EngineStats().estimate_seconds(10, 10) is None  # nothing measured: no estimate


def test_a_comparison_runs_as_many_prompts_at_once_as_its_memory_share_holds(tiny):
    handle = tiny("llama")
    per_prompt = kv_bytes(handle, 10 + 8, 3)
    policy = Policy(max_inflight_bytes=per_prompt * 6, long_job_share=0.5)  # the share holds 3 prompts
    plan = plan_comparison(handle, EngineStats(), policy, [10, 4, 7, 9, 5], 8, reading_rows=2)
    assert plan.in_flight == 3 and plan.reserve_bytes == 3 * per_prompt <= long_job_bytes(policy)
    assert plan.estimate_seconds is None  # nothing measured yet: the deadline alone applies
    with pytest.raises(UserError) as info:  # not one prompt fits in the share: what to shrink, in one line
        plan_comparison(handle, EngineStats(), Policy(max_inflight_bytes=per_prompt, long_job_share=0.5), [10], 8, 2)
    assert info.value.key == "compare_too_large" and "Shorten the prompts" in str(info.value)


def test_a_comparison_that_cannot_finish_in_time_at_the_measured_speed_is_refused_with_what_fits(tiny):
    handle = tiny("llama")
    stats = _measured(prefill=0.001, decode=0.01)
    counts, new = [20] * 10, 50
    token_rows, decode_rows = comparison_work(counts, new, reading_rows=2)
    assert (token_rows, decode_rows) == (10 * (3 * 20 + 2 * 70), 10 * 3 * 50)
    estimate = token_rows * 0.001 + decode_rows * 0.01  # 2 + 15 s
    assert stats.estimate_seconds(token_rows, decode_rows) == pytest.approx(estimate)
    with pytest.raises(UserError) as info:
        plan_comparison(handle, stats, Policy(compare_seconds=10), counts, new, 2)
    assert info.value.key == "compare_too_slow"
    assert info.value.params["estimate"] == 17 and info.value.params["fit"] == 5  # 1.7 s a prompt
    assert "at most 5 prompts" in str(info.value)
    assert plan_comparison(handle, stats, Policy(compare_seconds=20), counts, new, 2).estimate_seconds == \
        pytest.approx(estimate)


def test_long_jobs_hold_at_most_their_share_so_short_requests_always_find_room():
    guard = Guard(Policy(max_inflight_bytes=100 * MB, long_job_share=0.5, inflight_wait_seconds=0.3))
    told = []
    with guard.reserve(40 * MB, long=True):
        with pytest.raises(UserError) as info:  # a second long job would pass the share: it waits, then is busy
            with guard.reserve(40 * MB, long=True, waiting=told.append):
                pass
        assert info.value.key == "memory_busy"
        assert [w.key for w in told] == ["waiting_for_memory"]
        assert told[0].params == {"used": 40, "total": 100, "long": 40}
        with guard.reserve(60 * MB):  # a slider move's worth finds the rest at once
            pass
    with guard.reserve(40 * MB, long=True):  # the first one's share is free again
        pass


def test_a_waiting_long_job_starts_when_the_share_frees():
    guard = Guard(Policy(max_inflight_bytes=100 * MB, long_job_share=0.5, inflight_wait_seconds=10))
    held, started = threading.Event(), []

    def first():
        with guard.reserve(50 * MB, long=True):
            held.set()
            time.sleep(0.3)

    thread = threading.Thread(target=first)
    thread.start()
    held.wait()
    with guard.reserve(50 * MB, long=True, waiting=lambda w: started.append(("waited", w.key))):
        started.append("ran")
    thread.join()
    assert started == [("waited", "waiting_for_memory"), "ran"]


def test_a_comparison_past_its_time_limit_returns_the_prompts_that_finished(tiny):
    """Two prompts at once: one of 2 new tokens, one of 240; the limit is 40 steps' time, so the short one finishes
    and the long one is stopped, its place None (the engine's step time is measured first, with a margin of 5x
    on either side for a machine whose speed swings)."""
    handle = tiny("llama")
    engine = Engine(handle, max_requests=4)
    try:
        warm = steerability.requests_for(handle, ["warm up"], [], Sampling(max_new_tokens=40, stop_at_eos=False))
        start = time.monotonic()
        steerability.generate_all(engine, warm, 1, ["warm up"])
        step = (time.monotonic() - start) / 40
        short = Request.make(handle, "a short one", [], Sampling(max_new_tokens=2, stop_at_eos=False))
        long = Request.make(handle, "a long one", [], Sampling(max_new_tokens=240, stop_at_eos=False))
        out = steerability.generate_all(engine, [short, long], 2, ["a short one", "a long one"], seconds=40 * step)
        assert out[0] is not None and len(out[0].steered_ids) == 2
        assert out[1] is None
    finally:
        engine.close(wait=10)


def test_the_service_says_when_no_prompt_finished_in_time_and_measures_the_engine(tiny):
    service = Service(tiny("llama"), policy=Policy(compare_seconds=0.0))
    with pytest.raises(UserError) as info:
        service.compare("cmp-tttttttt", "one prompt\nanother", vector_name=RANDOM, layer=1, alpha=0.5,
                        sampling=service.sampling(max_new_tokens=4))
    assert info.value.key == "compare_timeout"
    ok = Service(tiny("llama"))
    out = ok.compare("cmp-uuuuuuuu", "one prompt\nanother", vector_name=RANDOM, layer=1, alpha=0.5,
                     sampling=ok.sampling(max_new_tokens=4))
    assert "stopped" not in out["summary"] and len(out["rows"]) == 2
    stats = ok.engine().stats  # what the next comparison's estimate is made from (its first one measured prefill)
    assert stats.prefill_seconds_per_token_row > 0 and stats.decode_seconds_per_row > 0
