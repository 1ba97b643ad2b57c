"""The per-token direct Δlogit of a steered generation is the exact skip-connection effect.

Direct Δlogit of token t = logit_t(final_norm(h + Σ mask·α·v)) − logit_t(final_norm(h)), with h the
counterfactual row's (unsteered model on the steered text) residual before the final norm.  The models
here get a final norm with a non-trivial gain and, Gemma-like, a small logit soft-cap, so a formula
that skips either (the old W_U[t]·α·v) fails these checks.
"""
import pytest
import torch
from transformers import AutoModelForCausalLM

from steer_ui.model.generation import Sampling, side_by_side
from steer_ui.model.hooks import Steer
from steer_ui.model.int8 import quantise_model
from steer_ui.model.loading import from_model
from steer_ui.tiny import byte_tokenizer, tiny_config

PROMPT = "Hello there"
# family -> final-logit soft-cap (Gemma 2 and 3 read `final_logit_softcapping` from their config)
CASES = {"llama": None, "gemma3": 0.5, "gemma2": 0.5}


def _handle(family: str, softcap: float | None, weights: str = "float32"):
    config = tiny_config(family)
    if softcap is not None:
        config.final_logit_softcapping = softcap
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    handle = from_model(model, byte_tokenizer(), model_id=f"tiny:{family}")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a gain far from 1 (and different per dimension), so skipping the norm shows
        handle.arch.final_norm.weight.copy_(torch.rand(config.hidden_size, generator=gen) * 3 + 0.5)
    if weights == "int8":  # issue #37: the Δlogit shown is exact for the model as loaded, in every precision
        quantise_model(model)
        handle = from_model(model, byte_tokenizer(), model_id=f"tiny:{family} int8")
    return handle


@pytest.fixture(scope="module")
def handles():
    made = {}

    def make(family, weights="float32"):
        if (family, weights) not in made:
            made[family, weights] = _handle(family, CASES[family], weights)
        return made[family, weights]

    return make


def _vector(seed=2, hidden=64):
    return torch.randn(hidden, generator=torch.Generator().manual_seed(seed))


def _final_residual(handle, ids: list[int]) -> torch.Tensor:
    """The unsteered model's residual entering the final norm at the last position (HF forward + a hook)."""
    got = {}
    hook = handle.arch.final_norm.register_forward_pre_hook(lambda _m, args: got.__setitem__("h", args[0]))
    try:
        with torch.no_grad():
            handle.model(torch.tensor([ids]), use_cache=False)
    finally:
        hook.remove()
    return got["h"][0, -1]


def _logit(handle, residual: torch.Tensor, token: int) -> float:
    """Token ``token``'s logit from a pre-norm residual: the model's norm and lm_head, then the config's soft-cap."""
    with torch.no_grad():
        z = handle.model.lm_head(handle.arch.final_norm(residual))[token]
    cap = getattr(handle.model.config, "final_logit_softcapping", None)
    return float(torch.tanh(z / cap) * cap) if cap else float(z)


def _close(a, b, rel=0.01, eps=1e-5):
    return abs(a - b) <= rel * max(abs(a), abs(b)) + eps


@pytest.mark.parametrize("weights", ["float32", "int8"])
@pytest.mark.parametrize("family", list(CASES))
def test_at_the_last_block_direct_equals_actual(handles, family, weights):
    handle = handles(family, weights)
    v = _vector()
    last = handle.arch.num_layers - 1
    result = side_by_side(handle, PROMPT, [Steer(layer=last, vector=v, alpha=40.0)], Sampling(max_new_tokens=8))
    tokens = result.steered.tokens
    assert len(tokens) >= 4
    for t in tokens:
        assert abs(t.delta_logit) > 1e-3  # the steering does something to check against
        assert _close(t.direct_delta_logit, t.delta_logit), (t.token, t.direct_delta_logit, t.delta_logit)
    # the old W_U[t]·α·v skipped the norm's gain and 1/RMS (and the soft-cap): it misses the actual Δlogit
    old = [40.0 * float(handle.arch.unembedding[t.token_id] @ v) for t in tokens]
    assert any(not _close(o, t.delta_logit, rel=0.2) for o, t in zip(old, tokens))


def test_input_dependent_steer_at_the_last_block_uses_its_own_vector(handles):
    handle = handles("gemma3")
    w = _vector(3, 64 * 64).reshape(64, 64)
    last = handle.arch.num_layers - 1
    steer = Steer(layer=last, fn=lambda ctx: torch.tanh(ctx @ w) * 30.0, context_layer=1, alpha=1.0)
    result = side_by_side(handle, PROMPT, [steer], Sampling(max_new_tokens=6))
    for t in result.steered.tokens:
        assert abs(t.delta_logit) > 1e-3
        assert _close(t.direct_delta_logit, t.delta_logit), (t.token, t.direct_delta_logit, t.delta_logit)


@pytest.mark.parametrize("weights", ["float32", "int8"])
@pytest.mark.parametrize("family", list(CASES))
def test_at_an_earlier_block_direct_is_the_final_residual_pushed_through_norm_and_unembedding(handles, family,
                                                                                              weights):
    """Independently: h from the unsteered model on the steered prefix, then logit(norm(h + α·v)) − logit(norm(h))."""
    handle = handles(family, weights)
    v, alpha = _vector(), 40.0
    result = side_by_side(handle, PROMPT, [Steer(layer=1, vector=v, alpha=alpha)], Sampling(max_new_tokens=6))
    prefix = handle.tokenizer(PROMPT).input_ids
    for t in result.steered.tokens:
        h = _final_residual(handle, prefix)
        expected = _logit(handle, h + alpha * v, t.token_id) - _logit(handle, h, t.token_id)
        assert _close(t.direct_delta_logit, expected), (t.token, t.direct_delta_logit, expected)
        prefix = prefix + [t.token_id]


def test_small_push_direct_is_the_directional_derivative(handles):
    """Finite difference: direct(ε)/ε tends to d/dε logit(final_norm(h + ε·v)) at 0 (autograd, soft-cap included)."""
    handle = handles("gemma3")
    v, eps = _vector(), 1e-2
    result = side_by_side(handle, PROMPT, [Steer(layer=2, vector=v, alpha=eps)], Sampling(max_new_tokens=3))
    prefix = handle.tokenizer(PROMPT).input_ids
    cap = handle.model.config.final_logit_softcapping
    for t in result.steered.tokens:
        h = _final_residual(handle, prefix)

        def logit(x, token=t.token_id):
            z = handle.model.lm_head(handle.arch.final_norm(x))[token]
            return torch.tanh(z / cap) * cap

        with torch.enable_grad():
            _, slope = torch.autograd.functional.jvp(logit, (h,), (v,))
        assert _close(t.direct_delta_logit / eps, float(slope), rel=0.01, eps=1e-3), (t.direct_delta_logit, slope)
        prefix = prefix + [t.token_id]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_position_masks(handles, family):
    """Token 0 is predicted at the last prompt position, every later one at a generated position."""
    handle = handles(family)
    v = _vector()
    last = handle.arch.num_layers - 1
    prompt_only = side_by_side(handle, PROMPT, [Steer(layer=1, vector=v, alpha=40.0, positions="prompt")],
                               Sampling(max_new_tokens=6)).steered.tokens
    assert prompt_only[0].direct_delta_logit != 0.0
    assert all(t.direct_delta_logit == 0.0 for t in prompt_only[1:])
    generated_only = side_by_side(handle, PROMPT, [Steer(layer=last, vector=v, alpha=40.0, positions="generated")],
                                  Sampling(max_new_tokens=6)).steered.tokens
    assert generated_only[0].direct_delta_logit == 0.0 and abs(generated_only[0].delta_logit) < 1e-5
    for t in generated_only[1:]:
        assert _close(t.direct_delta_logit, t.delta_logit)
