"""Our side of the bench's llama.cpp measures (issue #50), on a tiny model, with or without llama_cpp installed.

No timing assertions: the steered-only step decodes one row with the side-by-side's steered tokens, the eight
sequences of ``batch8_vs_llama_cpp`` decode together as eight rows, each its own steering and each what it
decodes alone, and without llama_cpp (or a GGUF) the measures say why they were skipped.  The llama.cpp side
runs in tests/integration/test_llama_cpp_side.py where llama_cpp is installed.
"""
from __future__ import annotations

import sys

from steer_ui.model.generation import DecodeBatch
from steer_ui.tools.measures import GENERATION_PROMPT, _ours, seeded_steer
from steer_ui.tools.vs_llama_cpp import (BATCH8_PROMPTS, BATCH8_SEQUENCES, batch8_steers, bench_batch8_vs_llama_cpp,
                                         bench_vs_llama_cpp, ours_batch_seconds)


def test_the_steered_only_step_decodes_the_side_by_sides_steered_tokens_without_the_unsteered_side(tiny):
    handle = tiny("llama")
    steer, _ = seeded_steer(handle, 1)
    _, steps, alone = _ours(handle, GENERATION_PROMPT, [steer], 6, steered_only=True)
    _, _, both = _ours(handle, GENERATION_PROMPT, [steer], 6)
    assert [t.token_id for t in alone.steered.tokens] == [t.token_id for t in both.steered.tokens]
    assert alone.unsteered.tokens == [] and both.unsteered.tokens
    assert len(steps) == 5 and all(s > 0 for s in steps)


def test_eight_steerings_decode_together_as_eight_rows_each_as_it_decodes_alone(tiny):
    handle = tiny("llama")
    prompts = list(BATCH8_PROMPTS)
    steers = batch8_steers(handle, 1)
    assert len(prompts) == len(set(prompts)) == len(steers) == BATCH8_SEQUENCES
    assert len({tuple(s.vector.tolist()) for s in steers}) == BATCH8_SEQUENCES  # eight different vectors
    batch = DecodeBatch(handle)
    rows = []
    advance = batch.advance

    def counted_advance():  # the rows each step runs: one steered row per sequence
        rows.append(batch.rows)
        advance()

    batch.advance = counted_advance
    seconds, tokens = ours_batch_seconds(handle, prompts, steers, 5, batch)
    assert seconds > 0 and len(batch) == 0  # the finished requests were dropped: the batch can be used again
    assert rows == [BATCH8_SEQUENCES] * 5  # four steps after the prompts' pass, then the call that drops them
    for prompt, steer, together in zip(prompts, steers, tokens):
        _, _, solo = _ours(handle, prompt, [steer], 5, steered_only=True)
        assert together == [t.token_id for t in solo.steered.tokens], prompt


def test_without_llama_cpp_both_measures_say_they_were_skipped(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # an import of it now raises ImportError
    handle = tiny("llama")
    steer, _ = seeded_steer(handle, 1)
    one = bench_vs_llama_cpp(handle, steer, 4, 1, lambda _m: None)
    eight = bench_batch8_vs_llama_cpp(handle, 1, 4, 1, lambda _m: None)
    for out in (one, eight):
        assert out["status"].startswith("skipped: llama_cpp is not installed"), out


def test_interleaved_runs_warm_up_uncounted_and_turn_their_order_each_round():
    """The bench's runs take turns (the order turned each round) after one uncounted warm-up round, so a drift
    in the machine's speed falls on every side alike."""
    from steer_ui.tools.timing import interleaved

    calls = []

    def run(name):
        def call():
            calls.append(name)
            return len(calls)
        return call

    results = interleaved({"a": run("a"), "b": run("b")}, reps=3)
    assert calls == ["b", "a", "a", "b", "b", "a", "a", "b"]
    assert results == {"a": [3, 6, 7], "b": [4, 5, 8]}
