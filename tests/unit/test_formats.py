"""Export / import of steering vectors: round trips, content detection, validation, refusals."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from steer_ui.formats import FORMATS, detect_format, export_notes, read_vector, validate_for_model, write_vector
from steer_ui.vector import SteeringVector, VectorError

OUT_NAMES = {"native": "v.safetensors", "gguf": "v.gguf", "steering-vectors": "v.pt", "neuronpedia": "v.json",
             "caa": "v_caa"}


def make_vector(layers=(1, 3), hidden=64, **changes) -> SteeringVector:
    gen = torch.Generator().manual_seed(7)
    fields = dict(
        directions={layer: torch.randn(hidden, generator=gen) for layer in layers}, hidden_size=hidden,
        method="mean_diff", model_id="tiny:llama", model_type="llama", model_revision="abc123", positions="prompt",
        name="honesty", hyperparameters={"layer": layers[0], "normalize": True}, dataset_hash="0123456789abcdef",
        metrics={"val_accuracy": 0.75, "per_layer": [0.5, 0.6]}, alpha_range=(-0.5, 1.25), max_delta_logit=2.5,
        extras={"prototypes": torch.randn(2, hidden, generator=gen).to(torch.bfloat16),
                "mlp.weight": torch.randn(8, hidden, generator=gen), "head_index": torch.arange(4)},
    )
    fields.update(changes)
    vec = SteeringVector(**fields)
    # A negative zero and a subnormal: a lossy path would flip or flush them.
    first = vec.directions[layers[0]]
    first[0], first[1] = -0.0, 1e-42
    return vec


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 8: torch.int64, 1: torch.uint8}[t.element_size()])


def assert_same(a: SteeringVector, b: SteeringVector) -> None:
    assert a.layers == b.layers
    for layer in a.layers:
        assert a.directions[layer].dtype == b.directions[layer].dtype == torch.float32
        assert torch.equal(bits(a.directions[layer]), bits(b.directions[layer])), f"layer {layer} differs"
    assert set(a.extras) == set(b.extras)
    for key in a.extras:
        assert a.extras[key].dtype == b.extras[key].dtype and a.extras[key].shape == b.extras[key].shape
        assert torch.equal(bits(a.extras[key]), bits(b.extras[key])), f"extra {key} differs"
    assert a.metadata() == b.metadata()


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_is_bit_exact_with_all_metadata(tmp_path, fmt):
    vector = make_vector(layers=(2,) if fmt == "neuronpedia" else (1, 3))
    written = write_vector(vector, fmt, tmp_path / OUT_NAMES[fmt])
    assert all(p.exists() for p in written)
    back, warnings = read_vector(tmp_path / OUT_NAMES[fmt])
    assert warnings == []
    assert_same(vector, back)


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_is_detected_from_content_not_extension(tmp_path, fmt):
    vector = make_vector(layers=(2,))
    target = tmp_path / OUT_NAMES[fmt]
    write_vector(vector, fmt, target)
    if fmt == "caa":  # a directory: the single vec_layer file alone also reads
        single = tmp_path / "elsewhere" / "vec_layer_2.pt"
        single.parent.mkdir()
        shutil.copy(target / "vec_layer_2.pt", single)
        back, _ = read_vector(single)
        assert torch.equal(back.direction(), vector.direction()) and back.layer == 2
        return
    disguised = tmp_path / "renamed.dat"
    shutil.copy(target, disguised)
    back, _ = read_vector(disguised)
    assert torch.equal(bits(back.direction()), bits(vector.direction()))
    expected = {"steering-vectors": "torch"}.get(fmt, fmt)
    assert detect_format(disguised) == expected


def test_gguf_file_as_llama_cpp_and_repeng_read_it(tmp_path):
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

    vector = make_vector(layers=(1, 3))
    path = write_vector(vector, "gguf", tmp_path / "v.gguf")[0]
    reader = GGUFReader(str(path))

    def string(key):
        field = reader.get_field(key)
        assert field.types == [GGUFValueType.STRING]
        return bytes(field.parts[field.data[0]]).decode()

    assert string("general.architecture") == "controlvector"
    assert string("controlvector.model_hint") == "llama"
    count = reader.get_field("controlvector.layer_count")
    assert count.types == [GGUFValueType.UINT32] and int(count.parts[count.data[0]][0]) == 2
    assert json.loads(string("steer_ui.metadata")) == vector.metadata()
    assert string("steer_ui.method") == "mean_diff"
    assert {t.name for t in reader.tensors} == {"direction.1", "direction.3"}
    for t in reader.tensors:
        layer = int(t.name.split(".")[1])
        assert t.tensor_type == GGMLQuantizationType.F32
        assert t.data.ndim == 1 and t.data.dtype == np.float32
        assert np.array_equal(t.data.view(np.int32), vector.directions[layer].numpy().view(np.int32))


def test_gguf_refuses_layer_zero_with_reason(tmp_path):
    with pytest.raises(VectorError, match=r"direction\.0.*llama\.cpp|llama\.cpp.*direction\.0"):
        write_vector(make_vector(layers=(0, 2)), "gguf", tmp_path / "v.gguf")
    assert not (tmp_path / "v.gguf").exists()


def test_gguf_written_like_repeng_imports_with_provenance(tmp_path):
    import gguf

    direction = np.linspace(-1, 1, 64, dtype=np.float32)
    path = tmp_path / "repeng_style.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "mistral")
    writer.add_uint32("controlvector.layer_count", 1)
    writer.add_tensor("direction.5", direction)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    vector, warnings = read_vector(path)
    assert vector.layers == [5] and vector.model_type == "mistral" and vector.method == "imported"
    assert vector.hyperparameters["imported_from"] == "gguf"
    assert vector.hyperparameters["source_file"] == "repeng_style.gguf"
    assert np.array_equal(vector.direction().numpy(), direction)
    assert warnings == []


def test_gguf_model_file_is_not_a_control_vector(tmp_path):
    import gguf

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(VectorError, match="architecture is 'llama', not 'controlvector'"):
        read_vector(path)


def test_steering_vectors_file_loads_with_weights_only(tmp_path):
    vector = make_vector(layers=(1, 3))
    pt, sidecar = write_vector(vector, "steering-vectors", tmp_path / "v.pt")
    assert sidecar.name == "v.steer_ui.json"
    payload = torch.load(pt, weights_only=True)
    assert set(payload) == {"layer_activations", "layer_type"} and payload["layer_type"] == "decoder_block"
    assert sorted(payload["layer_activations"]) == [1, 3]
    assert all(type(k) is int for k in payload["layer_activations"])
    # Without the sidecar the tensors still import, with provenance instead of our metadata.
    sidecar.unlink()
    back, _ = read_vector(pt)
    assert back.method == "imported" and back.hyperparameters["imported_from"] == "steering-vectors"
    assert torch.equal(back.directions[3], vector.directions[3])


def test_steering_vectors_other_layer_type_is_refused(tmp_path):
    path = tmp_path / "attn.pt"
    torch.save({"layer_activations": {2: torch.ones(64)}, "layer_type": "self_attn"}, path)
    with pytest.raises(VectorError, match="layer_type is 'self_attn'.*decoder_block"):
        read_vector(path)


def test_neuronpedia_json_fields(tmp_path):
    vector = make_vector(layers=(2,))
    path = write_vector(vector, "neuronpedia", tmp_path / "v.json")[0]
    doc = json.loads(path.read_text())
    assert doc["hookType"] == "hook_resid_post" and doc["layer"] == 2 and doc["modelId"] == "tiny:llama"
    assert doc["hookName"] == "blocks.2.hook_resid_post"
    assert len(doc["vector"]) == 64 and all(isinstance(x, float) for x in doc["vector"])


def test_neuronpedia_refuses_several_layers(tmp_path):
    with pytest.raises(VectorError, match=r"one layer.*\[1, 3\]"):
        write_vector(make_vector(layers=(1, 3)), "neuronpedia", tmp_path / "v.json")


def test_neuronpedia_resid_pre_maps_to_previous_block(tmp_path):
    path = tmp_path / "np.json"
    path.write_text(json.dumps({"modelId": "gemma-2-2b", "layerNumber": 4, "hookType": "hook_resid_pre",
                                "vector": [0.5] * 64, "vectorLabel": "dinosaurs"}))
    vector, warnings = read_vector(path)
    assert vector.layers == [3] and vector.name == "dinosaurs" and vector.model_id == "gemma-2-2b"
    assert any("output of block 3" in w for w in warnings)
    path.write_text(json.dumps({"layerNumber": 0, "hookType": "hook_resid_pre", "vector": [0.5] * 64}))
    with pytest.raises(VectorError, match="embedding output"):
        read_vector(path)
    path.write_text(json.dumps({"layer": 2, "hookType": "hook_mlp_out", "vector": [0.5] * 64}))
    with pytest.raises(VectorError, match="hook_mlp_out"):
        read_vector(path)


def test_caa_directory_with_model_suffix_names(tmp_path):
    folder = tmp_path / "vectors"
    folder.mkdir()
    torch.save(torch.ones(64), folder / "vec_layer_13_Llama-2-7b-chat-hf.pt")
    torch.save(-torch.ones(1, 64), folder / "vec_layer_14_Llama-2-7b-chat-hf.pt")
    (folder / "notes.txt").write_text("unrelated")
    vector, _ = read_vector(folder)
    assert vector.layers == [13, 14] and vector.model_id == "Llama-2-7b-chat-hf"
    assert torch.equal(vector.directions[14], -torch.ones(64))


def test_caa_export_needs_a_directory(tmp_path):
    with pytest.raises(VectorError, match="directory"):
        write_vector(make_vector(), "caa", tmp_path / "v.pt")


def test_pickles_are_never_executed(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (marker,))

    as_torch = tmp_path / "evil.pt"
    torch.save({"layer_activations": {1: torch.ones(64)}, "layer_type": "decoder_block", "x": Exploit()}, as_torch)
    with pytest.raises(VectorError, match="refused.*never unpickled"):
        read_vector(as_torch)
    raw = tmp_path / "evil.pkl"
    raw.write_bytes(pickle.dumps(Exploit(), protocol=2))
    with pytest.raises(VectorError):
        read_vector(raw)
    assert not marker.exists()


def test_non_plain_objects_inside_allowed_pickle_are_refused(tmp_path):
    # weights_only allows some torch types; a vector file must still be only tensors and dicts.
    path = tmp_path / "odd.pt"
    torch.save({"layer_activations": {1: torch.ones(64)}, "layer_type": "decoder_block",
                "dtype": torch.float32}, path)
    with pytest.raises(VectorError, match="refused: holds a dtype"):
        read_vector(path)


@pytest.mark.parametrize("fmt", ["native", "gguf", "steering-vectors", "neuronpedia", "caa"])
def test_nan_and_inf_are_rejected(tmp_path, fmt):
    import gguf
    from safetensors.torch import save_file

    bad = torch.ones(64)
    bad[5] = float("nan") if fmt != "gguf" else float("inf")
    target = tmp_path / OUT_NAMES[fmt]
    if fmt == "native":
        save_file({"direction.2": bad}, str(target))
    elif fmt == "gguf":
        writer = gguf.GGUFWriter(str(target), "controlvector")
        writer.add_string("controlvector.model_hint", "llama")
        writer.add_uint32("controlvector.layer_count", 1)
        writer.add_tensor("direction.2", bad.numpy())
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    elif fmt == "steering-vectors":
        torch.save({"layer_activations": {2: bad}, "layer_type": "decoder_block"}, target)
    elif fmt == "neuronpedia":
        target.write_text(json.dumps({"layer": 2, "hookType": "hook_resid_post", "vector": bad.tolist()}))
    else:
        target.mkdir()
        torch.save(bad, target / "vec_layer_2.pt")
    with pytest.raises(VectorError, match=r"NaN|inf"):
        read_vector(target)


def test_size_limit(tmp_path):
    path = write_vector(make_vector(), "native", tmp_path / "v.safetensors")[0]
    with pytest.raises(VectorError, match="over the .* limit"):
        read_vector(path, max_bytes=1000)


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"\x00\x01\x02binary junk that is nothing", "not a steering-vector file"),
    (b"statement,label\nthe sky is blue,1\n", "not a steering-vector file"),
    (b'{"layer": 3}', "no 'vector' array"),
    (b'{"layer": 3, "vector": [1, "x"]}', r"'vector'\[1\] is 'x'"),
    (b'{"steer_ui": {"layers": [1]}}', "metadata sidecar"),
    (b"PK\x03\x04truncated zip", "not a readable torch.save file"),
])
def test_bad_files_get_one_clear_line(tmp_path, content, message):
    path = tmp_path / "upload.dat"
    path.write_bytes(content)
    with pytest.raises(VectorError, match=message) as info:
        read_vector(path)
    assert "\n" not in str(info.value) and "upload.dat" in str(info.value)


def test_pt_name_with_other_content(tmp_path):
    path = tmp_path / "vec_layer_3.pt"
    path.write_text("hello")
    with pytest.raises(VectorError, match=r"named \.pt but is not a torch\.save file"):
        read_vector(path)


def test_missing_file_and_empty_directory(tmp_path):
    with pytest.raises(VectorError, match="not found"):
        read_vector(tmp_path / "nope.gguf")
    with pytest.raises(VectorError, match="vec_layer_<L>.pt"):
        read_vector(tmp_path)


def test_single_tensor_without_layer_in_name(tmp_path):
    path = tmp_path / "direction.pt"
    torch.save(torch.ones(64), path)
    with pytest.raises(VectorError, match="layer in the name"):
        read_vector(path)


def test_validation_against_the_model(tiny):
    handle = tiny("llama")  # hidden 64, 4 layers, model_type llama
    with pytest.raises(VectorError, match=r"hidden size 32 .* hidden size 64"):
        validate_for_model(make_vector(hidden=32), handle)
    with pytest.raises(VectorError, match=r"layer 7 .* layers 0\.\.3"):
        validate_for_model(make_vector(layers=(7,)), handle)
    assert validate_for_model(make_vector(), handle) == []
    warnings = validate_for_model(make_vector(model_type="qwen2"), handle)
    assert len(warnings) == 1 and "qwen2" in warnings[0] and "llama" in warnings[0]
    assert "does not say" in validate_for_model(make_vector(model_type=""), handle)[0]


def test_read_vector_with_handle_reports_mismatch(tmp_path, tiny):
    handle = tiny("gemma3")
    path = write_vector(make_vector(layers=(2,)), "gguf", tmp_path / "v.gguf")[0]
    vector, warnings = read_vector(path, handle)
    assert vector.layers == [2] and any("gemma3" in w for w in warnings)
    too_big = write_vector(make_vector(hidden=96), "steering-vectors", tmp_path / "big.pt")[0]
    with pytest.raises(VectorError, match="96.*64"):
        read_vector(too_big, handle)


def test_imported_vector_steers_the_same(tmp_path, tiny):
    """The record read back from each format gives the same hooks, so the same logits."""
    from steer_ui.model.hooks import steering
    from steer_ui.steering import build_steers

    handle = tiny("llama")
    vector = make_vector(layers=(2,))
    ids = torch.tensor([[1, 40, 50, 60]])
    with torch.no_grad(), steering(handle, build_steers(handle, vector, 2.0)):
        expected = handle.model(ids).logits
    for fmt in FORMATS:
        write_vector(vector, fmt, tmp_path / OUT_NAMES[fmt])
        back, _ = read_vector(tmp_path / OUT_NAMES[fmt], handle)
        with torch.no_grad(), steering(handle, build_steers(handle, back, 2.0)):
            assert torch.equal(handle.model(ids).logits, expected), fmt


def test_legacy_torch_layout_and_string_layer_keys(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"layer_activations": {"4": torch.full((64,), 0.25)}, "layer_type": "decoder_block"}, path,
               _use_new_zipfile_serialization=False)
    assert path.read_bytes()[:1] == b"\x80"  # the old pickle layout, still read with weights_only=True
    vector, _ = read_vector(path)
    assert vector.layers == [4] and torch.equal(vector.direction(), torch.full((64,), 0.25))


def test_the_export_notes_say_other_tools_steer_without_the_vectors_bound():
    bounded = make_vector()  # states a Δlogit bound of 2.5
    notes = export_notes(bounded, "gguf")
    assert len(notes) == 1 and "|Δlogit| of 2.5" in notes[0] and "gguf" in notes[0]
    assert export_notes(bounded, "native") == []  # the native file is what steer_ui reads back in full
    assert export_notes(make_vector(max_delta_logit=None), "gguf") == []
