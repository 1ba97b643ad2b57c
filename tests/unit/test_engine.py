"""The request batcher: concurrent requests decode together and each gets its solo result."""
import threading
import time

import pytest
import torch

from steer_ui.model.capture import capture
from steer_ui.model.engine import Engine, EngineBusy, EngineTimeout
from steer_ui.model.generation import GenerationError, Request, Sampling, side_by_side
from steer_ui.model.hooks import Steer, hook_count, steering


def _ids(side):
    return [t.token_id for t in side.tokens]


def _specs(handle, n=8):
    g = torch.Generator().manual_seed(1)
    vectors = [torch.randn(handle.arch.hidden_size, generator=g) for _ in range(2)]
    prompts = ["a", "The weather today", "Once upon a time there was", "Numbers: 1, 2, 3, 4, 5, 6, 7"]
    out = []
    for i in range(n):
        sampling = Sampling(max_new_tokens=6 + i % 3, temperature=0.0 if i % 2 else 0.9, seed=i, top_k=0 if i % 3 else 30)
        out.append((prompts[i % 4], [Steer(layer=1 + i % 2, vector=vectors[i % 2], alpha=float(i - 4))], sampling))
    return out


def _run_concurrently(engine, handle, specs):
    results = [None] * len(specs)
    start = threading.Barrier(len(specs))

    def client(i):
        start.wait()
        ticket = engine.submit(Request.make(handle, *specs[i]))
        for event in ticket:
            results[i] = event.result

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_eight_concurrent_requests_get_their_solo_results(tiny, family):
    handle = tiny(family)
    specs = _specs(handle)
    alone = [side_by_side(handle, *s) for s in specs]
    engine = Engine(handle, max_requests=8, gather_seconds=0.05)
    together = _run_concurrently(engine, handle, specs)
    for got, want in zip(together, alone):
        for side in ("unsteered", "steered"):
            a, b = getattr(got, side), getattr(want, side)
            assert _ids(a) == _ids(b)
            assert [t.logprob for t in a.tokens] == pytest.approx([t.logprob for t in b.tokens], abs=1e-4)
        assert got.unsteered.finished and got.steered.finished
    assert engine.stats.peak_requests > 1  # they really shared batches
    deadline = time.monotonic() + 5
    while engine.load["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hook_count(handle) == 0


def test_full_queue_says_busy_and_cancel_frees_the_place(tiny):
    handle = tiny("llama")
    engine = Engine(handle, max_requests=1, max_waiting=1, gather_seconds=0)
    long = Sampling(max_new_tokens=4000, stop_at_eos=False)
    running = engine.submit(Request.make(handle, "first", [], long))
    events = iter(running)
    next(events)  # it is decoding
    waiting = engine.submit(Request.make(handle, "second", [], long))
    with pytest.raises(EngineBusy, match="1 generations running and 1 waiting"):
        engine.submit(Request.make(handle, "third", [], long))
    running.cancel()
    waiting.cancel()
    assert len(list(events)) < 4000  # the stream ends once its rows are dropped, long before its length
    deadline = time.monotonic() + 10
    while (engine.load["running"] or engine.load["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.load == {"running": 0, "waiting": 0}
    short = engine.submit(Request.make(handle, "fourth", [], Sampling(max_new_tokens=3)))
    assert len(list(short)) == 3


def test_time_limit_stops_a_generation(tiny):
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0, timeout_seconds=0.3)
    ticket = engine.submit(Request.make(handle, "slow", [], Sampling(max_new_tokens=4000, stop_at_eos=False)))
    with pytest.raises(EngineTimeout):
        for _ in ticket:
            pass


def test_a_request_that_fails_at_prefill_fails_alone(tiny):
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0.2)

    def broken(context):
        raise GenerationError("this vector function is broken")

    bad = engine.submit(Request.make(handle, "bad", [Steer(layer=1, fn=broken, context_layer=0, alpha=1.0)]))
    good = engine.submit(Request.make(handle, "good", [], Sampling(max_new_tokens=4)))
    with pytest.raises(GenerationError, match="broken"):
        list(bad)
    assert _ids(list(good)[-1].result.unsteered) == _ids(side_by_side(handle, "good", [], Sampling(max_new_tokens=4)).unsteered)


def test_hooks_act_only_in_their_own_thread(tiny):
    """One thread's steering never reaches a forward pass another thread runs at the same moment."""
    handle = tiny("gemma3")
    ids = handle.tokenizer("plain text", return_tensors="pt").input_ids
    before = capture(handle, ids, [3])[3]
    inside, release = threading.Event(), threading.Event()

    def steer_and_hold():
        with steering(handle, [Steer(layer=1, vector=torch.ones(handle.arch.hidden_size) * 100, alpha=1.0)]):
            inside.set()
            release.wait(10)

    holder = threading.Thread(target=steer_and_hold)
    holder.start()
    assert inside.wait(10)
    assert hook_count(handle) == 1  # installed on the shared model...
    during = capture(handle, ids, [3])[3]  # ...yet silent in this thread
    release.set()
    holder.join()
    assert torch.equal(before, during)
    with steering(handle, [Steer(layer=1, vector=torch.ones(handle.arch.hidden_size) * 100, alpha=1.0)]):
        assert not torch.equal(before, capture(handle, ids, [3])[3])  # and active in its own


def test_concurrent_slider_moves_on_one_view_share_a_pass(tiny):
    from steer_ui.model.analysis import next_token
    from steer_ui.model.slider_batch import SliderBatcher

    handle = tiny("gemma3")
    g = torch.Generator().manual_seed(5)
    steers = [[Steer(layer=2, vector=torch.randn(handle.arch.hidden_size, generator=g), alpha=float(a))]
              for a in (-3, -1, 0.5, 2, 4, 8)]
    alone = [next_token(handle, "the same view", s, top_k=5) for s in steers]
    batcher = SliderBatcher(handle, gather_seconds=0.2)
    views = [None] * len(steers)
    barrier = threading.Barrier(len(steers))

    def move(i):
        barrier.wait()
        views[i] = batcher.next_token("the same view", steers[i], top_k=5)

    threads = [threading.Thread(target=move, args=(i,)) for i in range(len(steers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert batcher.largest > 1 and batcher.passes < len(steers)
    for got, want in zip(views, alone):
        assert got.kl == pytest.approx(want.kl, abs=1e-5)
        assert got.max_abs_delta_logit == pytest.approx(want.max_abs_delta_logit, abs=1e-4)
        assert list(got.steered["token_id"]) == list(want.steered["token_id"])
        assert list(got.steered["prob"]) == pytest.approx(list(want.steered["prob"]), abs=1e-5)
