import pytest
import torch

from steer_ui.model.loading import ModelLoadError, load_model, resolve_device, resolve_dtype
from steer_ui.tiny import tiny_model


def test_local_directory_roundtrip(tmp_path):
    model, tok = tiny_model("qwen2")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    handle = load_model(str(tmp_path), device="cpu", dtype="float32")
    assert handle.arch.num_layers == 4 and handle.arch.model_type == "qwen2"
    assert handle.tokenizer.padding_side == "left"
    ids = tok("abc", return_tensors="pt").input_ids
    with torch.inference_mode():
        torch.testing.assert_close(handle.model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_bfloat16_dtype(tmp_path):
    model, tok = tiny_model("llama")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    handle = load_model(str(tmp_path), device="cpu", dtype="bfloat16")
    assert next(handle.model.parameters()).dtype == torch.bfloat16


def test_offline_hub_id_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelLoadError) as err:
        load_model("someone/not-a-cached-model", device="cpu")
    msg = str(err.value)
    assert "someone/not-a-cached-model" in msg and "--model DIR" in msg


def test_missing_gguf_and_wrong_file(tmp_path):
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(str(tmp_path / "missing.gguf"))
    junk = tmp_path / "weights.bin"
    junk.write_bytes(b"\0" * 10)
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(str(junk))


def test_device_and_dtype_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("float8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            resolve_device("cuda")


def test_unreachable_hub_answers_quickly(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelLoadError) as err:
        load_model("someone/not-a-real-model-xyz", device="cpu")
    assert "someone/not-a-real-model-xyz" in str(err.value) and "--model DIR" in str(err.value)


def test_device_map_auto_keeps_steering_correct(tmp_path):
    """device='multi' loads through accelerate's device_map; the hooks still steer the same way."""
    from steer_ui.model.analysis import naive_logits
    from steer_ui.model.hooks import Steer

    model, tok = tiny_model("llama")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    plain = load_model(str(tmp_path), device="cpu", dtype="float32")
    mapped = load_model(str(tmp_path), device="multi", dtype="float32")
    # (on a CPU-only machine accelerate places everything on the CPU; several GPUs are not testable here)
    steer = [Steer(layer=1, vector=torch.randn(64, generator=torch.Generator().manual_seed(0)), alpha=3.0)]
    torch.testing.assert_close(naive_logits(mapped, "abc", steer), naive_logits(plain, "abc", steer))


def test_a_gguf_conversion_parses_the_file_once_and_leaves_the_reader_as_it_was(tmp_path):
    """transformers reads a GGUF for the tokenizer and again for the weights; the conversion shares one reader
    (the second parse was half of the embedded model's first load)."""
    import gguf
    import numpy as np

    from steer_ui.model import loading

    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(1000)])
    writer.add_tensor("x", np.ones(8, dtype=np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                 writer.close):
        step()
    original = gguf.GGUFReader
    with loading._one_gguf_parse():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # as transformers calls it, by path, each time
        assert gguf.GGUFReader(tmp_path / "small.gguf", "r") is first
        assert len(first.fields["tokenizer.ggml.tokens"].data) == 1000
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(path) is not first
