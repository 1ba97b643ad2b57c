"""Interoperability with the real repeng and steering-vectors libraries (not re-implementations).

repeng 0.4.0 needs numpy<2 and steering-vectors 0.12.2 declares transformers<5,
while this project runs numpy 2 and transformers 5.  So the test builds its own
small virtual environment once (under the steer_ui cache, reused afterwards;
the first build takes a minute or two) with those libraries and transformers
4.57, and runs a short script there on the *same weights* as we load here:

* ``repeng.ControlVector.import_gguf`` reads our GGUF; the directions must be
  bit-identical to ours;
* ``steering_vectors.SteeringVector(**torch.load(path, weights_only=True))``
  applied with its own ``apply()``, and repeng's ``ControlModel.set_control``,
  must give the same next-token logits as our steering at the same α.

Tolerance: |Δlogit| ≤ 1e-4 (absolute) between the two environments.  The two
transformers versions run the same float32 CPU kernels and the observed
difference is 0.0; 1e-4 leaves room for kernel changes, and is well below the
size of the steering effect itself (asserted to be > 1e-2, i.e. 100× larger),
so a wrong layer or a wrong scale cannot pass.

The test skips only when pip cannot reach the package index.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from steer_ui.model.units import relative_scale
from steer_ui.formats import read_vector, write_vector
from steer_ui.model.hooks import steering
from steer_ui.model.loading import cache_root, embedded_gguf_path, gguf_cache_dir
from steer_ui.steering import build_steers
from steer_ui.vector import SteeringVector, random_vector

pytestmark = pytest.mark.integration

ATOL = 1e-4
MIN_EFFECT = 1e-2
VENV_PINS = ("torch==2.13.0", "numpy==1.26.4", "transformers==4.57.6", "repeng==0.4.0", "steering-vectors==0.12.2")
PIP_TIMEOUT_S = 1200

# Runs inside the interop venv.  Input: a JSON request file; output: a torch.save file of tensors.
VENV_SCRIPT = r'''
import json, sys
import torch
import repeng, steering_vectors
from repeng.control import model_layer_list
from transformers import AutoModelForCausalLM

req = json.load(open(sys.argv[1]))
results = {}
models = {}
for case in req["cases"]:
    cv = repeng.ControlVector.import_gguf(case["gguf"])
    out = {"repeng_model_type": cv.model_type,
           "repeng_directions": {str(k): torch.from_numpy(v.copy()) for k, v in cv.directions.items()}}
    if case["model_dir"] not in models:
        m = AutoModelForCausalLM.from_pretrained(case["model_dir"], dtype=torch.float32)
        models[case["model_dir"]] = m.eval()
    model = models[case["model_dir"]]
    ids = torch.tensor(case["ids"])
    with torch.no_grad():
        out["unsteered"] = model(ids).logits[:, -1]
        sv = steering_vectors.SteeringVector(**torch.load(case["steering_vectors"], weights_only=True))
        with sv.apply(model, multiplier=case["alpha"]):
            out["steering_vectors"] = model(ids).logits[:, -1]
        control = repeng.ControlModel(model, sorted(cv.directions))
        # repeng 0.4.0 wraps each block in a ControlModule that hides attributes transformers reads from
        # the block (gemma3 reads `attention_type`); copy it onto the wrapper.  A repeng limitation with
        # newer transformers, unrelated to the vector.
        for layer in model_layer_list(model):
            if hasattr(layer, "block") and hasattr(layer.block, "attention_type"):
                layer.attention_type = layer.block.attention_type
        control.set_control(cv, coeff=case["alpha"])
        out["repeng"] = control(ids).logits[:, -1]
        control.reset()
        out["after_reset"] = control(ids).logits[:, -1]
        control.unwrap()
    results[case["name"]] = out
torch.save(results, req["out"])
print("interop script done:", ", ".join(results))
'''


def _say(msg: str) -> None:
    # Seen even with pytest's capture on: the first venv build takes minutes, and CI logs should say why.
    print(f"[interop] {msg}", file=sys.__stderr__, flush=True)


def _pip_reaches_index(python: str) -> tuple[bool, str]:
    probe = subprocess.run([python, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                            "-d", str(cache_root() / "interop" / "probe"), "repeng==0.4.0"],
                           capture_output=True, text=True, timeout=300)
    return probe.returncode == 0, (probe.stdout + probe.stderr)[-600:]


def interop_python() -> str:
    """Path to the interop venv's python, building it on first use (cached under the steer_ui cache)."""
    key = hashlib.sha256(json.dumps([VENV_PINS, sys.version_info[:2]]).encode()).hexdigest()[:12]
    root = cache_root() / "interop"
    venv = root / f"venv-{key}"
    python = venv / "bin" / "python"
    ready = venv / ".steer_ui_ready"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once must not build the same venv
        if ready.exists():
            return str(python)
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
        _say(f"building the interop venv at {venv} (first time only; a minute or two): {' '.join(VENV_PINS)}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        try:
            install = subprocess.run(
                [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *VENV_PINS],
                capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.fail(f"pip install of {VENV_PINS} took over {PIP_TIMEOUT_S} s")
        if install.returncode != 0:
            reachable, probe_log = _pip_reaches_index(str(python))
            shutil.rmtree(venv, ignore_errors=True)
            if not reachable:
                pytest.skip(f"pip cannot reach the package index to install repeng/steering-vectors: {probe_log}")
            pytest.fail(f"pip install {' '.join(VENV_PINS)} failed:\n{(install.stdout + install.stderr)[-3000:]}")
        ready.write_text(" ".join(VENV_PINS))
        _say("interop venv ready")
    return str(python)


def run_in_venv(cases: list[dict], workdir: Path) -> dict:
    request = workdir / "request.json"
    out = workdir / "results.pt"
    script = workdir / "interop_script.py"
    script.write_text(VENV_SCRIPT)
    request.write_text(json.dumps({"cases": cases, "out": str(out)}))
    python = interop_python()
    _say(f"running repeng + steering-vectors on {', '.join(c['name'] for c in cases)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([python, str(script), str(request)], capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        pytest.fail(f"the interop script failed in the venv:\n{proc.stderr[-4000:]}")
    return torch.load(out, weights_only=True)


@contextmanager
def float_activations(handle):
    """Every int8 product on float32 activations while inside, then the loader's switches back.  These tests
    compare what a vector *means* in another library, to float noise; the default's int16 activations in the
    unembedding (issue #50) turn a last-bit difference between two hooks' sums into a rounding step (logits
    ~1e-3 apart, within the cost the model line shows), which would hide a real steering difference."""
    from steer_ui.model.int8 import int8_weights

    weights = int8_weights(handle.model)
    saved = [(w.w8a8, w.w8a16) for w in weights]
    for w in weights:
        w.w8a8 = w.w8a16 = False
    try:
        yield
    finally:
        for w, (a, b) in zip(weights, saved):
            w.w8a8, w.w8a16 = a, b


def our_logits(handle, vector, alpha: float, ids: list[list[int]], relative: bool = False):
    x = torch.tensor(ids, device=handle.input_device)
    with torch.no_grad(), float_activations(handle):
        unsteered = handle.model(x).logits[:, -1].float().cpu()
        # repeng and steering-vectors (and llama.cpp) steer every position, BOS included: so do we, on request
        with steering(handle, build_steers(handle, vector, alpha, relative=relative, special_tokens=True)):
            steered = handle.model(x).logits[:, -1].float().cpu()
    return unsteered, steered


@pytest.fixture(scope="module")
def interop(tmp_path_factory, tiny, gemma):
    """Our side and the real libraries' side for each case, computed once for the module."""
    work = tmp_path_factory.mktemp("interop")
    llama = tiny("llama")
    llama_dir = work / "tiny_llama"
    llama.model.save_pretrained(llama_dir)
    gemma_dir = gguf_cache_dir(embedded_gguf_path())
    assert gemma_dir.is_dir(), "the gemma fixture converts the embedded GGUF into this directory"
    prompt_ids = gemma.tokenizer(["The capital of France is"])["input_ids"]
    specs = [
        # name, handle, model dir, layers, alpha (raw units), ids
        ("tiny-llama", llama, llama_dir, (2,), 3.0, [[1, 40, 50, 60, 70, 80]]),
        ("tiny-llama-two-layers", llama, llama_dir, (1, 3), 2.0, [[1, 72, 101, 108, 108, 111]]),
        ("gemma-layer-6", gemma, gemma_dir, (6,), 40.0, prompt_ids),
        ("gemma-layer-15", gemma, gemma_dir, (15,), 80.0, prompt_ids),
    ]
    cases, ours = [], {}
    for name, handle, model_dir, layers, alpha, ids in specs:
        vector = SteeringVector(
            directions={layer: random_vector(handle.arch.hidden_size, layer, seed=11 + layer).direction()
                        for layer in layers},
            hidden_size=handle.arch.hidden_size, method="random", model_type=handle.model_type,
            model_id=handle.model_id, name=name,
        )
        gguf_path = write_vector(vector, "gguf", work / f"{name}.gguf")[0]
        sv_path = write_vector(vector, "steering-vectors", work / f"{name}.pt")[0]
        # What we steer with is what we read back from our own export (the app's import path).
        ours[name] = (vector, *our_logits(handle, read_vector(gguf_path, handle)[0], alpha, ids))
        cases.append({"name": name, "model_dir": str(model_dir), "gguf": str(gguf_path),
                      "steering_vectors": str(sv_path), "alpha": alpha, "ids": ids})
    theirs = run_in_venv(cases, work)
    return ours, theirs


CASES = ["tiny-llama", "tiny-llama-two-layers", "gemma-layer-6", "gemma-layer-15"]


@pytest.mark.parametrize("case", CASES)
def test_repeng_import_gguf_reads_our_file(interop, case):
    ours, theirs = interop
    vector = ours[case][0]
    got = theirs[case]
    assert got["repeng_model_type"] == vector.model_type
    assert sorted(int(k) for k in got["repeng_directions"]) == vector.layers
    for layer in vector.layers:
        theirs_dir = got["repeng_directions"][str(layer)]
        assert theirs_dir.dtype == torch.float32
        assert torch.equal(theirs_dir, vector.directions[layer])  # bit for bit


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("library", ["steering_vectors", "repeng"])
def test_same_next_token_logits_as_our_steering(interop, case, library):
    ours, theirs = interop
    _, unsteered, steered = ours[case]
    got = theirs[case]
    # Same weights, same unsteered logits in both environments: differences below are steering only.
    torch.testing.assert_close(got["unsteered"], unsteered, atol=ATOL, rtol=0)
    effect = (steered - unsteered).abs().max().item()
    assert effect > MIN_EFFECT, f"the vector barely changes the logits ({effect}); the comparison would be empty"
    torch.testing.assert_close(got[library], steered, atol=ATOL, rtol=0)
    torch.testing.assert_close(got["after_reset"], unsteered, atol=ATOL, rtol=0)


def _steering_vectors_module():
    """The real steering_vectors in this process: installed, or fetched with --no-deps into the cache.

    steering-vectors 0.12.2 declares transformers<5 but its hooking code works with transformers 5;
    `pip install --no-deps` puts it beside the project's own pins.
    """
    try:
        import steering_vectors
        return steering_vectors
    except ImportError:
        pass
    target = cache_root() / "interop" / "steering-vectors-0.12.2"
    if not (target / "steering_vectors").is_dir():
        _say(f"installing steering-vectors==0.12.2 --no-deps into {target}")
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                               "-q", "--target", str(target), "steering-vectors==0.12.2"],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            reachable, log = _pip_reaches_index(sys.executable)
            if not reachable:
                pytest.skip(f"pip cannot reach the package index to install steering-vectors: {log}")
            pytest.fail(f"pip install --no-deps steering-vectors==0.12.2 failed:\n{proc.stderr[-2000:]}")
    sys.path.insert(0, str(target))
    import steering_vectors
    return steering_vectors


def test_steering_vectors_in_process_relative_alpha(tmp_path, gemma):
    """Beside transformers 5: the steering-vectors file applied by the library gives our logits, and our
    relative α converts to their multiplier as α · n_L / ‖v‖ (the conversion docs/formats.md gives)."""
    sv = _steering_vectors_module()
    layer, alpha = 9, 0.6
    vector = random_vector(gemma.arch.hidden_size, layer, seed=5, model_type=gemma.model_type)
    vector = vector.with_direction(layer, vector.direction() * 3.7)  # not unit length: the norm matters
    path = write_vector(vector, "steering-vectors", tmp_path / "v.pt")[0]
    ids = gemma.tokenizer(["Paris is the capital of"])["input_ids"]
    unsteered, steered = our_logits(gemma, vector, alpha, ids, relative=True)
    multiplier = alpha * relative_scale(gemma, layer) / float(vector.direction().norm())
    loaded = sv.SteeringVector(**torch.load(path, weights_only=True))
    with torch.no_grad(), gemma.lock, float_activations(gemma), loaded.apply(gemma.model, multiplier=multiplier):
        theirs = gemma.model(torch.tensor(ids, device=gemma.input_device)).logits[:, -1].float().cpu()
    assert (steered - unsteered).abs().max().item() > MIN_EFFECT
    torch.testing.assert_close(theirs, steered, atol=ATOL, rtol=1e-5)
