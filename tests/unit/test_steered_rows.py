"""A request that needs fewer rows decodes fewer (issue #49): the API's steered-only answer spends one row, its
Δlogit one more, and each gets exactly the steered side of the page's three-row request."""
import dataclasses
import itertools

import pytest
import torch

from steer_ui.model.engine import Engine
from steer_ui.model.generation import DecodeBatch, Request, Sampling, every_row_decoded, side_by_side
from steer_ui.model.hooks import Steer, hook_count

TOL = 1e-5


def _specs(handle):
    g = torch.Generator().manual_seed(7)
    v1, v2 = torch.randn(handle.arch.hidden_size, generator=g), torch.randn(handle.arch.hidden_size, generator=g)
    return [
        ("Hello there, how are", [Steer(layer=1, vector=v1, alpha=6.0)], Sampling(max_new_tokens=9)),
        ("x y", [Steer(layer=2, vector=v2, alpha=-8.0, positions="generated")],
         Sampling(max_new_tokens=7, temperature=1.0, top_k=20, seed=3, repetition_penalty=1.3)),
        ("abc def", [Steer(layer=0, vector=v1, alpha=3.0, positions="prompt"),
                     Steer(layer=handle.arch.num_layers - 1, vector=v2, alpha=5.0)],
         Sampling(max_new_tokens=8, alternatives=3, temperature=0.8, top_p=0.9, seed=11)),
    ]


def _fewer(sampling, unsteered, counterfactual):
    return dataclasses.replace(sampling, unsteered=unsteered, counterfactual=counterfactual)


def _same_steered(mine, full, delta: bool):
    a, b = mine.steered, full.steered
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
    assert a.text == b.text and a.finished == b.finished
    for x, y in zip(a.tokens, b.tokens):
        assert x.logprob == pytest.approx(y.logprob, abs=TOL)
        assert [p for _, p in x.alternatives] == pytest.approx([p for _, p in y.alternatives], abs=TOL)
        if delta:
            assert x.delta_logit == pytest.approx(y.delta_logit, abs=TOL)
            assert x.direct_delta_logit == pytest.approx(y.direct_delta_logit, abs=TOL)
        else:
            assert x.delta_logit is None and x.direct_delta_logit is None


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_fewer_rows_give_the_steered_side_of_the_full_request(tiny, family):
    """Alone and beside full requests in one batch: steered-only and steered + counterfactual requests get the
    full request's steered tokens, log-probabilities and (with the counterfactual row) Δlogits."""
    handle = tiny(family)
    specs = _specs(handle)
    full = [side_by_side(handle, p, s, sm) for p, s, sm in specs]
    for unsteered, counterfactual in [(False, False), (False, True), (True, False)]:
        for (p, s, sm), solo in zip(specs, full):
            mine = side_by_side(handle, p, s, _fewer(sm, unsteered, counterfactual))
            _same_steered(mine, solo, counterfactual)
            if unsteered:
                assert [t.token_id for t in mine.unsteered.tokens] == [t.token_id for t in solo.unsteered.tokens]
            else:
                assert mine.unsteered.tokens == [] and mine.unsteered.text == ""
    # one batch mixing every shape, joined at different steps: each still gets its own
    batch = DecodeBatch(handle)
    shapes = list(itertools.product([False, True], [False, True]))
    requests = [(Request.make(handle, p, s, _fewer(sm, u, c)), solo, u, c)
                for ((p, s, sm), solo), (u, c) in zip(itertools.cycle(zip(specs, full)), shapes * 2)]
    batch.admit([r for r, *_ in requests[:4]])
    assert batch.rows == sum(len(r.kinds) for r, *_ in requests[:4]) == 1 + 2 + 2 + 3
    for step in range(40):
        if step == 2:
            batch.admit([r for r, *_ in requests[4:]])
        if not len(batch):
            break
        batch.sample()
        batch.advance()
    for r, solo, u, c in requests:
        assert r.done
        _same_steered(r.result, solo, c)
    assert hook_count(handle) == 0


def test_a_delta_limit_or_a_measure_keeps_the_rows_it_reads(tiny):
    handle = tiny("llama")
    steers = _specs(handle)[0][1]
    assert Request.make(handle, "hi", steers, Sampling(unsteered=False, counterfactual=False)).kinds == (1,)
    limited = Request.make(handle, "hi", steers, Sampling(unsteered=False, counterfactual=False, max_delta_logit=1.0))
    assert limited.kinds == (1, 2)
    measured = Request.make(handle, "hi", steers, Sampling(unsteered=False, counterfactual=False, measure=True))
    assert measured.kinds == (0, 1, 2)


def _same_tokens(a, b) -> None:
    """Two sides alike: tokens, text and end; every number a token carries within float noise."""
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
    assert a.text == b.text and a.finished == b.finished
    for x, y in zip(a.tokens, b.tokens):
        assert x.logprob == pytest.approx(y.logprob, abs=TOL)
        assert [p for _, p in x.alternatives] == pytest.approx([p for _, p in y.alternatives], abs=TOL)
        for name in ("delta_logit", "direct_delta_logit", "max_delta_logit", "kept", "unsteered_logprob"):
            mine, theirs = getattr(x, name), getattr(y, name)
            assert (mine is None) == (theirs is None), name
            assert mine is None or mine == pytest.approx(theirs, abs=1e-4), name


def _every_row_decoded(request: Request) -> Request:
    """``request`` decoding all the rows its sampling asks for, as before mirrored requests (its steers at α 0
    still added, as zeros)."""
    zero = torch.zeros(())
    return dataclasses.replace(request, kinds=request.asked, mirrored=False, result=dataclasses.replace(
        request.result, unsteered=type(request.result.unsteered)(), steered=type(request.result.steered)()),
        row_steers=[s.with_alpha(torch.stack([zero, s.scalar_alpha.float(), zero])) for s in request.steers])


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_request_that_adds_nothing_decodes_one_row_and_gets_the_three_rows_numbers(tiny, family):
    """No steer, or every α 0: the unsteered side and the counterfactual row would be the steered row bit for bit,
    so one row decodes and the rest is filled from it: both sides, Δlogit 0, a limit that holds nothing, a measure's
    unsteered log-probability and first-token KL.  Beside a steered request, as the many-users batch has it."""
    handle = tiny(family)
    steered = _specs(handle)[1]
    zero_alpha = [s.with_alpha(0.0) for s in steered[1]]
    cases = [("Hello there, how are", [], Sampling(max_new_tokens=9)),
             ("x y", zero_alpha, dataclasses.replace(steered[2], max_delta_logit=2.0, measure=True)),
             ("abc def", [], Sampling(max_new_tokens=6, unsteered=False))]
    for prompt, steers, sampling in cases:
        mirrored = Request.make(handle, prompt, steers, sampling)
        assert mirrored.mirrored and mirrored.kinds == (1,)
        with every_row_decoded():  # as before mirrored requests: its steers at α 0 still added, as zeros
            full = Request.make(handle, prompt, steers, sampling)
        assert not full.mirrored and len(full.kinds) == len(mirrored.asked) > 1
        runs = []
        for request in (mirrored, full):
            batch, events = DecodeBatch(handle), []
            beside = Request.make(handle, *steered)
            batch.admit([beside, request])
            while not request.done:
                events += [e for r, e in batch.sample() if r is request]
                batch.advance()
            runs.append((request.result, events))
        (a, a_events), (b, b_events) = runs
        for side in ("unsteered", "steered"):  # rows computed in another batch: the same numbers to float noise
            _same_tokens(getattr(a, side), getattr(b, side))
        assert a.first_kl == pytest.approx(b.first_kl, abs=TOL) if b.first_kl is not None else a.first_kl is None
        assert len(a_events) == len(b_events)
        for x, y in zip(a_events, b_events):
            assert (x.unsteered is None) == (y.unsteered is None)
            assert x.steered.token_id == y.steered.token_id
        if sampling.unsteered:
            assert a.unsteered.tokens and a.unsteered.text == a.steered.text
        else:
            assert not a.unsteered.tokens
        assert all(t.delta_logit == 0.0 and t.direct_delta_logit == 0.0 for t in a.steered.tokens)
    assert a_events and all(e.unsteered is None for e in a_events)


def test_the_engine_reports_one_row_for_a_steered_only_request_and_drops_a_cancelled_ones(tiny):
    handle = tiny("llama")
    specs = _specs(handle)
    (p, s, sm) = specs[0]
    long = dataclasses.replace(sm, max_new_tokens=40, stop_at_eos=False)
    engine = Engine(handle, gather_seconds=0.2)
    try:
        full = engine.submit(Request.make(handle, p, s, long))
        alone = engine.submit(Request.make(handle, p, s, _fewer(long, False, False)))
        mine, theirs = alone.newest(), iter(full)
        for _ in range(3):  # the stats follow each step; by the third event both have run a step together
            next(mine), next(theirs)
        assert engine.load["running"] == 2 and engine.load["rows"] == 3 + 1
        full.cancel()
        seen = []  # the cancelled request's rows leave at the next step: within a couple of events
        for _ in range(4):
            next(mine)
            seen.append(engine.load["rows"])
        assert seen[-1] == 1 and engine.load["running"] == 1, seen
        last = None
        for last in mine:
            pass
        solo = side_by_side(handle, p, s, long)
        _same_steered(last.result, solo, False)
    finally:
        engine.close(wait=10)
