"""rooms/unsteered_memo.py: a session's next generation of the same prompt and sampling decodes the steered and
counterfactual rows only, and shows the unsteered side its last generation decoded, which is what decoding it
again gives; anything that changes that side (prompt, sampling, seed, model) decodes it again, a generation cut
short keeps nothing, and sessions keep their own."""
from __future__ import annotations

import dataclasses

import pytest

from steer_ui.model import generation
from steer_ui.model.generation import COUNTERFACTUAL, STEERED, UNSTEERED
from steer_ui.rooms import unsteered_memo
from steer_ui.service import Service
from steer_ui.tiny import tiny_handle

PROMPT = "The weather in Paris"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return Service(handle=tiny_handle("llama"), workdir=tmp_path_factory.mktemp("memo"))


@pytest.fixture
def made(monkeypatch):
    """Every Request the door makes, in order (the real make runs)."""
    seen = []
    real = generation.Request.make.__func__

    def make(cls, *args, **kwargs):
        seen.append(real(cls, *args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(generation.Request, "make", classmethod(make))
    return seen


def _final(service, session, alpha, prompt=PROMPT, **sampling):
    s = dataclasses.replace(service.sampling(max_new_tokens=10, **sampling), stop_at_eos=False)
    return [f for f in service.stream_generate(session, prompt, None, 1, alpha, True, 0, s)][-1]


def _side(frame, side):
    return [(t.token_id, t.logprob, t.alternatives) for t in getattr(frame, f"{side}_tokens")]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}], ids=["greedy", "sampled"])
def test_the_next_generation_decodes_two_rows_and_shows_the_side_decoding_would_give(service, made, sampling):
    session = f"memo-{len(sampling)}"
    first = _final(service, session, 0.1, **sampling)
    second = _final(service, session, 0.4, **sampling)
    assert made[0].kinds == (UNSTEERED, STEERED, COUNTERFACTUAL)
    assert made[1].kinds == (STEERED, COUNTERFACTUAL)  # the kept side is not decoded again
    assert second.unsteered_text == first.unsteered_text and _side(second, "unsteered") == _side(first, "unsteered")
    assert second.unsteered_finished == "length" and second.done
    # a session with nothing kept decodes all three rows for α 0.4: the same unsteered side, and the same steered
    # side as the two-row decode (its noise is the request's, whatever rows decode)
    fresh = _final(service, session + "-fresh", 0.4, **sampling)
    assert made[2].kinds == (UNSTEERED, STEERED, COUNTERFACTUAL)
    assert _side(fresh, "unsteered") == _side(first, "unsteered")
    assert [t[0] for t in _side(fresh, "steered")] == [t[0] for t in _side(second, "steered")]
    assert [t.delta_logit for t in fresh.steered_tokens] == pytest.approx(
        [t.delta_logit for t in second.steered_tokens], abs=1e-4)
    assert first.steered_text != second.steered_text or first.steered_tokens != second.steered_tokens


def test_another_prompt_sampling_seed_or_session_decodes_the_unsteered_side_again(service, made):
    _final(service, "memo-keys", 0.1, temperature=0.9, seed=1)
    _final(service, "memo-keys", 0.2, prompt="Another prompt", temperature=0.9, seed=1)
    _final(service, "memo-keys", 0.2, temperature=0.9, seed=2)
    _final(service, "memo-keys", 0.2, temperature=0.8, seed=1)
    _final(service, "memo-other-session", 0.2, temperature=0.9, seed=1)
    assert all(r.kinds[0] == UNSTEERED for r in made)
    # a Δlogit limit changes the steered side only: the kept side serves
    _final(service, "memo-keys", 0.2, temperature=0.9, seed=1, max_delta_logit=3.0)
    assert made[-1].kinds == (STEERED, COUNTERFACTUAL)


def test_a_generation_cut_short_keeps_nothing(service, made):
    s = dataclasses.replace(service.sampling(max_new_tokens=200), stop_at_eos=False)
    frames = service.stream_generate("memo-cut", PROMPT, None, 1, 0.1, True, 0, s)
    next(frames)
    frames.close()  # the page went away: the request is cancelled mid-way
    assert unsteered_memo.MEMO not in service.peek_session("memo-cut").cache
    _final(service, "memo-cut", 0.1)
    assert made[-1].kinds == (UNSTEERED, STEERED, COUNTERFACTUAL)


def test_a_kept_side_of_another_model_is_not_shown():
    class Model:  # only its identity matters: a handle the entry no longer names
        pass

    cache, old, new = {}, Model(), Model()
    sampling = generation.Sampling(max_new_tokens=4)
    memo_key = unsteered_memo.key(PROMPT, sampling)
    unsteered_memo.remember(cache, old, memo_key, generation.Side(text="kept", finished="length"))
    assert unsteered_memo.recall(cache, old, memo_key).text == "kept"
    assert unsteered_memo.recall(cache, new, memo_key) is None
    # a request that measures its first token against the steered one needs the row: nothing kept or shown
    assert unsteered_memo.key(PROMPT, dataclasses.replace(sampling, measure=True)) is None
    assert unsteered_memo.key(PROMPT, dataclasses.replace(sampling, unsteered=False)) is None


def test_a_session_keeps_its_few_latest_sides():
    class Model:
        pass

    cache, model = {}, Model()
    keys = [unsteered_memo.key(f"prompt {i}", generation.Sampling()) for i in range(unsteered_memo.KEPT + 3)]
    for i, k in enumerate(keys):
        unsteered_memo.remember(cache, model, k, generation.Side(text=str(i), finished="eos"))
    assert [unsteered_memo.recall(cache, model, k) for k in keys[:3]] == [None] * 3
    assert [unsteered_memo.recall(cache, model, k).text for k in keys[3:]] == [str(i) for i in range(3, len(keys))]
