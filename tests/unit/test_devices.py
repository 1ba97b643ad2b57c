"""Every feature on every device: each CLI command on a tiny model with ``--device cpu``, and ``cuda`` where a GPU is.

The same code paths run on both; the CUDA runs are what catch a tensor made
on the wrong device (they are skipped on a machine without a GPU).  Beside
them, a scan of the method and model code for device names written into it:
every tensor those packages make should follow the model's device, and the
few places that move results to the host on purpose are listed with why.
"""
from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest
import torch

from steer_ui import concepts
from steer_ui.cli import main
from steer_ui.model.loading import load_model

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ROOT / "assets" / "datasets"
MODEL = "tiny:llama"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


def run(capsys, *argv) -> dict:
    code = main([str(a) for a in argv] + ["--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    return out


def _subset(source: Path, target: Path, keep) -> Path:
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(target, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(keep(rows))
    return target


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Small slices of the bundled datasets (whole groups, so group splits still work), and labelled answers."""
    tmp = tmp_path_factory.mktemp("device-data")
    groups = ("France", "Germany", "Italy", "Spain", "Japan", "Egypt")
    answers = tmp / "answers.csv"
    lines = ["question,answer,label"]
    for i in range(10):
        lines += [f"What colour is thing {i}?,It is red {i},true", f"What colour is thing {i}?,It is blue {i},false"]
    answers.write_text("\n".join(lines) + "\n")
    return {
        "statements": _subset(DATASETS / "capitals_statements.csv", tmp / "statements.csv",
                              lambda rows: [r for r in rows if r["group"] in groups]),
        "pairs": _subset(DATASETS / "capitals_pairs.csv", tmp / "pairs.csv",
                         lambda rows: [r for r in rows if r["group"] in groups]),
        "answers": answers,
    }


# method -> (dataset, extra flags that keep it quick on a tiny model)
TRAIN = {
    "mean-diff": ("statements", ["--layer", "2"]),
    "probe": ("statements", ["--layer", "2"]),
    "pca": ("pairs", ["--layer", "2"]),
    "iti": ("statements", ["--top-heads", "2"]),  # picks its heads over every layer
    "tsv": ("answers", ["--layer", "2", "--exemplars", "6", "--epochs", "1"]),
    "l2s": ("pairs", ["--layer", "2", "--epochs", "2", "--hidden", "16", "--context-layer", "1", "--eval-limit", "2"]),
}


@pytest.mark.parametrize("device", DEVICES)
def test_load_and_info(capsys, device):
    handle = load_model(MODEL, device=device)
    assert handle.device.type == device
    assert all(p.device.type == device for p in handle.model.parameters())
    # the CLI reports the device the model sits on in every command that loads it
    out = run(capsys, "next-token", "--model", MODEL, "--device", device, "--prompt", "hi", "--random-vector", "1",
              "--alpha", "4")
    assert len(out["steered"]) == 10 and out["kl"] >= 0


@pytest.mark.parametrize("device", DEVICES)
def test_probe_layers(capsys, device, data):
    out = run(capsys, "probe-layers", "--model", MODEL, "--device", device, "--data", data["statements"])
    assert len(out["layers"]) == 4 and all(0.0 <= row["accuracy"] <= 1.0 for row in out["layers"])


@pytest.mark.parametrize("method", list(TRAIN))
@pytest.mark.parametrize("device", DEVICES)
def test_train_every_method(capsys, tmp_path, device, method, data):
    dataset, flags = TRAIN[method]
    out_file = tmp_path / f"{method}.safetensors"
    out = run(capsys, "train", "--method", method, "--model", MODEL, "--device", device, "--data", data[dataset],
              *flags, "--out", out_file)
    assert out["method"] == method and out_file.is_file()
    # the saved vector steers on the same device
    steered = run(capsys, "next-token", "--model", MODEL, "--device", device, "--prompt", "The capital of",
                  "--vector", out_file, "--alpha", "2")
    assert all(0.0 <= row["prob"] <= 1.0 for row in steered["steered"])


@pytest.mark.parametrize("method", list(TRAIN))
def test_train_every_method_with_int8_weights(capsys, tmp_path, method, data):
    """Issue #37: every method trains on an int8 model (gradients through the blocks, as TSV and L2S take them,
    use the dequantised float32 weights) and its vector steers it."""
    dataset, flags = TRAIN[method]
    out_file = tmp_path / f"{method}.safetensors"
    out = run(capsys, "train", "--method", method, "--model", MODEL, "--device", "cpu", "--weights", "int8",
              "--data", data[dataset], *flags, "--out", out_file)
    assert out["method"] == method and out_file.is_file()
    steered = run(capsys, "next-token", "--model", MODEL, "--weights", "int8", "--prompt", "The capital of",
                  "--vector", out_file, "--alpha", "2")
    assert all(0.0 <= row["prob"] <= 1.0 for row in steered["steered"])


@pytest.mark.parametrize("device", DEVICES)
def test_detect_with_a_tsv_vector(capsys, tmp_path, device, data):
    vec = tmp_path / "tsv.safetensors"
    run(capsys, "train", "--method", "tsv", "--model", MODEL, "--device", device, "--data", data["answers"],
        "--layer", "2", "--exemplars", "6", "--epochs", "1", "--out", vec)
    out = run(capsys, "detect", "--model", MODEL, "--device", device, "--vector", vec, "--data", data["answers"])
    assert out["rows"] == 20 and all(0.0 <= row["score"] <= 1.0 for row in out["scores"])
    assert 0.0 <= out["auroc"] <= 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_next_token_sweep_and_generate(capsys, device):
    common = ["--model", MODEL, "--device", device, "--prompt", "Once upon", "--random-vector", "2"]
    sweep = run(capsys, "sweep", *common, "--alphas=-2,0,2")
    assert [row["alpha_requested"] for row in sweep["rows"]] == [-2.0, 0.0, 2.0]
    assert abs(sweep["rows"][1]["kl"]) < 1e-5  # α = 0 is the unsteered model
    out = run(capsys, "generate", *common, "--alpha", "3", "--max-new-tokens", "5")
    assert out["unsteered"]["text"] is not None and len(out["steered"]["tokens"]) <= 5
    relative = run(capsys, "next-token", *common, "--alpha", "0.5", "--relative")
    assert relative["kl"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_concepts(device):
    handle = load_model(MODEL, device=device)
    prompt = "The capital of France is"
    assert concepts.row_norms(handle).stats["rows"] == handle.arch.vocab_size
    assert len(concepts.sampling_filters(handle, prompt, temperature=0.7, top_k=5).frame) > 0
    assert concepts.sample_many(handle, prompt, n=5, seed=1, temperature=0.8)["count"].sum() == 5
    summary, _steps = concepts.time_cache(handle, n_tokens=3, prompt=prompt)
    assert summary["same_tokens"]
    assert concepts.measured_cache(handle, prompt)["measured_bytes"] > 0
    demo = concepts.explode(handle, prompt, layer=3, alpha=30.0, token=77, max_new_tokens=3)
    concepts.fix_explosion(handle, demo, max_change=0.3, steps=5, prompts=[prompt])


@pytest.mark.parametrize("device", DEVICES)
def test_export_and_import(capsys, tmp_path, device, data):
    vec = tmp_path / "md.safetensors"
    run(capsys, "train", "--method", "mean-diff", "--model", MODEL, "--device", device, "--data",
        data["statements"], "--layer", "2", "--out", vec)
    exported = run(capsys, "export", "--model", MODEL, "--device", device, "--vector", vec, "--format",
                   "steering-vectors", "--out", tmp_path / "sv.pt")
    back = run(capsys, "import", "--model", MODEL, "--device", device, "--in", exported["out"][0], "--out",
               tmp_path / "back.safetensors")
    assert back["layers"] == [2] or back.get("layer") == 2


# ------------------------------------------------------------ no device written into the code
SCANNED = ("steer_ui/methods", "steer_ui/model")
# (file, enclosing function, what) -> why it is right there.  Everything else that names a device fails the scan.
ALLOWED = {
    ("steer_ui/model/analysis.py", "residual_reads", ".cpu()"): "a few texts' residuals at one block, projected on "
    "the host with the read-out directions (Many prompts' concept score)",
    ("steer_ui/model/loading.py", "resolve_device", "torch.device('cuda')"): "turns --device auto into a device",
    ("steer_ui/model/loading.py", "resolve_device", "torch.device('mps')"): "turns --device auto into a device",
    ("steer_ui/model/loading.py", "resolve_device", "torch.device('cpu')"): "turns --device auto into a device",
    ("steer_ui/model/analysis.py", "naive_logits", ".cpu()"): "logits for display and comparison, on the host",
    ("steer_ui/model/sampler.py", "noise_generator", "torch.device('cpu')"):
        "sampling noise is float64, which MPS cannot draw: such devices draw it on the host",
    ("steer_ui/model/analysis.py", "vocab_projection", ".cpu()"): "a table for display",
    ("steer_ui/model/analysis.py", "teacher_forced", ".cpu()"): "per-token log-probabilities and the residual "
                                                                 "read-out for tables and statistics, on the host",
    ("steer_ui/model/prefix.py", "unsteered_logits", ".cpu()"): "logits for display, kept on the host",
    ("steer_ui/model/precision.py", "next_token_probs", ".cpu()"): "a precision's cost, compared and cached on the host",
    ("steer_ui/model/prefix.py", "logits", ".cpu()"): "logits for display and sweeps, on the host",
    ("steer_ui/model/prefix.py", "_replayed_logits", ".cpu()"): "the replayed logits, copied out of the recording's "
                                                                 "output before the next replay overwrites it",
    ("steer_ui/model/capture.py", "out_projection_weight", ".cpu()"):
        "W_O for ITI's per-head directions, which are stored (vectors live on the host)",
    # files other workers own; their device handling is reviewed with them
    ("steer_ui/methods/iti.py", "kl_at", ".cpu()"): "a KL curve into numpy",
    ("steer_ui/methods/l2s/evaluation.py", "steering_effect", ".cpu()"): "held-out logits, compared on the host",
    ("steer_ui/methods/l2s/mlp.py", "state_tensors", ".cpu()"): "the MLP's weights, saved in the vector file",
    ("steer_ui/methods/l2s/activations.py", "block_outputs", ".cpu()"):
        "activations cached on the host (training batches move them back)",
    ("steer_ui/methods/tsv/scoring.py", "score", ".cpu()"):
        "representations compared with the stored prototypes, which live on the host",
    ("steer_ui/methods/constraints.py", "delta_stats", ".cpu()"): "per-position statistics for the report",
    ("steer_ui/methods/iti.py", "block_output_equivalent", ".cpu()"): "the exported residual vector (stored)",
    ("steer_ui/methods/iti.py", "_next_token_logp", ".cpu()"): "log-probabilities compared on the host",
    ("steer_ui/methods/tsv/training.py", "feats", ".cpu()"): "features into numpy for the baseline probes",
    ("steer_ui/methods/tsv/training.py", "train", ".cpu()"): "the trained vector and prototypes (stored)",
}


def _device_literals(path: Path) -> list[tuple[str, str, int]]:
    """(enclosing function, what, line) of every device named in ``path``'s code."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function: str):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                func = child.func
                literal = [a.value for a in child.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if isinstance(func, ast.Attribute) and func.attr in ("cpu", "cuda") and not child.args:
                    found.append((function, f".{func.attr}()", child.lineno))
                elif isinstance(func, ast.Attribute) and func.attr == "to" and any(
                        v.split(":")[0] in ("cpu", "cuda", "mps") for v in literal):
                    found.append((function, f".to({literal[0]!r})", child.lineno))
                elif isinstance(func, ast.Attribute) and func.attr == "device" and literal:
                    found.append((function, f"torch.device({literal[0]!r})", child.lineno))
                for kw in child.keywords:
                    if kw.arg == "device" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        found.append((function, f"device={kw.value.value!r}", child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_no_hard_coded_device_in_method_and_model_code():
    offenders, used = [], set()
    for root in SCANNED:
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for function, what, line in _device_literals(path):
                key = (rel, function, what)
                if key in ALLOWED:
                    used.add(key)
                else:
                    offenders.append(f"{rel}:{line} in {function}: {what}")
    assert offenders == [], "tensors must follow the model's device; justify a host transfer in ALLOWED"
    assert set(ALLOWED) - used == set(), "an allowed place no longer exists: remove it from ALLOWED"


def test_the_scan_sees_each_kind_of_device_literal(tmp_path):
    code = tmp_path / "x.py"
    code.write_text("import torch\n"
                    "def f(x):\n"
                    "    a = torch.zeros(3, device='cpu')\n"
                    "    b = x.cpu()\n"
                    "    c = x.to('cuda:0')\n"
                    "    d = torch.device('cuda')\n"
                    "    return x.to(a.device), torch.ones(2, device=x.device)\n")
    assert [(f, w) for f, w, _ in _device_literals(code)] == [
        ("f", "device='cpu'"), ("f", ".cpu()"), ("f", ".to('cuda:0')"), ("f", "torch.device('cuda')")]
