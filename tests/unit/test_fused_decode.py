"""The fused decode step (steer_ui/model/fused_decode.py, block_kernel.c) against the dynamic one.

On a CPU the fused step is the default for Gemma 3 with int8 weights.  It must give the dynamic path's tokens
across joins and leaves, per-row vectors, α, blocks, positions, per-head shifts, special tokens, sliding-window
blocks and sampling, with probabilities and logit differences to float32 noise (its norms, rope and attention
sum in another order); and a batch of requests must equal each request alone bit for bit, as on every path.
"""
import math

import pytest
import torch

from steer_ui.model import fused_decode, static_decode
from steer_ui.model.generation import DecodeBatch, Request, Sampling, row_twins
from steer_ui.model.hooks import HeadSteer, Steer, hook_count
from steer_ui.model.int8 import int8_weights, kernel_available
from steer_ui.tiny import tiny_handle
from test_static_decode import SCHEDULE, _run, _same, _specs

pytestmark = pytest.mark.skipif(not kernel_available(), reason="no C compiler: the fused step is not built")

LOGIT_TOL = 1e-4  # Δlogits of a few units, summed in another order through 6 blocks


@pytest.fixture(scope="module")
def gemma3():
    """A 6-block tiny Gemma 3 (sliding-window blocks beside a full one, window 16) with int8 weights."""
    return tiny_handle("gemma3", layers=6, int8=True)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=LOGIT_TOL)


def _agree(fused_results, dynamic_results):
    """The dynamic step's checks (test_static_decode._same) with Δlogits to float32 noise summed another way."""
    _same(fused_results, dynamic_results, close=_close)


def test_gemma3_with_int8_weights_takes_the_fused_path_by_default_on_cpu(gemma3, monkeypatch):
    monkeypatch.delenv(static_decode.ENV, raising=False)
    path = DecodeBatch(gemma3).decode_path
    assert path["path"] == "fused" and path["reason"].startswith("cpu")
    assert DecodeBatch(gemma3, decode="dynamic").decode_path["path"] == "dynamic"
    assert DecodeBatch(gemma3, decode="fused").decode_path["path"] == "fused"


@pytest.mark.parametrize("family, weights, why", [("gemma3", "float32", "not int8"), ("llama", "int8", "Gemma 3")])
def test_other_models_keep_the_dynamic_path_and_say_why(family, weights, why):
    handle = tiny_handle(family, int8=weights == "int8")
    path = DecodeBatch(handle, decode="fused").decode_path
    assert path["path"] == "dynamic" and why in path["reason"]
    assert DecodeBatch(handle).decode_path["path"] == "dynamic"


def test_fused_step_equals_dynamic_step_across_joins_and_leaves(gemma3):
    specs = _specs(gemma3)
    fused_batch, fused = _run(gemma3, "fused", SCHEDULE, specs)
    _, dynamic = _run(gemma3, "dynamic", SCHEDULE, specs)
    assert fused_batch.decode_path["path"] == "fused"
    _agree(fused, dynamic)
    assert hook_count(gemma3) == 0
    # the steered rows really were steered, and the longest request ran well past the sliding window
    assert [t.token_id for t in fused[0].steered.tokens] != [t.token_id for t in fused[0].unsteered.tokens]
    longest = max(len(Request.make(gemma3, *spec).ids) + spec[2].max_new_tokens for spec in specs)
    assert longest > 2 * gemma3.model.config.sliding_window


def test_per_head_shifts_special_tokens_and_input_dependent_vectors(gemma3):
    g = torch.Generator().manual_seed(1)
    width = gemma3.model.config.num_attention_heads * gemma3.model.config.head_dim
    shift, w = torch.randn(width, generator=g), torch.randn(64, 64, generator=g) / 8
    eos = gemma3.tokenizer.eos_token
    specs = [("heads here", [HeadSteer({1: shift}, alpha=4.0, positions="last")], Sampling(max_new_tokens=6)),
             (f"a turn{eos} then more", [Steer(layer=3, vector=w[0] * 3, alpha=2.0, special_tokens=True),
                                         HeadSteer({4: shift}, alpha=-3.0, special_tokens=True)],
              Sampling(max_new_tokens=8)),
             ("its own vector", [Steer(layer=2, fn=lambda h: torch.tanh(h @ w) * 6.0, context_layer=1)],
              Sampling(max_new_tokens=7, temperature=0.7, seed=2))]
    schedule = {0: [1], 2: [0], 3: [2]}
    _, fused = _run(gemma3, "fused", schedule, specs)
    _, dynamic = _run(gemma3, "dynamic", schedule, specs)
    _agree(fused, dynamic)
    # the head shifts changed what the first request says
    _, plain = _run(gemma3, "fused", {0: [0]}, [("heads here", [], Sampling(max_new_tokens=6))])
    assert [t.token_id for t in plain[0].steered.tokens] != [t.token_id for t in fused[0].steered.tokens]


def test_the_store_grows_and_rows_leave_without_changing_results(gemma3, monkeypatch):
    monkeypatch.setattr(fused_decode, "_GROW", 2)
    specs = _specs(gemma3)
    schedule = {0: [0], 3: [1], 9: [2], 16: [3]}
    _, fused = _run(gemma3, "fused", schedule, specs)
    _, dynamic = _run(gemma3, "dynamic", schedule, specs)
    _agree(fused, dynamic)


def test_requests_together_equal_requests_alone_bit_for_bit(gemma3):
    """A row's arithmetic does not depend on the rows beside it (nor on their padding): exact equality."""
    specs = _specs(gemma3)
    _, together = _run(gemma3, "fused", SCHEDULE, specs)
    for i in sorted({i for ids in SCHEDULE.values() for i in ids}):
        _, alone = _run(gemma3, "fused", {0: [i]}, specs)
        for side in ("unsteered", "steered"):
            a, b = getattr(together[i], side), getattr(alone[i], side)
            assert [(t.token_id, t.logprob, t.alternatives) for t in a.tokens] == \
                [(t.token_id, t.logprob, t.alternatives) for t in b.tokens]
            if side == "steered":
                assert [(t.delta_logit, t.direct_delta_logit) for t in a.tokens] == \
                    [(t.delta_logit, t.direct_delta_logit) for t in b.tokens]


def _exact(a_results, b_results):
    for a_result, b_result in zip(a_results, b_results):
        for side in ("unsteered", "steered"):
            a, b = getattr(a_result, side), getattr(b_result, side)
            assert [(t.token_id, t.logprob, t.alternatives, t.delta_logit, t.direct_delta_logit) for t in a.tokens] \
                == [(t.token_id, t.logprob, t.alternatives, t.delta_logit, t.direct_delta_logit) for t in b.tokens]


def test_counterfactual_rows_taking_their_twins_blocks_change_no_bit(gemma3):
    """A counterfactual row skips the blocks below its request's first steered block and takes its steered row's
    output there (the two are fed the same tokens and neither is steered yet): every number is the same bit for
    bit as when every row computes every block, across joins and leaves, with residual steers at several blocks,
    head shifts (inside their block), special tokens, an input-dependent vector and an unsteered request (one row,
    mirrored) beside them."""
    g = torch.Generator().manual_seed(3)
    width = gemma3.model.config.num_attention_heads * gemma3.model.config.head_dim
    shift, w = torch.randn(width, generator=g), torch.randn(64, 64, generator=g) / 8
    eos = gemma3.tokenizer.eos_token
    specs = _specs(gemma3) + [
        ("nothing steered", [], Sampling(max_new_tokens=5)),
        ("heads at 2", [HeadSteer({2: shift}, alpha=4.0)], Sampling(max_new_tokens=6, temperature=0.8, seed=1)),
        (f"a turn{eos} then more", [Steer(layer=4, vector=w[0] * 3, alpha=2.0, special_tokens=True),
                                    Steer(layer=1, vector=w[1] * 2, alpha=-1.0, positions="prompt")],
         Sampling(max_new_tokens=8)),
        ("its own vector", [Steer(layer=3, fn=lambda h: torch.tanh(h @ w) * 6.0, context_layer=1)],
         Sampling(max_new_tokens=7))]
    schedule = {0: [0, 5], 1: [6, 7], 2: [2, 8], 4: [1], 5: [3], 6: [4]}
    batch, shared = _run(gemma3, "fused", schedule, specs)
    assert batch.decode_path["path"] == "fused"
    with fused_decode.every_row_computed():
        _, computed = _run(gemma3, "fused", schedule, specs)
    _exact(shared, computed)
    # and the rows were shared: a request steered at the last block only skips its counterfactual row in every
    # block (an unsteered request has no counterfactual row to skip: it is mirrored, one row)
    lone = DecodeBatch(gemma3, decode="fused")
    lone.admit([Request.make(gemma3, "the last block", [Steer(layer=5, vector=w[2], alpha=3.0)],
                             Sampling(max_new_tokens=5))])
    assert lone.kv._active == [2] * len(gemma3.arch.layers) and lone.kv._copies == {5: [(2, 1)]}


def test_a_join_stores_the_rows_in_their_shared_order_with_no_second_copy(gemma3, monkeypatch):
    """The store is built at each join in the order the twins ask for (plain rows first, then the rows with twins,
    fewest shared blocks first): the steering that follows finds it so and copies nothing again."""
    copies = []
    reorder = fused_decode.FusedDecode._reorder
    monkeypatch.setattr(fused_decode.FusedDecode, "_reorder", lambda self, *a: copies.append(a) or reorder(self, *a))
    specs = _specs(gemma3)
    batch = DecodeBatch(gemma3, decode="fused")
    batch.admit([Request.make(gemma3, *specs[0])])
    batch.sample()
    batch.advance()
    batch.admit([Request.make(gemma3, *spec) for spec in specs[1:3]])
    assert copies == []
    order = batch.kv._order.tolist()  # the order the twins give
    assert order == fused_decode._stored_order(row_twins(batch.requests, len(gemma3.arch.layers))).tolist()
    assert order != list(range(len(order)))  # the counterfactual rows were moved after the others


def test_with_every_product_on_packed_weights_the_fused_step_takes_them_and_stays_exact():
    """Issue #50: where the loader turns on int16 activations for every product (packed weights: AMX's tiles or
    AVX-512 VNNI), the fused step's blocks take them too (block_kernel.c calls the packed product): the same tokens and
    numbers as the dynamic step, whose products are the same kernel's (the norms and attention to float noise),
    and a batch equal to each request alone, bit for bit."""
    from rounded_activations import on_packed_weights

    handle = tiny_handle("gemma3", layers=6, int8=True)
    on_packed_weights(handle)
    assert fused_decode.unsupported(handle) is None
    specs = _specs(handle)
    fused_batch, fused = _run(handle, "fused", SCHEDULE, specs)
    assert fused_batch.decode_path["path"] == "fused"
    assert all(w.packed is not None for w in int8_weights(handle.model))  # the blocks read the packed form
    _, dynamic = _run(handle, "dynamic", SCHEDULE, specs)
    _agree(fused, dynamic)
    for i in (0, 3):
        _, alone = _run(handle, "fused", {0: [i]}, specs)
        for side in ("unsteered", "steered"):
            a, b = getattr(fused[i], side), getattr(alone[i], side)
            assert [(t.token_id, t.logprob, t.alternatives) for t in a.tokens] == \
                [(t.token_id, t.logprob, t.alternatives) for t in b.tokens]


def test_a_norm_gain_written_after_loading_is_read(gemma3):
    """The kernel reads each norm's 1 + w as kept by architecture.norm_gain; a weight written in place is seen."""
    spec = [("Hello there", [], Sampling(max_new_tokens=5))]
    norm = gemma3.arch.layers[2].post_feedforward_layernorm
    before = _run(gemma3, "fused", {0: [0]}, spec)[1][0]
    saved = norm.weight.detach().clone()
    try:
        with torch.no_grad():
            norm.weight.mul_(-3.0).add_(2.0)
        changed = _run(gemma3, "fused", {0: [0]}, spec)[1][0]
        dynamic = _run(gemma3, "dynamic", {0: [0]}, spec)[1][0]
    finally:
        with torch.no_grad():
            norm.weight.copy_(saved)
    _agree([changed], [dynamic])
    assert [t.logprob for t in changed.steered.tokens] != [t.logprob for t in before.steered.tokens]


def test_bench_reports_the_fused_path_beside_the_others(gemma3):
    from steer_ui.tools.measures import bench_decode_paths, seeded_steer

    steer, _ = seeded_steer(gemma3, 1)
    out = bench_decode_paths(gemma3, steer, 4, 3, lambda _message: None)
    assert out["fused_path"]["path"] == "fused" and out["dynamic_path"]["path"] == "dynamic"
    assert len(out["fused_over_dynamic_per_pair"]) == 3 and out["fused_over_dynamic"] > 0
    assert out["fused_tokens_equal"] is True and out["static_tokens_equal"] is True
