"""Many requests in one decode batch get exactly what each gets alone.

Each request here differs from the others in prompt length, vector, block,
α, positions and sampling; the batch left-pads, masks, gives each row its own
steering matrix row and its own random stream.  Tokens must match exactly,
log-probabilities and Δlogits to float noise.
"""
import pytest
import torch

from steer_ui.model import kv_rows
from steer_ui.model.generation import DecodeBatch, Request, Sampling, side_by_side
from steer_ui.model.hooks import HeadSteer, Steer, hook_count

from same_results import DECODE_TOL as TOL  # float32 noise from padding and batch shapes


def _requests(handle):
    g = torch.Generator().manual_seed(0)
    hidden = handle.arch.hidden_size
    v1, v2 = torch.randn(hidden, generator=g), torch.randn(hidden, generator=g)
    last = handle.arch.num_layers - 1
    return [
        ("Hello there, how are", [Steer(layer=1, vector=v1, alpha=6.0)], Sampling(max_new_tokens=9)),
        ("x", [Steer(layer=2, vector=v2, alpha=-8.0, positions="generated")],
         Sampling(max_new_tokens=7, temperature=1.0, top_k=20, seed=3)),
        ("A much longer prompt that pads the others on the left", [],
         Sampling(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=11, repetition_penalty=1.3)),
        ("abc def", [Steer(layer=0, vector=v1, alpha=3.0, positions="prompt"),
                     Steer(layer=last, vector=v2, alpha=5.0)], Sampling(max_new_tokens=8, alternatives=3)),
        # a Δlogit limit tight enough to bite: its full-vocabulary counterfactual row joins the others' rows
        ("Once upon a time", [Steer(layer=1, vector=v2, alpha=10.0)],
         Sampling(max_new_tokens=7, temperature=0.7, seed=5, max_delta_logit=0.3)),
    ]


def _same(batched, alone):
    for side in ("unsteered", "steered"):
        a, b = getattr(batched, side), getattr(alone, side)
        assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens], side
        assert a.text == b.text and a.finished == b.finished
        for x, y in zip(a.tokens, b.tokens):
            assert x.logprob == pytest.approx(y.logprob, abs=TOL)
            assert [p for _, p in x.alternatives] == pytest.approx([p for _, p in y.alternatives], abs=TOL)
            if side == "steered":
                assert x.delta_logit == pytest.approx(y.delta_logit, abs=TOL)
                assert x.direct_delta_logit == pytest.approx(y.direct_delta_logit, abs=TOL)
                assert (x.max_delta_logit is None) == (y.max_delta_logit is None)
                if x.max_delta_logit is not None:
                    assert x.max_delta_logit == pytest.approx(y.max_delta_logit, abs=TOL)
                    assert x.kept == pytest.approx(y.kept, abs=TOL)


def _setup(handle):
    """(solo results, a fresh batch, requests for the same specs)."""
    specs = _requests(handle)
    alone = [side_by_side(handle, p, s, sm) for p, s, sm in specs]
    return alone, DecodeBatch(handle), [Request.make(handle, p, s, sm) for p, s, sm in specs]


def _drain(batch):
    while len(batch):
        batch.sample()
        batch.advance()


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2", "qwen2"])
def test_requests_together_equal_requests_alone(tiny, family):
    handle = tiny(family)
    alone, batch, requests = _setup(handle)
    batch.admit(requests)
    assert len(batch) == len(requests)
    _drain(batch)
    for r, solo in zip(requests, alone):
        assert r.done
        _same(r.result, solo)
    assert hook_count(handle) == 0


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("products", ["float", "w8a16"])
def test_requests_together_equal_requests_alone_with_int8_weights(family, products):
    """Issue #37: the many-users batch stays exact in int8 (each row's product is formed alike in any batch);
    issue #50: also with integer products on int16 activations on for every product, as the loader sets it."""
    from steer_ui.model.int8 import int8_weights
    from steer_ui.model.loading import load_model

    handle = load_model(f"tiny:{family}", device="cpu", weights="int8")
    assert handle.weights == "int8"
    for w in int8_weights(handle.model):
        w.w8a16 = products == "w8a16"
    alone, batch, requests = _setup(handle)
    batch.admit(requests)
    _drain(batch)
    for r, solo in zip(requests, alone):
        assert r.done
        _same(r.result, solo)


def _identical(batched, alone):
    """Every token and every reported number equal, bit for bit (``_same`` allows float noise)."""
    for side in ("unsteered", "steered"):
        a, b = getattr(batched, side), getattr(alone, side)
        assert a.text == b.text and a.finished == b.finished
        assert [(t.token_id, t.logprob, t.alternatives, t.delta_logit, t.direct_delta_logit, t.max_delta_logit,
                 t.kept) for t in a.tokens] == \
            [(t.token_id, t.logprob, t.alternatives, t.delta_logit, t.direct_delta_logit, t.max_delta_logit, t.kept)
             for t in b.tokens], side


@pytest.mark.parametrize("int16", ["the unembedding", "every product, on packed weights"])
def test_requests_admitted_as_the_engine_groups_them_equal_requests_alone_bit_for_bit(int16):
    """Issue #50: on the fused CPU step each row is computed alone and the engine never pads a prompt on the CPU
    (generation.prefill_groups), so the batch gives each request's solo numbers bit for bit, also with the
    unembedding on int16 activations (rounding turns any last-bit difference into a code step), or every
    product (the block products on packed weights: AMX's tiles or AVX-512 VNNI, where the CPU has them).  Admitted in one padded pass instead,
    the padded rows part in the last bits, which is what the no-padding rule is for."""
    from steer_ui.model.generation import prefill_groups
    from steer_ui.model.loading import load_model
    from rounded_activations import on_packed_weights

    handle = load_model("tiny:gemma3", device="cpu", weights="int8")
    if int16 == "the unembedding":
        handle.arch.int8_unembedding.w8a16 = True
    else:
        on_packed_weights(handle)
    alone, batch, requests = _setup(handle)
    groups = prefill_groups(requests, "cpu")
    assert len(groups) == len({len(r.ids) for r in requests}) > 1
    for group in groups:
        batch.admit(group)
    assert batch.decode_path["path"] == "fused"
    _drain(batch)
    for r, solo in zip(requests, alone):
        _identical(r.result, solo)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_requests_join_and_leave_between_steps(tiny, family):
    """Continuous batching: a late request joins a running batch (shorter and longer prompts), early ones leave."""
    handle = tiny(family)
    alone, batch, requests = _setup(handle)
    batch.admit(requests[:2])
    for step in range(12):
        if step == 2:
            batch.admit([requests[2]])  # longer prompt than the batch's columns: the running rows are padded
        if step == 4:
            batch.admit([requests[3]])
        if step == 5:
            batch.admit([requests[4]])  # the Δlogit-limited one
        if len(batch):
            batch.sample()
            batch.advance()
    _drain(batch)
    for r, solo in zip(requests, alone):
        _same(r.result, solo)


def test_cancelled_request_frees_its_rows_and_others_continue(tiny):
    handle = tiny("gemma3")
    specs = _requests(handle)
    alone = side_by_side(handle, *specs[0])
    batch = DecodeBatch(handle)
    keep, drop = Request.make(handle, *specs[0]), Request.make(handle, *specs[2])
    batch.admit([keep, drop])
    batch.sample()
    drop.cancelled = True
    batch.advance()
    assert batch.requests == [keep] and batch.hidden.shape[0] == 3
    # the cancelled request had the longer prompt: its padding columns are trimmed from the cache
    assert batch.kv.columns == len(keep.ids) + 1
    _drain(batch)
    _same(keep.result, alone)


def test_per_row_head_shifts_match_alone(tiny):
    handle = tiny("llama")
    width = 64
    shift = torch.randn(width)
    head = HeadSteer({1: shift}, alpha=4.0, positions="last")
    alone = side_by_side(handle, "heads here", [head], Sampling(max_new_tokens=6))
    plain = side_by_side(handle, "other prompt", [], Sampling(max_new_tokens=6))
    batch = DecodeBatch(handle)
    a, b = Request.make(handle, "heads here", [head], Sampling(max_new_tokens=6)), \
        Request.make(handle, "other prompt", [], Sampling(max_new_tokens=6))
    batch.admit([b, a])
    _drain(batch)
    _same(a.result, alone)
    _same(b.result, plain)


def test_left_padding_leaves_every_rows_logits_alone(tiny):
    """The prefill of a padded row gives the logits of the same row run alone, to float noise."""
    handle = tiny("gemma3")
    short, long_ = Request.make(handle, "hi", []), Request.make(handle, "a far longer prompt than hi", [])
    alone = DecodeBatch(handle)
    alone.admit([Request.make(handle, "hi", [])])
    together = DecodeBatch(handle)
    together.admit([long_, short])
    logits_alone = handle.arch.logits(alone.hidden[:1])
    logits_padded = handle.arch.logits(together.hidden[1:2])  # requests without steers decode one row each
    assert (logits_alone - logits_padded).abs().max() < 1e-4
    assert together.kv.mask[1].sum() == len(short.ids) and together.kv.mask[0].sum() == len(long_.ids)


def test_kv_rows_join_pads_sliding_layers_to_the_window(tiny):
    handle = tiny("gemma3")  # sliding window 16: layers keep at most 15 columns
    batch = DecodeBatch(handle)
    batch.admit([Request.make(handle, "y" * 30, [])])
    batch.admit([Request.make(handle, "z", [])])
    assert kv_rows.joinable(batch.kv.cache)
    for layer in batch.kv.cache.layers:
        width = layer.keys.shape[-2]
        assert width == (15 if layer.is_sliding else batch.kv.columns)
        assert layer.keys.shape[0] == 2  # two requests without steers: a row each
