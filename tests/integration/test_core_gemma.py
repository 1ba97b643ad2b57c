"""The core engine on the embedded Gemma 3 270M."""
import json
import subprocess
import sys

import pytest
import torch

from steer_ui.model.units import relative_scale
from steer_ui.model.analysis import next_token, sweep
from steer_ui.model.generation import Sampling, side_by_side
from steer_ui.model.hooks import Steer, hook_count
from steer_ui.steering import build_steers
from steer_ui.vector import random_vector

pytestmark = pytest.mark.integration
PROMPT = "The capital of France is Paris. The capital of Japan is"


def test_facts(gemma):
    facts = gemma.facts()
    assert facts["num_layers"] == 18 and facts["hidden_size"] == 640 and facts["vocab_size"] == 262144
    assert facts["tied_lm_head"] and facts["model_type"] == "gemma3_text"


def test_tokyo_is_top1(gemma):
    view = next_token(gemma, PROMPT, [], top_k=5)
    assert view.unsteered.token.iloc[0] == " Tokyo"
    assert view.unsteered.prob.iloc[0] == pytest.approx(0.81, abs=0.03)


def test_residual_norms_grow_across_layers(gemma):
    norms = gemma.layer_norms()
    assert len(norms) == 18
    assert norms[0] < 500 and norms[-1] > 20_000
    assert all(b > a for a, b in zip(norms[:-1], norms[1:]))


def test_alpha_zero_identical_and_large_alpha_changes(gemma):
    vec = random_vector(640, 6, seed=0)
    zero = side_by_side(gemma, PROMPT, build_steers(gemma, vec, 0.0, relative=True), Sampling(max_new_tokens=12))
    assert [t.token_id for t in zero.unsteered.tokens] == [t.token_id for t in zero.steered.tokens]
    assert zero.unsteered.text.strip().startswith("Tokyo")
    sampled = side_by_side(gemma, PROMPT, build_steers(gemma, vec, 0.0, relative=True),
                           Sampling(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=3))
    assert sampled.unsteered.text == sampled.steered.text
    big = side_by_side(gemma, PROMPT, build_steers(gemma, vec, 4.0, relative=True), Sampling(max_new_tokens=12))
    assert big.unsteered.text != big.steered.text
    assert any(abs(t.delta_logit) > 1 for t in big.steered.tokens)
    assert hook_count(gemma) == 0


def test_relative_alpha_scales_with_layer(gemma):
    """The same relative α perturbs an early and a late layer comparably; the same raw α does not."""
    kls_rel, kls_raw = [], []
    for layer in (2, 14):
        vec = random_vector(640, layer, seed=1)
        kls_rel.append(next_token(gemma, PROMPT, build_steers(gemma, vec, 0.5, relative=True)).kl)
        kls_raw.append(next_token(gemma, PROMPT, build_steers(gemma, vec, 500.0, relative=False)).kl)
    assert min(kls_rel) > 0.01
    assert kls_raw[0] > 10 * kls_raw[1]


def test_sweep_batched_on_gemma(gemma):
    vec = random_vector(640, 9, seed=2).direction()
    scale = relative_scale(gemma, 9)
    frame = sweep(gemma, PROMPT, vec, 9, [a * scale for a in (-1, 0, 1)], target=" Tokyo")
    assert frame.kl.iloc[1] == pytest.approx(0, abs=1e-5)
    assert frame.target_prob.iloc[1] == pytest.approx(0.81, abs=0.03)
    assert frame.kl.iloc[0] > 0 and frame.kl.iloc[2] > 0


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "steer_ui", *args, "--json"], capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


# two CLI processes each loading the embedded model (~45 s on two cores); the CLI's JSON is tested on a tiny
# model (tests/unit/test_cli.py) and the same numbers in-process above: `pytest -m slow`
@pytest.mark.slow
def test_cli_generate_and_next_token_json(tmp_path):
    rc, out, err = _cli("generate", "--prompt", PROMPT, "--random-vector", "0", "--layer", "6", "--alpha", "0",
                        "--relative", "--max-new-tokens", "6")
    assert rc == 0, err
    data = json.loads(out)
    assert data["unsteered"]["text"] == data["steered"]["text"]
    assert {"token", "logprob", "delta_logit", "direct_delta_logit"} <= set(data["steered"]["tokens"][0])
    vec = random_vector(640, 6, seed=0, model_id="embedded")
    path = vec.save(tmp_path / "v.safetensors")
    rc, out, err = _cli("next-token", "--prompt", PROMPT, "--vector", str(path), "--alpha", "1.5", "--relative",
                        "--top-k", "3")
    assert rc == 0, err
    data = json.loads(out)
    assert len(data["unsteered"]) == 3 and data["unsteered"][0]["token"] == " Tokyo"
    assert data["kl"] > 0 and data["max_abs_delta_logit"] > 0 and data["promoted"] and data["suppressed"]
