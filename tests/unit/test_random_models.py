"""Random models of real shapes (``random:SHAPE``), and the dtype each device gets by default."""
import pytest
import torch

from steer_ui.model.loading import ModelLoadError, load_model, resolve_dtype
from steer_ui.tiny import SHAPES, random_model, unfilled_model

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("shape, params, tied", [
    ("llama-8b", 8_030_261_248, False),  # Meta-Llama-3-8B's parameter count
    ("llama-1b", 1_235_814_400, True),  # Llama-3.2-1B's (embeddings tied)
])
def test_real_shapes_on_meta(shape, params, tied):
    model = unfilled_model(shape, "meta", torch.bfloat16)  # nothing allocated: the shapes alone
    assert sum(p.numel() for p in model.parameters()) == params
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in model.parameters())
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    config = model.config
    expected = SHAPES[shape]
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size) == (
        expected["num_hidden_layers"], expected["hidden_size"], expected["intermediate_size"],
        expected["num_attention_heads"], expected["num_key_value_heads"], 128256)


def test_random_model_is_seeded_and_bfloat16_is_its_rounding():
    m32, tok = random_model("llama-mini", "cpu", torch.float32, seed=3)
    again, _ = random_model("llama-mini", "cpu", torch.float32, seed=3)
    m16, _ = random_model("llama-mini", "cpu", torch.bfloat16, seed=3)
    other, _ = random_model("llama-mini", "cpu", torch.float32, seed=4)
    p32, p16 = dict(m32.named_parameters()), dict(m16.named_parameters())
    assert all(torch.equal(p32[k], v) for k, v in again.named_parameters())
    assert all(torch.equal(p32[k].to(torch.bfloat16), v) for k, v in p16.items())
    assert not torch.equal(p32["model.layers.0.mlp.up_proj.weight"], dict(other.named_parameters())[
        "model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(p32["model.norm.weight"], torch.ones(64))
    # the rotary tables were computed, not left as uninitialised memory
    assert torch.isfinite(m32.model.rotary_emb.inv_freq).all() and float(m32.model.rotary_emb.inv_freq[0]) == 1.0


def test_tokenizer_decodes_every_id_of_the_model():
    model, tok = random_model("llama-mini")
    assert len(tok) == model.config.vocab_size
    assert tok.decode([model.config.vocab_size - 1]) == f"<r{model.config.vocab_size - 1}>"
    assert tok.decode(tok("héllo", add_special_tokens=False).input_ids) == "héllo"


def test_load_model_builds_random_and_tiny_models_in_the_dtype_asked():
    handle = load_model("random:llama-mini", device="cpu", dtype="bfloat16")
    assert handle.dtype == torch.bfloat16 and next(handle.model.parameters()).dtype == torch.bfloat16
    assert handle.model_id == "random:llama-mini" and handle.arch.tied_lm_head
    ids = handle.tokenizer("abc", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert handle.model(input_ids=ids).logits.shape == (1, ids.shape[1], 1000)
    tiny = load_model("tiny:gpt2", device="cpu", dtype="float16")
    assert tiny.dtype == torch.float16 and tiny.arch.model_type == "gpt2"
    with pytest.raises(ModelLoadError, match="llama-8b"):
        load_model("random:llama-70b", device="cpu")
    with pytest.raises(ModelLoadError, match="multi"):
        load_model("random:llama-mini", device="multi")


def test_auto_dtype_per_device():
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("mps")) == torch.float32
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16


@CUDA
def test_auto_dtype_on_cuda_is_half_precision():
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert resolve_dtype("auto", torch.device("cuda")) == expected


@CUDA
def test_random_model_is_built_on_the_gpu_without_host_copies():
    import psutil

    rss = psutil.Process().memory_info().rss
    model, _ = random_model("llama-1b", "cuda", torch.bfloat16)
    assert all(p.device.type == "cuda" for p in model.parameters())
    # 2.5 GB of bfloat16 weights; a build that went through host memory would leave far more behind
    assert psutil.Process().memory_info().rss - rss < 1 << 30
