"""ITI's residual-stream export on tiny Llama (no post-attention norm) and tiny Gemma 3 (post-attention norm):
the stored error is what an independent computation finds, the export is no worse than W_O·shift, and every
format but native says it is approximate."""
from __future__ import annotations

import json

import pytest
import torch

from steer_ui.formats import export_notes, read_vector, write_vector
from steer_ui.methods import iti, train
from steer_ui.methods.common import SWEEP_PROMPTS
from steer_ui.model.capture import head_geometry, out_projection_weight
from steer_ui.model.hooks import HeadSteer, Steer, StepState, steering

from test_methods import separable


@pytest.fixture(scope="module")
def trained():
    from steer_ui.tiny import tiny_handle

    made = {}

    def make(family):
        if family not in made:
            handle = tiny_handle(family)
            made[family] = handle, train(handle, separable(), "iti", top_heads=4)[0]
        return made[family]
    return make


def _logp(handle, prompt, steers):
    """Next-token log-probabilities through the full model (logits head included), by hand."""
    ids = handle.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode(), steering(handle, steers, StepState(prompt_len=ids.shape[1])):
        logits = handle.model(input_ids=ids, use_cache=False).logits[0, -1].float()
    return logits.log_softmax(-1)


def _relative_error(handle, vector, alpha, directions):
    heads, shifts, num_heads = iti.shifts_of(vector)
    head_dim = head_geometry(handle)[1]
    head = [HeadSteer(iti.layer_shifts(heads, shifts, head_dim, num_heads), alpha, "all")]
    residual = [Steer(layer=l, vector=d, alpha=alpha, positions="all") for l, d in directions.items()]
    errors = []
    for prompt in SWEEP_PROMPTS:
        base, by_head, by_residual = (_logp(handle, prompt, s) for s in ([], head, residual))
        errors.append(float((by_residual - by_head).norm() / (by_head - base).norm()))
    return sum(errors) / len(errors)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_stored_export_error_matches_an_independent_measurement(trained, family):
    handle, vector = trained(family)
    info = vector.hyperparameters["residual_export"]
    assert info["approximate"] is True and info["alpha"] == vector.alpha_range[1]
    assert _relative_error(handle, vector, info["alpha"], vector.directions) == pytest.approx(
        info["relative_error"], rel=1e-3, abs=1e-4)
    # The naive export (W_O·shift at the block output), measured the same way, is what the vector says it is.
    heads, shifts, _ = iti.shifts_of(vector)
    head_dim = head_geometry(handle)[1]
    naive = {l: out_projection_weight(handle, l) @ v
             for l, v in iti.layer_shifts(heads, shifts, head_dim, head_geometry(handle)[0]).items()}
    assert _relative_error(handle, vector, info["alpha"], naive) == pytest.approx(
        info["output_projection_relative_error"], rel=1e-3, abs=1e-4)
    # Measuring the block's own response is never worse than adding W_O·shift after the block.
    assert info["relative_error"] <= info["output_projection_relative_error"] + 0.01


def test_llama_export_reproduces_the_head_intervention_within_five_percent(trained):
    # Without a post-attention norm, the only difference is the MLP of the steered block, averaged over tokens.
    handle, vector = trained("llama")
    assert vector.hyperparameters["residual_export"]["relative_error"] < 0.05


def test_gemma_post_attention_norm_makes_the_export_approximate_and_it_says_so(trained):
    handle, vector = trained("gemma3")
    info = vector.hyperparameters["residual_export"]
    # The norm rescales the shifted attention output per token: far from additive at ITI's strengths.
    assert info["output_projection_relative_error"] > 0.2
    note = iti.export_note(vector)
    assert note.startswith("approximate:") and f"{100 * info['relative_error']:.0f}%" in note
    assert export_notes(vector, "steering-vectors") == [note] and export_notes(vector, "native") == []


def test_block_output_equivalent_is_the_blocks_own_response(trained):
    handle, vector = trained("gemma3")
    heads, shifts, num_heads = iti.shifts_of(vector)
    head_dim = head_geometry(handle)[1]
    layer = vector.layers[0]
    one = [(l, h) for l, h in heads if l == layer]
    one_shifts = torch.stack([s for (l, _h), s in zip(heads, shifts) if l == layer])
    got = iti.block_output_equivalent(handle, one, one_shifts, head_dim, 3.0, prompts=["a b c d"])[layer]
    # By hand: the block output with and without the shift, first token left out, mean over the rest, per unit α.
    ids = handle.tokenizer("a b c d", return_tensors="pt").input_ids
    outs = []
    for alpha in (0.0, 3.0):
        seen = {}
        hook = handle.arch.layers[layer].register_forward_hook(
            lambda _m, _i, o: seen.__setitem__("h", (o[0] if isinstance(o, tuple) else o).detach().clone()))
        try:
            steer = HeadSteer(iti.layer_shifts(one, one_shifts, head_dim, num_heads), alpha, "all")
            with torch.inference_mode(), steering(handle, [steer], StepState()):
                handle.model(input_ids=ids, use_cache=False)
        finally:
            hook.remove()
        outs.append(seen["h"][0])
    torch.testing.assert_close(got, ((outs[1] - outs[0]) / 3.0)[1:].mean(0), atol=1e-4, rtol=1e-4)


def test_export_metadata_and_cli_message_carry_the_error(trained, tmp_path, capsys):
    from steer_ui.cli import main

    _, vector = trained("gemma3")
    native = vector.save(tmp_path / "iti.safetensors")
    written = write_vector(vector, "steering-vectors", tmp_path / "iti.pt")
    sidecar = json.loads(next(p for p in written if p.name.endswith(".steer_ui.json")).read_text())
    assert sidecar["steer_ui"]["hyperparameters"]["residual_export"]["relative_error"] == pytest.approx(
        vector.hyperparameters["residual_export"]["relative_error"])
    back, _ = read_vector(tmp_path / "iti.pt")
    assert back.hyperparameters["residual_export"] == vector.hyperparameters["residual_export"]
    assert main(["export", "--vector", str(native), "--format", "steering-vectors", "--out",
                 str(tmp_path / "out.pt"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(w.startswith("approximate:") for w in out["warnings"])
    assert main(["export", "--vector", str(native), "--format", "native", "--out",
                 str(tmp_path / "out.safetensors"), "--json"]) == 0
    assert not any("approximate" in w for w in json.loads(capsys.readouterr().out)["warnings"])
