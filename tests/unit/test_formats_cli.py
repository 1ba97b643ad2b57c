"""CLI ``export`` / ``import``: one JSON object with --json, files on disk, clear errors."""
from __future__ import annotations

import json

import pytest
import torch

from steer_ui.cli import main
from steer_ui.vector import SteeringVector, random_vector


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def native(tmp_path):
    vector = random_vector(64, 2, seed=4, model_type="llama", model_id="tiny:llama")
    return vector, vector.save(tmp_path / "v.safetensors")


@pytest.mark.parametrize("fmt, out_name", [
    ("gguf", "v.gguf"), ("steering-vectors", "v.pt"), ("neuronpedia", "v.json"), ("caa", "caa_dir"),
    ("native", "copy.safetensors"),
])
def test_export_then_import_round_trip(capsys, tmp_path, native, fmt, out_name):
    vector, src = native
    code, out, _ = run(capsys, "export", "--vector", src, "--format", fmt, "--out", tmp_path / out_name, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["format"] == fmt and data["warnings"] == []
    assert all((tmp_path / p).exists() for p in data["out"])

    back_path = tmp_path / "back.safetensors"
    code, out, _ = run(capsys, "import", "--in", tmp_path / out_name, "--out", back_path, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["out"] == str(back_path) and data["layers"] == [2] and data["method"] == "random"
    back = SteeringVector.load(back_path)
    assert torch.equal(back.direction(), vector.direction()) and back.metadata() == vector.metadata()


def test_import_checks_against_model(capsys, tmp_path):
    wide = random_vector(96, 1, seed=0, model_type="llama").save(tmp_path / "wide.safetensors")
    code, out, err = run(capsys, "import", "--in", wide, "--out", tmp_path / "x.safetensors",
                         "--model", "tiny:llama", "--json")
    assert code == 2
    assert "96" in json.loads(out)["error"] and "64" in json.loads(out)["error"]
    assert not (tmp_path / "x.safetensors").exists()


def test_import_warns_on_model_type(capsys, tmp_path):
    src = random_vector(64, 1, seed=0, model_type="qwen2").save(tmp_path / "q.safetensors")
    code, out, _ = run(capsys, "import", "--in", src, "--out", tmp_path / "x.safetensors", "--model", "tiny:llama",
                       "--json")
    assert code == 0
    assert any("qwen2" in w for w in json.loads(out)["warnings"])


def test_export_layer_zero_gguf_is_a_clear_error(capsys, tmp_path):
    src = random_vector(64, 0, seed=0, model_type="llama").save(tmp_path / "zero.safetensors")
    code, out, err = run(capsys, "export", "--vector", src, "--format", "gguf", "--out", tmp_path / "z.gguf", "--json")
    assert code == 2
    assert "direction.0" in json.loads(out)["error"] and err.startswith("error: ")
    assert not (tmp_path / "z.gguf").exists()


def test_import_refuses_pickle(capsys, tmp_path):
    evil = tmp_path / "evil.pt"
    torch.save({"layer_activations": {1: torch.ones(64)}, "layer_type": "decoder_block", "f": print}, evil)
    code, out, _ = run(capsys, "import", "--in", evil, "--out", tmp_path / "x.safetensors", "--json")
    assert code == 2 and "refused" in json.loads(out)["error"]
