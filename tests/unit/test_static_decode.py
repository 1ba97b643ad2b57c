"""The static decode step (steer_ui/model/static_decode.py) against today's dynamic one.

On CPU the static step runs eagerly (``decode="static"``); it must give the
dynamic path's tokens exactly and its probabilities to float noise, across
joins and leaves, per-row vectors, α, layers, positions and sampling, on
families with full, sliding-window and eager-attention layers.  Steering
changed between steps must take effect with no re-build of the store.  The
CUDA-graph path runs the same checks where a GPU is present and is skipped
elsewhere.
"""
import math
import threading

import pytest
import torch

from steer_ui.model import static_decode
from steer_ui.model.generation import DecodeBatch, Request, Sampling
from steer_ui.model.hooks import HeadSteer, Steer, hook_count
from steer_ui.tiny import tiny_handle
from test_decode_batch import _requests

PROB_TOL = 1e-5
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def handles():
    """Tiny models per family; gemma3 with 6 blocks, so its sliding-window blocks sit beside a full one."""
    made = {}

    def make(family: str):
        if family not in made:
            made[family] = tiny_handle(family, layers=6) if family == "gemma3" else tiny_handle(family)
        return made[family]

    return make


def _specs(handle):
    """Five requests differing in prompt length, vector, block, α, positions and sampling (greedy, seeded, one
    with a Δlogit limit): the ones the dynamic batch's own tests use."""
    return _requests(handle)


def _run(handle, decode, schedule, specs, change=None, every_block=False, graph=None):
    """Drive a batch: ``schedule`` {step: [spec indices to admit]}; ``change(batch, step)`` may resteer;
    ``every_block``: the static step reads the steering buffer at every block, as the captured step does;
    ``graph=False``: the static step runs eagerly even on CUDA."""
    batch = DecodeBatch(handle, decode=decode)
    if batch.static is not None:
        batch.static.every_block = every_block
        if graph is not None:
            batch.static.graph = graph
    requests = [Request.make(handle, *spec) for spec in specs]
    step = 0
    while step == 0 or len(batch) or any(step <= s for s in schedule):
        for i in schedule.get(step, []):
            batch.admit([requests[i]])
        if len(batch):
            batch.sample()
            if change is not None:
                change(batch, step)
            batch.advance()
        step += 1
    admitted = {i for spec_ids in schedule.values() for i in spec_ids}
    assert all(requests[i].done for i in admitted)
    return batch, [r.result for r in requests]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=PROB_TOL)


def _same(static_results, dynamic_results, close=None):
    """The same tokens, texts and ends; probabilities within PROB_TOL; Δlogits ``close`` (default: to 1e-6 of
    their size)."""
    close = close or _close
    for s_result, d_result in zip(static_results, dynamic_results):
        for side in ("unsteered", "steered"):
            s, d = getattr(s_result, side), getattr(d_result, side)
            assert [t.token_id for t in s.tokens] == [t.token_id for t in d.tokens], side
            assert s.text == d.text and s.finished == d.finished
            for x, y in zip(s.tokens, d.tokens):
                assert abs(math.exp(x.logprob) - math.exp(y.logprob)) < PROB_TOL
                assert all(abs(p - q) < PROB_TOL for (_, p), (_, q) in zip(x.alternatives, y.alternatives))
                if side == "steered":  # logit differences: large ones to 1e-6 of their size
                    assert close(x.delta_logit, y.delta_logit) and close(x.direct_delta_logit, y.direct_delta_logit)


# joins at steps 0, 2 (a longer prompt than the running columns: the running rows move right) and 5;
# requests leave at their own lengths, so rows leave from the middle of the slot range too
SCHEDULE = {0: [0, 1], 2: [2], 5: [3], 6: [4]}  # 4: the Δlogit-limited request


@pytest.mark.parametrize("family", ["llama", "gemma3", "gemma2", "qwen2", "mistral", "gpt2", "phi3", "gpt_neox",
                                    "opt"])
def test_static_step_equals_dynamic_step_across_joins_and_leaves(handles, family):
    handle = handles(family)
    specs = _specs(handle)
    static_batch, static = _run(handle, "static", SCHEDULE, specs)
    dynamic_batch, dynamic = _run(handle, "dynamic", SCHEDULE, specs)
    assert static_batch.decode_path["path"] == "static (eager)"
    assert dynamic_batch.decode_path["path"] == "dynamic"
    _same(static, dynamic)
    assert hook_count(handle) == 0
    # the steered rows really were steered (the comparison is not between two unsteered decodes)
    assert [t.token_id for t in static[0].steered.tokens] != [t.token_id for t in static[0].unsteered.tokens]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_captured_steps_hooks_run_eagerly_give_the_same(handles, family):
    """What a CUDA graph records: the steering buffer added at every block (zero rows where nothing steers)."""
    handle = handles(family)
    specs = _specs(handle)
    static_batch, static = _run(handle, "static", SCHEDULE, specs, every_block=True)
    _, dynamic = _run(handle, "dynamic", SCHEDULE, specs)
    _same(static, dynamic)


def test_sliding_window_is_exercised(handles):
    """gemma3's window is 16 columns: the longest request runs well past it, and the test above covers it."""
    handle = handles("gemma3")
    kinds = static_decode.layer_types(handle)
    assert "sliding_attention" in kinds and "full_attention" in kinds
    longest = max(len(Request.make(handle, *spec).ids) + spec[2].max_new_tokens for spec in _specs(handle))
    assert longest > 2 * handle.model.config.sliding_window


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_compaction_and_growth_keep_results(handles, family, monkeypatch):
    """With 8-column growth steps the store compacts and grows several times; results do not change."""
    monkeypatch.setattr(static_decode, "_COLUMN_BUCKET", 8)
    handle = handles(family)
    specs = _specs(handle)
    schedule = {0: [0], 3: [1], 9: [2], 16: [3]}
    static_batch, static = _run(handle, "static", schedule, specs)
    _, dynamic = _run(handle, "dynamic", schedule, specs)
    _same(static, dynamic)
    assert static_batch.static.builds > 2  # it did grow (each growth a re-build)


def test_per_head_shifts_and_input_dependent_vectors_on_the_static_path(handles):
    handle = handles("llama")
    g = torch.Generator().manual_seed(1)
    shift, w = torch.randn(64, generator=g), torch.randn(64, 64, generator=g) / 8
    specs = [("heads here", [HeadSteer({1: shift}, alpha=4.0, positions="last")], Sampling(max_new_tokens=6)),
             ("other prompt", [Steer(layer=3, vector=shift, alpha=2.0)], Sampling(max_new_tokens=8)),
             ("its own vector", [Steer(layer=2, fn=lambda h: torch.tanh(h @ w) * 6.0, context_layer=1)],
              Sampling(max_new_tokens=7, temperature=0.7, seed=2))]
    schedule = {0: [1], 2: [0], 3: [2]}
    static_batch, static = _run(handle, "static", schedule, specs)
    _, dynamic = _run(handle, "dynamic", schedule, specs)
    _same(static, dynamic)
    assert static_batch.static.heads is not None


def test_the_engine_on_the_static_path_gives_solo_results(handles, monkeypatch):
    """Concurrent requests through the request batcher (its pauses between blocks included) on the static path."""
    from steer_ui.model.engine import Engine
    from test_engine import _run_concurrently

    handle = handles("gemma3")
    specs = _specs(handle)
    _, solo = _run(handle, "dynamic", {i: [i] for i in range(len(specs))}, specs)
    monkeypatch.setenv(static_decode.ENV, "static")
    steps = []
    real_step = static_decode.StaticDecode.step
    monkeypatch.setattr(static_decode.StaticDecode, "step",
                        lambda self, *a, **k: steps.append(1) or real_step(self, *a, **k))  # counts, then steps
    engine = Engine(handle, gather_seconds=0.05)
    results = _run_concurrently(engine, handle, specs)
    engine.close(wait=5)
    _same(results, solo)
    assert engine.stats.peak_requests > 1  # they did share the batch ...
    assert 0 < len(steps) < engine.stats.steps  # ... and decoded on the static step (a batch's last sample has none)


def _resteer(vector, layer):
    """At step 3: request 0's steered row gets a new vector at another block with a new α."""
    def change(batch, step):
        if step == 3:
            request = batch.requests[0]
            request.decode_resid = {layer: -7.0 * vector}
            if batch.static is not None:
                change.builds = batch.static.builds
            batch.steering_changed()
    change.builds = None
    return change


def test_changing_steering_between_steps_needs_no_rebuild(handles):
    handle = handles("gemma3")
    specs = _specs(handle)[:2]
    vector = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(5))
    change_static, change_dynamic = _resteer(vector, 4), _resteer(vector, 4)
    static_batch, static = _run(handle, "static", {0: [0, 1]}, specs, change_static)
    _, dynamic = _run(handle, "dynamic", {0: [0, 1]}, specs, change_dynamic)
    _, unchanged = _run(handle, "static", {0: [0, 1]}, specs)
    _same(static, dynamic)
    steered = [t.token_id for t in static[0].steered.tokens]
    before = [t.token_id for t in unchanged[0].steered.tokens]
    assert steered[:4] == before[:4] and steered != before  # the change took effect after step 3, not before
    assert change_static.builds == static_batch.static.builds  # no re-build since the change


def test_cpu_default_is_the_dynamic_path_and_says_why(handles, monkeypatch):
    monkeypatch.delenv(static_decode.ENV, raising=False)
    handle = handles("llama")
    path = DecodeBatch(handle).decode_path
    assert path["path"] == "dynamic" and path["reason"].startswith("cpu")
    monkeypatch.setenv(static_decode.ENV, "static")
    assert DecodeBatch(handle).decode_path["path"] == "static (eager)"
    monkeypatch.setenv(static_decode.ENV, "dynamic")
    assert DecodeBatch(handle, decode="auto").decode_path["path"] == "dynamic"
    with pytest.raises(static_decode.StaticDecodeError):
        DecodeBatch(handle, decode="fastest")


def test_unsupported_model_falls_back_even_when_static_is_asked_for():
    import transformers as tf

    from steer_ui.model.handle import from_model
    from steer_ui.tiny import byte_tokenizer, tiny_config

    config = tiny_config("gemma3")
    config.use_bidirectional_attention = True  # not a causal decoder: a static causal mask would be wrong
    model = tf.AutoModelForCausalLM.from_config(config)
    handle = from_model(model, byte_tokenizer())
    path = DecodeBatch(handle, decode="static").decode_path
    assert path["path"] == "dynamic" and "bidirectional" in path["reason"]


# ------------------------------------------------------------------ what a CUDA graph needs, checked on CPU
# Calls that read a device value on the host (a sync, invalid while a CUDA graph records), make data-dependent
# shapes, or build a tensor from Python values (a host-to-device copy, its value baked into the graph).
_HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere",
               "masked_select", "unique", "unique_consecutive", "repeat_interleave", "bincount", "cpu", "numpy",
               "tensor", "as_tensor", "from_numpy"}


class _NoHostReads(torch.overrides.TorchFunctionMode):
    """Raises on any call that a captured CUDA step cannot contain (see ``_HOST_READS``), boolean indexing and
    one-argument ``torch.where`` included."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else ()
        bool_index = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                         for i in (index if isinstance(index, tuple) else (index,)))
        if name in _HOST_READS or bool_index or (name == "where" and len(args) + len(kwargs or {}) == 1):
            raise AssertionError(f"the step to be captured calls {name}: a host read or copy inside a CUDA graph")
        return func(*args, **(kwargs or {}))


def test_the_host_read_guard_catches_what_a_capture_refuses():
    x = torch.ones(3)
    for read in (lambda: x[0].item(), lambda: bool(x.sum()), lambda: x[x > 0], lambda: torch.tensor([1.0]),
                 lambda: x.nonzero(), lambda: int(x[0]), lambda: torch.where(x > 0)):
        with pytest.raises(AssertionError, match="host read"), _NoHostReads():
            read()
    with _NoHostReads():  # what a step may do: device arithmetic, index ops with device indices, views
        torch.where(x > 0, x, -x).index_select(0, torch.zeros(1, dtype=torch.long)).add_(1)[None]


def _guarded_forward(monkeypatch, seen=None):
    """Every static step runs under :class:`_NoHostReads`; ``seen`` collects (builds, buffer addresses) per step."""
    real = static_decode.StaticDecode._forward

    def forward(self, every_block, pause=None):
        if seen is not None:
            seen.append((self.builds, _addresses(self)))
        with _NoHostReads():
            return real(self, every_block, pause)

    monkeypatch.setattr(static_decode.StaticDecode, "_forward", forward)


def _addresses(static) -> tuple:
    """The storage of every tensor the captured step reads or writes (a graph replays on these addresses)."""
    tensors = [static.valid, static.ids, static.positions, static._column, static._columns_index, static.ordinary]
    tensors += static._steering_buffers()
    for layer in static.cache.layers:
        assert layer.column is static._column  # one write index, moved in place
        tensors += [layer.keys, layer.values]
    return tuple(t.data_ptr() for t in tensors)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gemma2", "qwen2", "mistral", "gpt2", "phi3", "gpt_neox",
                                    "opt"])
def test_the_captured_step_makes_no_host_read(handles, family, monkeypatch):
    """The step as a graph records it (every block's hook) across joins, leaves and a running row moved right:
    no sync, no data-dependent shape, no tensor from Python values, in our code or in transformers' forward."""
    handle = handles(family)
    specs = _specs(handle)
    _guarded_forward(monkeypatch)
    batch, _ = _run(handle, "static", SCHEDULE, specs, every_block=True)  # the guard raises on a host read
    assert batch.static.builds >= 2  # a join that needed more slots re-built the store


def test_dynamic_rotary_embeddings_take_the_dynamic_path(monkeypatch):
    """transformers' "dynamic" RoPE compares the longest position with its cache on the host every pass: the step
    reads a device value (the guard sees it), so a capture would fail; such a model decodes on the dynamic path."""
    import transformers as tf

    from steer_ui.model.handle import from_model
    from steer_ui.tiny import byte_tokenizer, tiny_config

    config = tiny_config("llama")
    config.rope_parameters = dict(config.rope_parameters, rope_type="dynamic", factor=2.0)
    handle = from_model(tf.AutoModelForCausalLM.from_config(config), byte_tokenizer())
    path = DecodeBatch(handle, decode="static").decode_path
    assert path["path"] == "dynamic" and "rotary" in path["reason"] and "dynamic" in path["reason"]
    monkeypatch.setattr(static_decode, "unsupported", lambda _handle: None)  # forced onto the static step anyway
    _guarded_forward(monkeypatch)
    with pytest.raises(AssertionError, match="host read"):
        _run(handle, "static", {0: [0]}, _specs(handle), every_block=True)


def test_the_steps_buffers_keep_their_addresses_until_a_rebuild(handles, monkeypatch):
    """A graph reads its inputs where they were at capture: joins, leaves, compaction, steering changes and the
    per-head buffers must write in place, and anything that moves a buffer must count a re-build (a new capture)."""
    monkeypatch.setattr(static_decode, "_COLUMN_BUCKET", 8)  # compaction and growth several times
    handle = handles("llama")
    g = torch.Generator().manual_seed(1)
    shift = torch.randn(64, generator=g)
    specs = _specs(handle) + [("heads", [HeadSteer({1: shift}, alpha=4.0)], Sampling(max_new_tokens=5))]
    seen: list = []
    _guarded_forward(monkeypatch, seen)
    vector = torch.randn(handle.arch.hidden_size, generator=g)
    heads = len(specs) - 1
    batch, _ = _run(handle, "static", {0: [0], 3: [1], 6: [heads], 9: [2], 12: [4], 16: [3]}, specs,
                    _resteer(vector, 2), every_block=True)
    by_build: dict = {}
    for builds, addresses in seen:
        by_build.setdefault(builds, set()).add(addresses)
    assert all(len(addresses) == 1 for addresses in by_build.values()), by_build
    assert len(by_build) >= 3 and batch.static.heads is not None  # it grew, and took per-head buffers


def test_bfloat16_static_step_equals_dynamic_step():
    """The model's dtype in the buffers: bool and additive (eager) masks, α·v rows cast to bfloat16."""
    from steer_ui.model.handle import from_model
    from steer_ui.tiny import tiny_model

    for family, attention in (("llama", "sdpa"), ("gemma3", "eager")):
        model, tok = tiny_model(family, layers=6 if family == "gemma3" else 4)
        model.config.get_text_config()._attn_implementation = attention
        handle = from_model(model.to(torch.bfloat16), tok)
        assert handle.dtype == torch.bfloat16
        specs = _specs(handle)
        static_batch, static = _run(handle, "static", SCHEDULE, specs, every_block=True)
        _, dynamic = _run(handle, "dynamic", SCHEDULE, specs)
        assert static_batch.static.resid.dtype == torch.bfloat16
        for s_result, d_result in zip(static, dynamic):
            for side in ("unsteered", "steered"):
                s, d = getattr(s_result, side), getattr(d_result, side)
                assert [t.token_id for t in s.tokens] == [t.token_id for t in d.tokens], (family, side)
                # bfloat16 noise: the static step attends over more (masked) columns
                assert all(abs(math.exp(x.logprob) - math.exp(y.logprob)) < 1e-2 for x, y in zip(s.tokens, d.tokens))


# ------------------------------------------------------------------ CUDA only
def _cuda(family: str):
    from steer_ui.tiny import tiny_handle

    return tiny_handle(family, device="cuda", layers=6 if family == "gemma3" else 4)


@CUDA
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_cuda_graph_step_equals_dynamic_step_and_captures_once(family):
    """First against the eager static step on the same device (the same kernels on the same shapes, recorded or
    not: a difference there is the capture's), then against the dynamic step (whose attention spans differ)."""
    handle = _cuda(family)
    specs = _specs(handle)
    graph_batch, graph = _run(handle, "auto", SCHEDULE, specs)
    eager_batch, eager = _run(handle, "auto", SCHEDULE, specs, every_block=True, graph=False)
    _, dynamic = _run(handle, "dynamic", SCHEDULE, specs)
    path = graph_batch.decode_path
    assert path["path"] == "static+cuda-graph", path
    assert eager_batch.decode_path["path"] == "static (eager)" and eager_batch.static.captures == 0
    _same(graph, eager)
    _same(graph, dynamic)
    # at most one capture per store shape (two admits before the first step make two shapes and one capture)
    assert 1 <= graph_batch.static.captures <= graph_batch.static.builds


@CUDA
def test_cuda_graph_takes_new_steering_without_recapture():
    handle = _cuda("gemma3")
    specs = _specs(handle)[:2]
    vector = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(5)).cuda()
    change_graph, change_dynamic = _resteer(vector, 4), _resteer(vector, 4)
    graph_batch, graph = _run(handle, "auto", {0: [0, 1]}, specs, change_graph)
    _, dynamic = _run(handle, "dynamic", {0: [0, 1]}, specs, change_dynamic)
    _same(graph, dynamic)
    assert graph_batch.static.captures == 1


@CUDA
def test_cuda_graphs_captured_in_two_threads_beside_an_eager_pass_give_solo_results():
    """Two batches capturing at once (the engine's and a side_by_side call's) while a third thread runs the
    model eagerly with its own hook and reads its result on the host (a slider move)."""
    from steer_ui.model.capture import recording

    handle = _cuda("llama")
    specs = _specs(handle)[:2]
    _, solo = _run(handle, "dynamic", {0: [0, 1]}, specs)
    ids = torch.arange(1, 9, device="cuda").reshape(1, -1)
    with torch.inference_mode():
        expected = handle.model.base_model(input_ids=ids).last_hidden_state.cpu()
    results, errors, decoding = {}, [], threading.Event()

    def decode(name):
        try:
            results[name] = _run(handle, "auto", {0: [0, 1]}, specs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def slider():
        try:
            while not decoding.is_set():
                with torch.inference_mode(), recording(handle, [1]) as seen:
                    out = handle.model.base_model(input_ids=ids).last_hidden_state.cpu()
                assert torch.allclose(out, expected, atol=1e-5) and 1 in seen  # untouched by the captures
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(2)]
    beside = threading.Thread(target=slider)
    beside.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    decoding.set()
    beside.join(timeout=60)
    assert not errors, errors
    for batch, result in results.values():
        assert batch.decode_path["path"] == "static+cuda-graph", batch.decode_path
        _same(result, solo)


def test_bench_reports_both_paths_and_their_agreement(handles):
    from steer_ui.tools.measures import bench_decode_paths, seeded_steer

    handle = handles("llama")
    steer, _ = seeded_steer(handle, 1)
    out = bench_decode_paths(handle, steer, 4, 2, lambda _message: None)
    assert out["static_path"]["path"] == "static (eager)" and out["dynamic_path"]["path"] == "dynamic"
    assert out["static_tokens_equal"] is True
    assert len(out["static_over_dynamic_per_pair"]) == 2 and out["static_over_dynamic"] > 0
    assert out["static_path"]["builds"] == 1  # one batch per path, kept across runs: built once


def test_one_off_generations_take_the_dynamic_path_unless_asked(tiny, monkeypatch):
    # a batch made for one request and dropped should not capture a graph per call on CUDA
    from steer_ui.model import static_decode

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv(static_decode.ENV, raising=False)
    assert static_decode.one_off_setting(cuda) == "dynamic"
    assert static_decode.one_off_setting(cpu) == "auto"  # on a CPU nothing is captured: the fused step if it fits
    monkeypatch.setenv(static_decode.ENV, "static")
    assert static_decode.one_off_setting(cuda) == "static"
    monkeypatch.setenv(static_decode.ENV, "auto")
    assert static_decode.one_off_setting(cuda) == "dynamic"


def test_the_app_refuses_to_launch_with_an_unknown_decode_setting():
    # a typo in STEER_UI_DECODE must stop the launch with one line, not break every generation once serving
    import os
    import subprocess
    import sys
    from pathlib import Path

    from steer_ui.model import static_decode

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, **{static_decode.ENV: "statik"})
    proc = subprocess.run([sys.executable, str(root / "app.py"), "--model", "tiny:llama"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: {static_decode.ENV}: decode must be one of {static_decode.DECODE_SETTINGS}, got 'statik'"]
