"""Hostile vector files: each crafted here, each refused with one line naming the problem, in little memory."""
from __future__ import annotations

import collections
import contextlib
import json
import re
import struct

import numpy as np
import pytest
import torch

from steer_ui import limits
from steer_ui.formats import export_path, read_vector, safe_name, write_vector
from steer_ui.vector import SteeringVector, VectorError

HIDDEN = 64  # the tiny llama's hidden size
MB = 2**20


def _rss_kb(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", open("/proc/self/status").read()).group(1))


@contextlib.contextmanager
def peak_growth_below(limit_bytes: int = 200 * MB):
    """Asserts the process's peak resident memory grows by less than ``limit_bytes`` inside the block.

    Resets the kernel's peak counter first (``/proc/self/clear_refs``), so earlier tests' peaks do not hide
    this one's; falls back to ``ru_maxrss`` where that is not allowed.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before, field = _rss_kb("VmRSS"), "VmHWM"
    except OSError:  # pragma: no cover - other kernels
        import resource

        before, field = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, None
    yield
    if field:
        after = _rss_kb(field)
    else:  # pragma: no cover
        import resource

        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert (after - before) * 1024 < limit_bytes, f"peak memory grew by {(after - before) / 1024:.0f} MB"


def refused(path, match, handle=None) -> str:
    with pytest.raises(VectorError, match=match) as info:
        read_vector(path, handle)
    message = str(info.value)
    assert "\n" not in message
    return message


def vector(**changes) -> SteeringVector:
    fields = dict(directions={2: torch.randn(HIDDEN, generator=torch.Generator().manual_seed(0))},
                  hidden_size=HIDDEN, method="mean-diff", model_type="llama", name="v")
    fields.update(changes)
    return SteeringVector(**fields)


# ============================================================== 1. expanded tensors and views
class _View:
    """Pickles as a tensor view (size, stride) over a 4-element storage: what a crafted .pt file can hold."""

    def __init__(self, size, stride):
        self.size, self.stride = size, stride

    def __reduce__(self):
        storage = torch.storage.TypedStorage(wrap_storage=torch.zeros(4).untyped_storage(), dtype=torch.float32,
                                             _internal=True)
        return torch._utils._rebuild_tensor_v2, (storage, 0, self.size, self.stride, False,
                                                 collections.OrderedDict())


@pytest.mark.parametrize("tensor, match", [
    (torch.zeros(1).expand(1 << 40), r"1099511627776 elements\); the limit is"),
    (torch.zeros(1).expand(HIDDEN), r"strides \(0,\) .* overlap"),
    (_View((HIDDEN,), (1,)), r"not a readable torch\.save file"),  # torch refuses a view past its storage
    (_View((1 << 40,), (1,)), r"not a readable torch\.save file"),
])
def test_expanded_or_oversize_view_is_refused_before_it_is_materialised(tmp_path, tensor, match):
    path = tmp_path / "sv.pt"
    torch.save({"layer_activations": {2: tensor}, "layer_type": "decoder_block"}, path)
    assert path.stat().st_size < 4096
    with peak_growth_below():
        message = refused(path, match)
    assert "sv.pt" in message
    caa = tmp_path / "vec_layer_3.pt"  # the CAA single-tensor path reads through the same checks
    torch.save(tensor, caa)
    with peak_growth_below():
        refused(caa, match)


def test_aliased_views_in_a_pt_file_count_each_time(tmp_path):
    storage = torch.zeros(4 * MB)  # 16 MB stored once, referenced by 40 layers: 640 MB if copied per layer
    path = tmp_path / "aliased.pt"
    torch.save({"layer_activations": {layer: storage for layer in range(40)}}, path)
    with peak_growth_below():
        refused(path, r"aliased\.pt: its tensors take 640\.0 MB \(aliased views count each time\); the limit is 256")


def test_in_memory_views_are_checked_too():
    with pytest.raises(VectorError, match=r"elements\); the limit is"):
        vector(directions={2: torch.zeros(1).expand(1 << 40)})
    with pytest.raises(VectorError, match=r"extra tensor 'w' is a view with strides \(0, 1\)"):
        vector(extras={"w": torch.zeros(HIDDEN).expand(1000, HIDDEN)})
    plain_strided = torch.randn(HIDDEN, 3)[:, 1]  # a column: strided, but no overlap
    assert torch.equal(vector(directions={2: plain_strided}).direction(), plain_strided)


# ============================================================== 2. aliased data in safetensors and GGUF
def _safetensors(path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_safetensors_with_aliased_offsets_is_refused(tmp_path):
    path = tmp_path / "alias.safetensors"
    entry = {"dtype": "F32", "shape": [HIDDEN], "data_offsets": [0, 4 * HIDDEN]}
    _safetensors(path, {f"direction.{i}": entry for i in range(3)}, bytes(4 * HIDDEN))
    with peak_growth_below():
        refused(path, r"alias\.safetensors: tensors 'direction\.\d' and 'direction\.\d' overlap in the file")


def test_a_refused_file_s_detail_is_said_in_the_page_s_language(tmp_path):
    """The generic refusal ("<name>: <detail>") says its detail by key, so the Chinese page has no English in the
    brackets; the English (the CLI's, an API client's) is as it was."""
    from steer_ui.ui import i18n

    path = tmp_path / "alias.safetensors"
    entry = {"dtype": "F32", "shape": [HIDDEN], "data_offsets": [0, 4 * HIDDEN]}
    _safetensors(path, {f"direction.{i}": entry for i in range(3)}, bytes(4 * HIDDEN))
    with pytest.raises(VectorError) as caught:
        read_vector(path)
    assert caught.value.key == "vector_file_invalid"
    assert re.fullmatch(r"alias\.safetensors: tensors 'direction\.\d' and 'direction\.\d' overlap in the file "
                        r"\(aliased data\); refused", str(caught.value))
    chinese = i18n.message("zh-CN", caught.value.key, **caught.value.params)
    assert "alias.safetensors" in chinese and "重叠" in chinese and not re.search(r"overlap|refused|aliased", chinese)


@pytest.mark.parametrize("entry, match", [
    ({"dtype": "F32", "shape": [HIDDEN], "data_offsets": [0, 1 << 40]}, r"do not fit .* data bytes of the file"),
    ({"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 1 << 42]}, r"declares shape \(1099511627776,\)"),
    ({"dtype": "F32", "shape": [HIDDEN], "data_offsets": [8, 8 + 4 * HIDDEN]}, r"do not fit"),
])
def test_safetensors_declared_sizes_are_checked_before_reading(tmp_path, entry, match):
    path = tmp_path / "big.safetensors"
    _safetensors(path, {"direction.2": entry}, bytes(4 * HIDDEN))
    with peak_growth_below():
        refused(path, match)


def _gguf_offset_field(path, tensor_index: int) -> int:
    """Byte position of a tensor's data offset in the GGUF header (the last part of its tensor-info field)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).tensors[tensor_index].field
    return field.offset + sum(int(p.nbytes) for p in field.parts[:-1])


def test_gguf_with_two_tensors_sharing_data_is_refused(tmp_path):
    path = write_vector(vector(directions={1: torch.randn(HIDDEN), 2: torch.randn(HIDDEN)}), "gguf",
                        tmp_path / "v.gguf")[0]
    assert read_vector(path)[0].layers == [1, 2]
    raw = bytearray(path.read_bytes())
    at = _gguf_offset_field(path, 1)
    raw[at:at + 8] = struct.pack("<Q", 0)  # direction.2 now points at direction.1's bytes
    path.write_bytes(bytes(raw))
    with peak_growth_below():
        refused(path, r"v\.gguf: GGUF tensors 'direction\.\d' and 'direction\.\d' overlap in the file")


def test_gguf_huge_array_or_tensor_is_refused_before_gguf_reads_it(tmp_path):
    import gguf

    path = tmp_path / "array.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_array("junk", list(range(100_000)))  # gguf's reader would build 100k Python objects
    writer.add_tensor("direction.1", np.zeros(HIDDEN, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with peak_growth_below():
        refused(path, r"array\.gguf: GGUF key 'junk' is an array of 100000 values; the limit is")

    path = write_vector(vector(), "gguf", tmp_path / "dims.gguf")[0]
    from gguf import GGUFReader

    field = GGUFReader(str(path)).tensors[0].field
    at = field.offset + sum(int(p.nbytes) for p in field.parts[:3])  # name length, name, n_dims: then dims[0]
    raw = bytearray(path.read_bytes())
    raw[at:at + 8] = struct.pack("<Q", 1 << 40)
    path.write_bytes(bytes(raw))
    with peak_growth_below():
        refused(path, r"dims\.gguf: GGUF tensor 'direction\.2' declares 1099511627776 elements")


def test_base64_extras_are_checked_before_decoding(tmp_path):
    path = tmp_path / "np.json"
    doc = {"vector": [0.5] * HIDDEN, "layer": 2, "hookType": "hook_resid_post",
           "steer_ui_extras": {"w": {"dtype": "float32", "shape": [1 << 30, 1 << 10], "base64": "AAAA"}}}
    path.write_text(json.dumps(doc))
    with peak_growth_below():
        refused(path, r"np\.json: extra tensor 'w' declares shape \(1073741824, 1024\)")


def test_json_with_too_many_values_is_refused_before_parsing(tmp_path):
    path = tmp_path / "many.json"
    path.write_text('{"layer": 2, "vector": [' + ",".join(["0"] * (limits.MAX_JSON_TOKENS + 1)) + "]}")
    with peak_growth_below():
        refused(path, r"many\.json: the JSON has \d+ values and keys; the limit is")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    refused(deep, r"deep\.json: the JSON is nested too deeply")


# ============================================================== 3. validation at import
@pytest.mark.parametrize("changes, match", [
    ({"directions": {2: torch.full((HIDDEN,), float("nan"))}}, r"layer 2 contains NaN"),
    ({"directions": {2: torch.zeros(2, HIDDEN // 2)}}, r"must be 1-D"),
    ({"directions": {2: torch.zeros(HIDDEN, dtype=torch.int64)}}, r"dtype int64; accepted: float32"),
    ({"directions": {2: torch.zeros(32)}}, r"32 values but hidden size is 64"),
    ({"hidden_size": limits.MAX_HIDDEN + 1}, r"hidden size must be in 1\.\.65536"),
    ({"extras": {"p": torch.tensor([1.0, float("inf")])}}, r"extra tensor 'p' contains NaN or inf"),
    ({"extras": {"p": torch.zeros(2, dtype=torch.complex64)}}, r"extra tensor 'p' has dtype complex64"),
    ({"extras": {"../x": torch.zeros(2)}}, r"extra tensor name '\.\./x' refused"),
    ({"name": "n" * 201}, r"name is 201 characters long"),
    ({"hyperparameters": {"blob": "x" * 70_000}}, r"hyperparameters is \d+ bytes as JSON; the limit is 65536"),
    ({"metrics": ["not", "an", "object"]}, r"metrics must be a JSON object"),
    ({"alpha_range": (2.0, 1.0)}, r"low <= high"),
    ({"alpha_range": (float("nan"), 1.0)}, r"two finite numbers"),
    ({"alpha_range": [1, 2, 3]}, r"alpha_range must be two numbers"),
    ({"max_delta_logit": 0}, r"max_delta_logit must be a number in \(0, 1000\] or null, got 0"),
    ({"max_delta_logit": float("inf")}, r"max_delta_logit must be a number in \(0, 1000\]"),
    ({"max_delta_logit": "2"}, r"max_delta_logit must be a number"),
    ({"positions": "everywhere"}, r"positions must be one of"),
    ({"method": "x" * 65}, r"method must be a short identifier"),
    ({"method": {"l2s": 1}}, r"method must be a short identifier"),
])
def test_record_is_validated_on_construction(changes, match):
    with pytest.raises(VectorError, match=match) as info:
        vector(**changes)
    assert "\n" not in str(info.value)


def test_hand_edited_metadata_in_a_file_is_refused_naming_the_field(tmp_path):
    from safetensors.torch import save_file

    good = vector()
    for field, value, match in [("name", "n" * 300, r"name is 300 characters"),
                                ("alpha_range", [3, "x"], r"alpha_range must be two numbers"),
                                ("positions", ["all"], r"positions must be one of"),
                                ("max_delta_logit", -3, r"max_delta_logit must be a number in"),
                                ("layers", "2", r"'layers' must be a list of layer numbers")]:
        meta = {**good.metadata(), field: value}
        path = tmp_path / f"{field}.safetensors"
        save_file({"direction.2": good.direction()}, str(path), metadata={"steer_ui": json.dumps(meta)})
        assert f"{field}.safetensors" in refused(path, match)


def _iti_vector(tiny_handle, heads, shifts=None, num_heads=None) -> SteeringVector:
    from steer_ui.model.capture import head_geometry

    model_heads, head_dim = head_geometry(tiny_handle)
    heads = torch.as_tensor(heads)
    shifts = torch.ones(len(heads), head_dim) if shifts is None else shifts
    return vector(method="iti", site="attention_heads", hyperparameters={"num_heads": num_heads or model_heads},
                  extras={"iti.heads": heads, "iti.shifts": shifts})


def test_iti_per_head_data_is_checked_against_the_model_on_import(tmp_path, tiny):
    from steer_ui.model.capture import head_geometry

    handle = tiny("llama")
    n_heads, head_dim = head_geometry(handle)
    layers = handle.arch.num_layers
    good = write_vector(_iti_vector(handle, [[0, 0], [layers - 1, n_heads - 1]]), "native", tmp_path / "ok.safetensors")
    assert read_vector(good[0], handle)[0].extras["iti.heads"].shape == (2, 2)
    cases = [
        (_iti_vector(handle, [[layers, 0]]), rf"names layer {layers}; the loaded model has layers 0\.\.{layers - 1}"),
        (_iti_vector(handle, [[0, n_heads + 5]]), rf"names head {n_heads + 5}; the loaded model has heads"),
        (_iti_vector(handle, [[0, 0, 0]]), r"must be \(K, 2\) integers"),
        (_iti_vector(handle, torch.zeros(1, 2)), r"must be \(K, 2\) integers \[layer, head\], got torch\.float32"),
        (_iti_vector(handle, [[0, 0]], shifts=torch.ones(1, head_dim + 1)), rf"must be \(1, {head_dim}\) floats"),
        (_iti_vector(handle, [[0, 0]], num_heads=n_heads * 2), rf"records num_heads {n_heads * 2}"),
        (_iti_vector(handle, [[0, 0]] * (layers * n_heads + 1)), r"lists \d+ heads; the loaded model has"),
    ]
    for i, (bad, match) in enumerate(cases):
        path = write_vector(bad, "native", tmp_path / f"bad{i}.safetensors")[0]
        assert f"bad{i}.safetensors" in refused(path, match, handle)
        read_vector(path)  # without a model there is nothing to check the heads against


# ============================================================== 4. names that become paths
@pytest.mark.parametrize("name", ["..", "../../etc/passwd", "a/b", "a\\b", "nul\x00byte", ".hidden", "...", "/abs",
                                  "", "x" * 500, "C:\\Windows", "ok.name-1"])
def test_names_that_become_paths_stay_in_the_folder(tmp_path, name):
    safe = safe_name(name)
    assert safe and not safe.startswith(".") and ".." not in safe and len(safe) <= limits.MAX_FILE_NAME
    assert not set(safe) & set("/\\\x00")
    folder = tmp_path / "exports"
    folder.mkdir()
    for fmt in ("caa", "native"):
        out = export_path(folder, name, fmt)
        assert out.resolve().parent == folder.resolve()
        written = write_vector(vector(name=name[:200].replace("\x00", "")), fmt, out)
        assert all(folder.resolve() in p.resolve().parents for p in written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exports"]
    assert safe_name("ok.name-1") == "ok.name-1"


# ============================================================== 5. sidecar metadata
def _l2s_like() -> SteeringVector:
    # What an L2S vector is to the formats: a direction plus the MLP tensors it cannot steer without.
    return vector(method="l2s", extras={"l2s.encoder.weight": torch.randn(8, HIDDEN),
                                         "l2s.decoder.weight": torch.randn(HIDDEN, 8)})


def test_missing_sidecar_is_a_warning_naming_what_is_lost(tmp_path):
    pt, sidecar = write_vector(_l2s_like(), "steering-vectors", tmp_path / "v.pt")
    back, warnings = read_vector(pt)
    assert back.method == "l2s" and set(back.extras) == {"l2s.encoder.weight", "l2s.decoder.weight"}
    assert warnings == []
    sidecar.unlink()
    back, warnings = read_vector(pt)
    assert back.method == "imported" and back.extras == {}
    assert len(warnings) == 1 and "no v.steer_ui.json beside it" in warnings[0] and "L2S MLP" in warnings[0]
    caa = write_vector(_l2s_like(), "caa", tmp_path / "caa")
    caa[-1].unlink()  # steer_ui.json
    _, warnings = read_vector(tmp_path / "caa")
    assert any("no steer_ui.json beside it" in w and "lost" in w for w in warnings)


def test_metadata_naming_extras_the_file_lacks_is_refused(tmp_path):
    pt, sidecar = write_vector(_l2s_like(), "steering-vectors", tmp_path / "v.pt")
    doc = json.loads(sidecar.read_text())
    doc["extras"] = {}  # the metadata still lists the MLP tensors
    sidecar.write_text(json.dumps(doc))
    refused(pt, r"v\.pt: its metadata says this l2s vector has extra tensors \['l2s\.decoder\.weight', "
                r"'l2s\.encoder\.weight'\] but the file does not carry them; importing would lose them")

    from safetensors.torch import save_file

    native = tmp_path / "stripped.safetensors"
    v = _l2s_like()
    save_file({"direction.2": v.direction()}, str(native), metadata={"steer_ui": json.dumps(v.metadata())})
    refused(native, r"stripped\.safetensors: its metadata says this l2s vector has extra tensors")
