import pytest
import torch

from steer_ui.model.generation import GenerationError, Sampling, side_by_side, stream_side_by_side
from steer_ui.model.hooks import Steer, hook_count, steering
from steer_ui.model.sampler import noise_generator, process_logits
from steer_ui.tiny import FAMILIES


def ids_of(side):
    return [t.token_id for t in side.tokens]


@pytest.mark.parametrize("family", FAMILIES)
def test_unsteered_row_matches_hf_generate(tiny, family):
    handle = tiny(family)
    steer = Steer(layer=1, vector=torch.randn(64), alpha=4.0)
    result = side_by_side(handle, "Hello there", [steer], Sampling(max_new_tokens=8))
    enc = handle.tokenizer("Hello there", return_tensors="pt")
    ref = handle.model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=0)[0, enc.input_ids.shape[1]:]
    ref = [int(t) for t in ref if int(t) != handle.tokenizer.eos_token_id]
    assert ids_of(result.unsteered)[: len(ref)] == ref


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_alpha_zero_sides_identical(tiny, temperature):
    handle = tiny("gemma3")
    steer = Steer(layer=2, vector=torch.randn(64) * 50, alpha=0.0)
    s = Sampling(max_new_tokens=16, temperature=temperature, top_k=50, top_p=0.95, seed=7)
    result = side_by_side(handle, "Once upon", [steer], s)
    assert ids_of(result.unsteered) == ids_of(result.steered)
    assert result.unsteered.text == result.steered.text
    assert all(abs(t.delta_logit) < 1e-4 for t in result.steered.tokens)


def test_a_sampled_first_token_is_the_gumbel_max_of_the_seeded_stream_on_the_logits_device(tiny):
    """The first sampled token is argmax(processed logits + Gumbel noise drawn from the request's seeded stream)."""
    handle = tiny("llama")
    s = Sampling(max_new_tokens=1, temperature=1.3, top_k=40, seed=5, stop_at_eos=False)
    result = side_by_side(handle, "Hello there", [], s)
    with torch.no_grad():
        logits = handle.model(**handle.tokenizer("Hello there", return_tensors="pt")).logits[:, -1].float()
    u = torch.rand(logits.shape[-1], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    expected = int((process_logits(logits, None, s).double() - torch.log(-torch.log(u))).argmax())
    assert ids_of(result.unsteered) == [expected] == ids_of(result.steered)


@pytest.mark.parametrize("device, drawn_on", [("cpu", "cpu"), ("mps", "cpu"), ("meta", "cpu")] +
                         ([("cuda", "cuda")] if torch.cuda.is_available() else []))
def test_the_noise_stream_lives_where_the_logits_are_when_that_device_draws_float64(device, drawn_on):
    assert noise_generator(3, device).device.type == drawn_on


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # gemma2: final norm with a gain and a logit soft-cap
def test_a_delta_logit_limit_holds_at_every_steered_step_as_a_direct_computation_says(tiny, family):
    """Each steered step: max centred |Δlogit| against the unsteered model on the same tokens, and the token
    chosen from unsteered + min(1, B / max)·Δ, recomputed here with plain forward passes."""
    handle = tiny(family)
    steer = Steer(layer=1, vector=torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(1)),
                  alpha=12.0)
    limit = 0.4
    result = side_by_side(handle, "Hello there", [steer],
                          Sampling(max_new_tokens=8, stop_at_eos=False, max_delta_logit=limit))
    prompt = handle.tokenizer("Hello there", return_tensors="pt").input_ids[0].tolist()
    tokens = result.steered.tokens
    bit = 0
    for t, rec in enumerate(tokens):
        ids = torch.tensor([prompt + [x.token_id for x in tokens[:t]]])
        with torch.no_grad():
            base = handle.model(ids).logits[0, -1].float()
            with steering(handle, [steer]):
                steered = handle.model(ids).logits[0, -1].float()
        delta = steered - base
        worst = float((delta - delta.mean()).abs().max())
        kept = min(1.0, limit / worst)
        assert rec.max_delta_logit == pytest.approx(worst, rel=1e-3)
        assert rec.kept == pytest.approx(kept, rel=1e-3)
        assert rec.token_id == int((base + kept * delta).argmax())
        assert rec.delta_logit == pytest.approx(kept * float(delta[rec.token_id]), abs=1e-3)
        bit += kept < 1
    assert bit, "the limit never bit: the test would pass without it"
    # no limit: the steered tokens carry no such fields, and the limit is refused outside its range
    free = side_by_side(handle, "Hello there", [steer], Sampling(max_new_tokens=2))
    assert all(r.max_delta_logit is None and "kept" not in r.as_dict() for r in free.steered.tokens)
    for bad in (-1.0, float("nan"), float("inf"), 1e6):
        with pytest.raises(GenerationError, match="Δlogit limit"):
            Sampling(max_delta_logit=bad).validate()


def test_a_delta_logit_limit_that_does_not_bite_leaves_the_generation_bit_for_bit():
    """Where every step stays under the limit, the steered side is the unlimited one exactly: same tokens,
    same log-probabilities and Δlogits to the last bit (sampled, so the logits' every bit reaches the draw).
    On the fused CPU step, which computes each row alone: the limit adds a counterfactual row to the batch, and
    torch's float32 products may round a row differently beside another (MKL did on an Intel Xeon)."""
    from steer_ui.model.fused_decode import unsupported
    from steer_ui.model.loading import load_model

    handle = load_model("tiny:gemma3", device="cpu", weights="int8")
    if unsupported(handle):
        pytest.skip(f"no fused step here: {unsupported(handle)}")
    steer = Steer(layer=1, vector=torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(1)),
                  alpha=12.0)
    settings = dict(max_new_tokens=8, stop_at_eos=False, temperature=0.8, seed=3)
    free = side_by_side(handle, "Hello there", [steer], Sampling(**settings)).steered.tokens
    loose = side_by_side(handle, "Hello there", [steer], Sampling(**settings, max_delta_logit=1000)).steered.tokens
    assert all(t.kept == 1.0 and t.max_delta_logit < 1000 for t in loose)
    assert [(t.token_id, t.logprob, t.delta_logit) for t in loose] == \
        [(t.token_id, t.logprob, t.delta_logit) for t in free]


def test_large_alpha_changes_output_and_records_delta(tiny):
    handle = tiny("llama")
    v = torch.randn(64)
    result = side_by_side(handle, "Hello", [Steer(layer=1, vector=v, alpha=20.0)], Sampling(max_new_tokens=8))
    assert ids_of(result.unsteered) != ids_of(result.steered)
    first = result.steered.tokens[0]
    # Δlogit of the first steered token = steered logit − unsteered logit on the same prefix (the prompt).
    from steer_ui.model.analysis import naive_logits
    steered = naive_logits(handle, "Hello", [Steer(layer=1, vector=v, alpha=20.0)])[0]
    plain = naive_logits(handle, "Hello", [])[0]
    assert first.delta_logit == pytest.approx(float(steered[first.token_id] - plain[first.token_id]), abs=1e-4)
    # direct Δlogit: the push α·v added to the unsteered final residual and taken through the final norm and
    # the unembedding (it used to be W_U[t]·α·v, which skipped the norm; tests/unit/test_direct_delta_logit.py
    # checks it in detail)
    from steer_ui.model.capture import capture
    ids = handle.tokenizer("Hello", return_tensors="pt").input_ids
    last = handle.arch.num_layers - 1
    h = capture(handle, ids, [last])[last][0, -1]
    arch = handle.arch
    token = torch.tensor([first.token_id])
    direct = arch.logits_at(arch.final_hidden(h + 20.0 * v), token) - arch.logits_at(arch.final_hidden(h), token)
    assert first.direct_delta_logit == pytest.approx(float(direct), rel=1e-4, abs=1e-4)
    assert first.alternatives and abs(sum(p for _, p in first.alternatives)) <= 1.0


def test_counterfactual_delta_on_later_tokens(tiny):
    """Δlogit at step k uses the unsteered model on the *steered* prefix."""
    from steer_ui.model.hooks import StepState, steering
    from steer_ui.model.generation import encode_prompt

    handle = tiny("qwen2")
    v = torch.randn(64, generator=torch.Generator().manual_seed(7))
    steer = Steer(layer=0, vector=v, alpha=10.0)
    result = side_by_side(handle, "abc", [steer], Sampling(max_new_tokens=5))
    tok = result.steered.tokens[3]
    # the prefix as ids, not re-encoded text: a byte token that is not UTF-8 alone does not round-trip through text
    ids = torch.cat([encode_prompt(handle, "abc")[0], torch.tensor(ids_of(result.steered)[:3])])[None]

    def last_logits(steers):
        with torch.inference_mode(), steering(handle, steers, StepState(prompt_len=None)):
            return handle.model(input_ids=ids, use_cache=False).logits[0, -1].float()

    steered, plain = last_logits([Steer(layer=0, vector=v, alpha=10.0)]), last_logits([])
    # prompt positions are steered in both, so compare to full-steer reference
    assert tok.delta_logit == pytest.approx(float(steered[tok.token_id] - plain[tok.token_id]), abs=1e-3)


def test_streaming_yields_each_token_for_both_sides(tiny):
    handle = tiny("gpt2")
    events = list(stream_side_by_side(handle, "stream", [], Sampling(max_new_tokens=5, stop_at_eos=False)))
    assert len(events) == 5
    assert [e.unsteered.token_id for e in events] == ids_of(events[-1].result.unsteered)
    assert events[-1].result.unsteered.finished == "length"


def test_stop_strings_and_length(tiny):
    handle = tiny("llama")
    full = side_by_side(handle, "abc", [], Sampling(max_new_tokens=12, stop_at_eos=False))
    text = full.unsteered.text
    stop = text[3:5]
    assert stop
    cut = side_by_side(handle, "abc", [], Sampling(max_new_tokens=12, stop=[stop], stop_at_eos=False))
    assert cut.unsteered.finished == "stop"
    assert cut.unsteered.text == text[: text.index(stop)]


def test_seed_reproducible_and_matters(tiny):
    handle = tiny("llama")
    a = side_by_side(handle, "x", [], Sampling(max_new_tokens=10, temperature=1.0, seed=1))
    b = side_by_side(handle, "x", [], Sampling(max_new_tokens=10, temperature=1.0, seed=1))
    c = side_by_side(handle, "x", [], Sampling(max_new_tokens=10, temperature=1.0, seed=2))
    assert ids_of(a.unsteered) == ids_of(b.unsteered)
    assert ids_of(a.unsteered) != ids_of(c.unsteered)


def test_top_k_top_p_and_repetition_penalty():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    s = Sampling(temperature=1.0, top_k=2)
    out = process_logits(logits, None, s)
    assert torch.isinf(out[0, 2:]).all() and torch.isfinite(out[0, :2]).all()
    p = logits.softmax(-1)[0]
    s = Sampling(temperature=1.0, top_p=float(p[0] + p[1] * 0.5))
    out = process_logits(logits, None, s)
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()  # the token crossing top_p is kept
    s = Sampling(temperature=0.0, repetition_penalty=2.0)
    out = process_logits(logits, torch.tensor([[0, 4]]), s)
    assert out[0, 0] == 1.5 and out[0, 4] == -2.0 and out[0, 1] == 2.0


def test_bad_requests(tiny):
    handle = tiny("llama")
    with pytest.raises(GenerationError, match="empty"):
        side_by_side(handle, "   ", [], Sampling())
    with pytest.raises(GenerationError, match="temperature"):
        side_by_side(handle, "x", [], Sampling(temperature=float("nan")))
    with pytest.raises(GenerationError, match="top-p"):
        side_by_side(handle, "x", [], Sampling(top_p=0))
    assert hook_count(handle) == 0


@pytest.mark.parametrize("temperature", [1e-38, 1e-300, 5e-324, 9.9e-4])
def test_a_temperature_too_small_to_divide_by_decodes_greedily(tiny, temperature):
    """T -> 0 is greedy; 30 logits over 1e-38 are infinite in float32, which gave an empty answer (a hostile probe)."""
    handle = tiny("llama")
    steers = [Steer(layer=1, vector=torch.ones(handle.arch.hidden_size), alpha=0.5)]
    tiny_t = side_by_side(handle, "The weather", steers, Sampling(max_new_tokens=6, temperature=temperature,
                                                                  stop_at_eos=False))
    greedy = side_by_side(handle, "The weather", steers, Sampling(max_new_tokens=6, stop_at_eos=False))
    for side in ("unsteered", "steered"):
        got, want = getattr(tiny_t, side).tokens, getattr(greedy, side).tokens
        assert len(got) == 6 and [t.token_id for t in got] == [t.token_id for t in want]
    assert Sampling(temperature=1e-3).temperature == 1e-3  # from here on it samples
    with pytest.raises(GenerationError):
        Sampling(temperature=float("nan")).validate()
