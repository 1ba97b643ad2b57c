"""The request batcher: concurrent requests decode together and each gets its solo result."""
import math
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from steer_ui.model.capture import capture
from steer_ui.model.engine import Engine, EngineBusy, EngineTimeout
from steer_ui.model.generation import GenerationError, Request, Sampling, prefill_groups, side_by_side
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


def test_a_burst_prefills_each_prompt_length_in_its_own_pass_on_the_cpu(tiny):
    """On the CPU no prompt is padded (generation.prefill_groups): a padded row's numbers part from its solo run
    in the last bits.  Requests of one length share a pass; elsewhere a burst shares one pass.  Every request
    lands in exactly one group (the test above has the solo results of prompts of 1 to 15 tokens)."""
    handle = tiny("llama")
    short = [Request.make(handle, p, []) for p in ("Hi", "Yo")]
    long = [Request.make(handle, "word " * 40, []) for _ in range(2)]
    middle = Request.make(handle, "word " * 39, [])
    assert len(short[0].ids) == len(short[1].ids) and len(middle.ids) < len(long[0].ids)
    groups = prefill_groups(long + [middle] + short, "cpu")
    assert [[id(r) for r in g] for g in groups] == [[id(r) for r in short], [id(middle)], [id(r) for r in long]]
    assert all(len({len(r.ids) for r in g}) == 1 for g in groups)
    same = [Request.make(handle, "word " * 10, []) for _ in range(4)]
    assert prefill_groups(same, "cpu") == [same]
    assert [len(g) for g in prefill_groups(short + long, "cuda")] == [4]
    assert prefill_groups([], "cpu") == []


def test_full_queue_says_busy_and_cancel_frees_the_place(tiny):
    handle = tiny("llama")
    # an interactive pass held open slows the decode to one step per pause: the requests stay running
    engine = Engine(handle, max_requests=1, max_waiting=1, gather_seconds=0, pause_seconds=0.2)
    long = Sampling(max_new_tokens=240, stop_at_eos=False)
    with engine.interactive():
        running = engine.submit(Request.make(handle, "first", [], long))
        events = iter(running)
        next(events)  # it is decoding
        waiting = engine.submit(Request.make(handle, "second", [], long))
        with pytest.raises(EngineBusy, match="1 generations running and 1 waiting"):
            engine.submit(Request.make(handle, "third", [], long))
        running.cancel()
        waiting.cancel()
    assert len(list(events)) < 240  # the stream ends once its rows are dropped, long before its length
    deadline = time.monotonic() + 10
    while (engine.load["running"] or engine.load["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (engine.load["running"], engine.load["waiting"]) == (0, 0)
    short = engine.submit(Request.make(handle, "fourth", [], Sampling(max_new_tokens=3)))
    assert len(list(short)) == 3


def test_time_limit_stops_a_generation(tiny):
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0, timeout_seconds=0.3, pause_seconds=0.05)
    with engine.interactive():  # 240 steps at one per 0.05 s: far past the limit
        ticket = engine.submit(Request.make(handle, "slow", [], Sampling(max_new_tokens=240, stop_at_eos=False)))
        with pytest.raises(EngineTimeout):
            for _ in ticket:
                pass


def test_a_request_longer_than_the_models_positions_is_refused_before_it_runs(tiny):
    handle = tiny("gpt2")  # learned positions: 256
    with pytest.raises(GenerationError, match="256 positions"):
        Request.make(handle, "x" * 200, [], Sampling(max_new_tokens=100))


def test_an_overflowing_push_is_refused_before_it_reaches_the_batch(tiny):
    handle = tiny("llama")
    huge = Steer(layer=1, vector=torch.full((handle.arch.hidden_size,), 1e33), alpha=1e6)
    with pytest.raises(GenerationError, match="overflows"):
        Request.make(handle, "hi", [huge])


def test_the_engine_survives_a_failure_inside_a_step_and_serves_the_next_request(tiny, monkeypatch):
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0)
    from steer_ui.model import generation

    real = generation.DecodeBatch.sample
    calls = {"n": 0}

    def failing_once(self):
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError("simulated: out of memory in the middle of a step")
        return real(self)

    monkeypatch.setattr(generation.DecodeBatch, "sample", failing_once)
    victim = engine.submit(Request.make(handle, "first", [], Sampling(max_new_tokens=5)))
    with pytest.raises(MemoryError):
        list(victim)
    after = engine.submit(Request.make(handle, "second", [], Sampling(max_new_tokens=4)))
    assert len(list(after)) == 4  # the thread lived on with a fresh batch
    assert (engine.load["running"], engine.load["waiting"]) == (0, 0)


def test_an_input_dependent_vector_that_overflows_fails_alone_not_its_batch(tiny):
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0.2)
    hidden = handle.arch.hidden_size

    def overflowing(context):  # finite weights, infinite output on every row it sees (others' rows too)
        return context[:, :1].expand(-1, hidden) * 1e38 * 1e38

    bad = engine.submit(Request.make(handle, "bad", [Steer(layer=1, fn=overflowing, context_layer=0, alpha=1.0,
                                                          positions="prompt")]))
    good = engine.submit(Request.make(handle, "good", [], Sampling(max_new_tokens=4)))
    with pytest.raises(Exception, match="NaN or inf"):
        list(bad)
    result = list(good)[-1].result
    assert all(math.isfinite(t.logprob) for t in result.unsteered.tokens)
    assert _ids(result.unsteered) == _ids(side_by_side(handle, "good", [], Sampling(max_new_tokens=4)).unsteered)


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
    assert hook_count(handle) == 2  # installed on the shared model (the steer, and the reader of special tokens)...
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


def test_an_overflowing_slider_move_fails_alone_in_its_group(tiny):
    from steer_ui.model.hooks import SteeringError
    from steer_ui.model.slider_batch import SliderBatcher

    handle = tiny("llama")
    batcher = SliderBatcher(handle, gather_seconds=0.2)
    honest = [Steer(layer=1, vector=torch.ones(handle.arch.hidden_size), alpha=2.0)]
    attack = [Steer(layer=1, vector=torch.full((handle.arch.hidden_size,), 1e33), alpha=1e6)]
    got = {}

    def move(name, steers):
        try:
            got[name] = batcher.next_token("the same view", steers).kl
        except SteeringError as exc:
            got[name] = exc

    threads = [threading.Thread(target=move, args=a) for a in (("honest", honest), ("attack", attack))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(got["attack"], SteeringError)
    assert got["honest"] == pytest.approx(batcher.next_token("the same view", honest).kl, abs=1e-6)


def test_the_decode_gives_way_to_a_slider_move_within_a_step(tiny):
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0, pause_seconds=5.0)
    ticket = engine.submit(Request.make(handle, "busy", [], Sampling(max_new_tokens=240, stop_at_eos=False)))
    events = iter(ticket)
    next(events)
    with engine.interactive():
        time.sleep(0.05)  # the step under way reaches its next block and waits there
        before = engine.stats.steps
        time.sleep(0.5)
        assert engine.stats.steps == before  # no step completes while a move is in flight
    deadline = time.monotonic() + 10  # and decoding resumes (polled: on a loaded machine a step can take 0.3 s)
    while engine.stats.steps == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats.steps > before
    ticket.cancel()


def test_slider_moves_and_decode_blocks_take_turns_and_the_decode_still_progresses(tiny):
    # Back-to-back moves (no pause between them, the hardest case): no decoder block of the
    # engine starts while a move is in flight, and the decode is not starved.
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0, pause_seconds=30.0, turn_seconds=0.002)
    in_move = threading.Event()
    overlaps, blocks = [], []

    in_block = threading.Event()

    # plain hooks see every thread's passes, other engines' too: an engine an earlier test left finishing its step
    # on this shared model ran a block during a move here once (CI at 6e5c17f), so only this engine's thread counts
    def enter(_module, _args):
        if threading.current_thread() is engine._thread:
            in_block.set()
            blocks.append(1)
            if in_move.is_set():
                overlaps.append("a block started during a move")

    def leave(_module, _args, _out):
        if threading.current_thread() is engine._thread:
            in_block.clear()

    # a block's computing starts at its first norm, after its pre-hooks (where the engine gives way)
    removers = [block.input_layernorm.register_forward_pre_hook(enter) for block in handle.arch.layers]
    removers += [block.register_forward_hook(leave) for block in handle.arch.layers]
    ticket = engine.submit(Request.make(handle, "busy", [], Sampling(max_new_tokens=240, stop_at_eos=False)))
    try:
        events = iter(ticket)
        next(events)
        ids = handle.tokenizer("a slider move", return_tensors="pt").input_ids
        steps_before = engine.stats.steps
        moves = 0
        while moves < 200 and not ticket.request.done:
            with engine.interactive():
                if in_block.is_set():
                    overlaps.append("a move started during a block")
                in_move.set()
                with torch.inference_mode():
                    handle.model(ids)
                in_move.clear()
            moves += 1
        steps_during = engine.stats.steps - steps_before
    finally:
        engine.close(wait=10, cancel=True)
        for r in removers:
            r.remove()
    assert moves > 10 and blocks
    assert overlaps == []  # a move never shared the machine with a decoder block
    assert steps_during >= 2  # the decode kept its turns between the moves


def test_a_burst_still_arriving_shares_one_prefill(tiny):
    """Requests arriving 8 ms apart at an idle engine (each gap under its 20 ms gather, the whole burst under four
    gathers) are admitted in one pass, not as many as arrived within each first wait."""
    handle = tiny("llama")
    engine = Engine(handle, max_requests=8, gather_seconds=0.02)
    tickets = []
    for _ in range(5):  # one prompt: the CPU's prefill groups do not split it by length
        tickets.append(engine.submit(Request.make(handle, "same prompt", [], Sampling(max_new_tokens=2))))
        time.sleep(0.008)
    for t in tickets:
        assert len(list(t)) == 2
    assert engine.stats.prefills == 1 and engine.stats.admitted == 5
    engine.close(wait=10)


def test_a_burst_that_never_stops_arriving_is_not_held_past_four_gathers(tiny):
    handle = tiny("llama")
    engine = Engine(handle, max_requests=32, gather_seconds=0.02)
    tickets = []
    for _ in range(20):  # a request every 10 ms for 200 ms, more than four gathers (80 ms)
        tickets.append(engine.submit(Request.make(handle, "same prompt", [], Sampling(max_new_tokens=2))))
        time.sleep(0.01)
    for t in tickets:
        assert len(list(t)) == 2
    assert engine.stats.prefills >= 2  # the first admission did not wait for the whole stream
    engine.close(wait=10)


def test_close_with_cancel_ends_the_thread_while_a_generation_runs(tiny):
    handle = tiny("llama")
    engine = Engine(handle, gather_seconds=0)
    ticket = engine.submit(Request.make(handle, "busy", [], Sampling(max_new_tokens=240, stop_at_eos=False)))
    next(iter(ticket))
    thread = engine._thread
    engine.close(wait=10, cancel=True)
    assert not thread.is_alive()
    assert ticket.request.cancelled and not ticket.request.done
    with pytest.raises(EngineBusy):
        engine.submit(Request.make(handle, "after", [], Sampling(max_new_tokens=2)))


_EXIT_MID_GENERATION = textwrap.dedent("""
    from steer_ui.model.engine import Engine
    from steer_ui.model.generation import Request, Sampling
    from steer_ui.tiny import tiny_handle

    handle = tiny_handle("llama")
    engine = Engine(handle, gather_seconds=0)
    ticket = engine.submit(Request.make(handle, "busy", [], Sampling(max_new_tokens=240, stop_at_eos=False)))
    next(iter(ticket))
    print("decoding", flush=True)
""")


def test_a_process_that_exits_while_its_engine_decodes_exits_cleanly():
    # Without the engines' exit hook 2 of 6 such exits aborted in finalization ("terminate called without an
    # active exception", status 134): three runs make a return of that bug likely to show
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", _EXIT_MID_GENERATION], capture_output=True, text=True, timeout=120)
        assert "decoding" in done.stdout, done.stderr[-2000:]
        assert done.returncode == 0 and "terminate" not in done.stderr, done.stderr[-2000:]
