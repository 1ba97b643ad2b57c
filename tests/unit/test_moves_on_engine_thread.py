"""Slider moves run by the decode engine's own thread (``Engine.run_move``) while it decodes on the fused CPU step.

A move made in its own thread beside a decoding engine makes a second OpenMP team, and two teams on the CPUs put
both in libgomp's throttled wait; so while the fused step runs, the engine thread takes the move at its next pause
point.  The move must get what it would get alone, in a fresh thread's autograd state; the decode must give the
tokens it gives without moves, bit for bit; a move's error is its caller's alone; concurrent moves still share a
pass; and the engine idle, a move runs in its caller's thread.
"""
import threading
import time

import pytest
import torch

from steer_ui.model.analysis import next_token
from steer_ui.model.engine import Engine
from steer_ui.model.generation import Request, Sampling
from steer_ui.model.hooks import Steer
from steer_ui.model.int8 import kernel_available
from steer_ui.model.slider_batch import SliderBatcher
from steer_ui.tiny import tiny_handle

pytestmark = pytest.mark.skipif(not kernel_available(), reason="no C compiler: the fused step is not built")

PROMPT = "a slider on this view"


@pytest.fixture(scope="module")
def gemma3():
    """A tiny Gemma 3 with int8 weights: the engine decodes it on the fused step."""
    return tiny_handle("gemma3", layers=4, int8=True)


def _steer(handle, alpha: float, seed: int = 3) -> list[Steer]:
    g = torch.Generator().manual_seed(seed)
    return [Steer(layer=2, vector=torch.randn(handle.arch.hidden_size, generator=g), alpha=alpha)]


def _long(handle, tokens: int = 200) -> Request:
    return Request.make(handle, "the decode that runs", _steer(handle, 2.0, seed=9),
                        Sampling(max_new_tokens=tokens, stop_at_eos=False, temperature=0.8, seed=4))


def _decoding(engine, handle, tokens: int = 200):
    """A ticket whose generation has started (its first event is in), on the fused step."""
    ticket = engine.submit(_long(handle, tokens))
    events = iter(ticket)
    next(events)
    assert engine.load["decode"]["path"] == "fused"
    return ticket, events


def _same_view(got, want):
    assert got.kl == want.kl and got.max_abs_delta_logit == want.max_abs_delta_logit
    assert list(got.steered["token_id"]) == list(want.steered["token_id"])
    assert list(got.steered["prob"]) == list(want.steered["prob"])


def test_a_move_made_while_the_fused_decode_runs_is_computed_by_the_engine_thread_as_in_a_fresh_one(gemma3):
    want = next_token(gemma3, PROMPT, _steer(gemma3, 1.5), top_k=5)
    engine = Engine(gemma3, gather_seconds=0)
    seen = {}

    def move():
        seen["thread"] = threading.current_thread()
        seen["modes"] = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        seen["nested"] = engine.run_move(threading.current_thread)  # a move that makes one: no deadlock
        return next_token(gemma3, PROMPT, _steer(gemma3, 1.5), top_k=5)

    try:
        ticket, _ = _decoding(engine, gemma3)
        got = engine.run_move(move)
        assert seen["thread"] is engine._thread and seen["nested"] is engine._thread
        assert seen["modes"] == (False, True)  # the decode's inference mode does not leak into the move
        _same_view(got, want)
        ticket.cancel()
    finally:
        engine.close(wait=10, cancel=True)


def test_a_move_made_while_the_engine_is_idle_runs_in_the_callers_thread(gemma3):
    engine = Engine(gemma3, gather_seconds=0)
    try:
        assert engine.run_move(threading.current_thread) is threading.current_thread()
    finally:
        engine.close(wait=10)


def test_moves_back_to_back_leave_the_generation_as_it_is_alone_and_let_it_progress(gemma3):
    engine = Engine(gemma3, gather_seconds=0, turn_seconds=0.002)
    try:
        alone = [e.result for e in engine.submit(_long(gemma3, 24))][-1]
        ticket = engine.submit(_long(gemma3, 24))
        events = iter(ticket)
        together = next(events).result
        decoding, steps, moves, threads = engine._thread, engine.stats.steps, 0, set()

        def move(alpha):
            threads.add(threading.current_thread())
            return next_token(gemma3, PROMPT, _steer(gemma3, alpha), top_k=5)

        while not ticket.request.done and moves < 400:
            engine.run_move(lambda: move(0.1 * (moves % 7)))
            moves += 1
        steps_during = engine.stats.steps - steps
        for event in events:
            together = event.result
    finally:
        engine.close(wait=10, cancel=True)
    assert decoding in threads  # the moves ran on the engine's thread
    assert moves > 5 and steps_during >= 2  # the decode kept its turns between the moves
    for side in ("unsteered", "steered"):
        a, b = getattr(together, side).tokens, getattr(alone, side).tokens
        assert [(t.token_id, t.logprob, t.alternatives) for t in a] == \
               [(t.token_id, t.logprob, t.alternatives) for t in b]


def test_a_moves_error_reaches_its_caller_alone_and_the_decode_goes_on(gemma3):
    engine = Engine(gemma3, gather_seconds=0)

    def broken():
        raise ValueError("this move's own mistake")

    try:
        ticket, events = _decoding(engine, gemma3, tokens=12)
        with pytest.raises(ValueError, match="own mistake"):
            engine.run_move(broken)
        last = [e.result for e in events][-1]  # the generation still ends normally
        assert len(last.steered.tokens) == 12
        assert engine.run_move(lambda: 7) == 7
    finally:
        engine.close(wait=10, cancel=True)


def test_concurrent_moves_handed_to_the_engine_still_share_one_pass(gemma3):
    steers = [_steer(gemma3, a, seed=5) for a in (-3, -1, 0.5, 2, 4, 8)]
    alone = [next_token(gemma3, "the same view", s, top_k=5) for s in steers]
    engine = Engine(gemma3, gather_seconds=0)
    batcher = SliderBatcher(gemma3, gather_seconds=0.2)
    views = [None] * len(steers)
    barrier = threading.Barrier(len(steers))

    def move(i):
        barrier.wait()
        views[i] = batcher.next_token("the same view", steers[i], top_k=5, run=engine.run_move)

    try:
        ticket, _ = _decoding(engine, gemma3)
        threads = [threading.Thread(target=move, args=(i,)) for i in range(len(steers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ticket.cancel()
    finally:
        engine.close(wait=10, cancel=True)
    assert batcher.largest > 1 and batcher.passes < len(steers)
    for got, want in zip(views, alone):
        assert got.kl == pytest.approx(want.kl, abs=1e-5)
        assert list(got.steered["token_id"]) == list(want.steered["token_id"])
        assert list(got.steered["prob"]) == pytest.approx(list(want.steered["prob"]), abs=1e-5)

