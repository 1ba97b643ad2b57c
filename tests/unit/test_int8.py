"""Weight-only int8 (issue #37): the kernel's products, the GGUF codes' exactness, the model surgery, the setting.

The kernel is the compiled C one where this machine has a C compiler (CI's has), else the torch path; both are
checked against a float64 product of the same dequantised weights, and a row's result must not depend on the
rows sent with it (the many-users batch relies on that).
"""
import numpy as np
import pytest
import torch

from steer_ui.model import int8 as int8_mod
from steer_ui.model.gguf_codes import _codes_and_scales, hf_name
from steer_ui.model.int8 import (Int8Embedding, Int8Linear, Int8Weight, kernel_available, load_codes, per_channel,
                                 quantise_model, save_codes)
from steer_ui.model.loading import ModelLoadError, load_model
from steer_ui.model.precision import PrecisionError, check_weights, within_default_bound


def _weight(out_features, in_features, group, affine, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (out_features, in_features), generator=g, dtype=torch.int8)
    scale = torch.rand(out_features, in_features // group, generator=g) * 0.02
    offset = torch.randn(out_features, in_features // group, generator=g) * 0.01 if affine else None
    return Int8Weight(codes, scale, offset, group)


CASES = [(300, 640, 32, False), (300, 640, 32, True), (257, 2048, 16, False), (64, 40, 8, True),
         (33, 72, 72, False)]  # GGUF's Q8_0 / Q4_K / Q6_K groups, a width the vector loops end short of, per row


@pytest.mark.parametrize("out_features,in_features,group,affine", CASES)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 24])
def test_the_product_is_the_dequantised_weights_product(out_features, in_features, group, affine, rows):
    w = _weight(out_features, in_features, group, affine)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(1))
    expected = (x.double() @ w.dequantise().double().T).float()
    got = w.matmul(x)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-4 * float(expected.abs().max()))


def test_dequantise_is_a_multiply_then_an_add_as_a_gguf_reader_rounds():
    w = _weight(8, 64, 32, True)
    manual = (w.codes.float().view(8, 2, 32) * w.scale[..., None] + w.offset[..., None]).view(8, 64)
    assert torch.equal(w.dequantise(), manual)
    ids = torch.tensor([[3, 5], [0, 7]])
    assert torch.equal(w.rows(ids), manual[ids])
    assert torch.equal(w.slice(2, 6).dequantise(), manual[2:6])


def test_a_rows_result_does_not_depend_on_the_rows_sent_with_it():
    w = _weight(1000, 640, 32, True)
    x = torch.randn(24, 640, generator=torch.Generator().manual_seed(2))
    together = w.matmul(x)
    for i in (0, 3, 4, 7, 23):
        assert torch.equal(w.matmul(x[i:i + 1]), together[i:i + 1]), i
    assert torch.equal(w.matmul(x[4:9]), together[4:9])


def test_many_rows_agree_with_few_on_the_kernel_and_on_torch_slabs():
    """Past KERNEL_MAX_ROWS the AVX-512 kernel keeps the product and the AVX2 one hands it to torch on
    dequantised slabs; a caller that pauses between slabs always gets the slabs (and its pauses)."""
    w = _weight(500, 640, 32, False)
    x = torch.randn(int8_mod.KERNEL_MAX_ROWS + 1, 640, generator=torch.Generator().manual_seed(3))
    few = torch.cat([w.matmul(x[i:i + 8]) for i in range(0, x.shape[0], 8)])
    pauses = []
    for many in (w.matmul(x), w.matmul(x, pause=lambda: pauses.append(1))):
        assert torch.allclose(many, few, rtol=1e-5, atol=1e-5 * float(few.abs().max()))
    assert pauses  # the paused product ran on slabs


def test_gradients_flow_to_the_input_through_the_dequantised_weights():
    w = _weight(20, 64, 32, True)
    x = torch.randn(3, 64, requires_grad=True)
    w.matmul(x).sum().backward()
    assert torch.allclose(x.grad, w.dequantise().sum(0).expand(3, -1), atol=1e-6)


def test_the_c_kernel_builds_here():
    """With a C compiler on the PATH (.ci/run installs gcc) the kernel must build; without one the torch path
    serves (every other test here then checks that path) and this test says so."""
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) here: the torch path serves int8")
    assert kernel_available()


def _avx512_here() -> bool:
    from pathlib import Path as _Path

    info = _Path("/proc/cpuinfo")
    return info.is_file() and " avx512f " in info.read_text(errors="replace")


@pytest.mark.parametrize("path", ["native", "avx2"])
@pytest.mark.parametrize("out_features,in_features,group,affine", CASES)
def test_both_vector_paths_give_the_product_and_row_independent_sums(path, out_features, in_features, group, affine):
    """The kernel has an AVX-512 path (tiles of 4 weight rows x 4 input rows) and an AVX2 one; -march=native
    picks one, and CI's machine may have either.  On an AVX-512 machine the AVX2 one is built too
    (-mno-avx512f), so both are checked wherever the tests run."""
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) here: the torch path serves int8")
    if path == "avx2" and not _avx512_here():
        pytest.skip("this CPU has no AVX-512: the native build is the AVX2 path, checked by the 'native' case")
    fn = int8_mod._kernel(("-mno-avx512f",) if path == "avx2" else ())
    assert fn is not None
    w = _weight(out_features, in_features, group, affine, seed=5)
    x = torch.randn(13, in_features, generator=torch.Generator().manual_seed(6))
    together = w.kernel_product(fn, x)
    expected = (x.double() @ w.dequantise().double().T).float()
    assert torch.allclose(together, expected, rtol=1e-5, atol=1e-4 * float(expected.abs().max()))
    for lo, hi in ((0, 1), (1, 4), (4, 9), (12, 13), (3, 13)):  # 1..10 rows: every tile shape and the buffer
        assert torch.equal(w.kernel_product(fn, x[lo:hi].contiguous()), together[lo:hi]), (lo, hi)



@pytest.mark.parametrize("rows", [1, 5, 13])
def test_an_outputs_sum_does_not_depend_on_the_outputs_computed_beside_it(rows):
    """The AVX-512 path reduces a full tile's four outputs with shared shuffles and one alone by
    ``_mm512_reduce_add_ps``: both must take the same tree, so an output computed in a tile of four (the whole
    weight) equals it computed alone (a one-row slice), bit for bit, for every register and buffered tile."""
    fn = int8_mod._kernel()
    if fn is None:
        pytest.skip("no C compiler (cc) here: the torch path serves int8")
    for out_features, in_features, group, affine in CASES[:3]:
        w = _weight(out_features, in_features, group, affine, seed=7)
        x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(8))
        together = w.kernel_product(fn, x)
        for i in (0, 1, 2, 3, 4, 130, out_features - 1):
            alone = w.slice(i, i + 1).kernel_product(fn, x)
            assert torch.equal(alone, together[:, i:i + 1]), (out_features, i)

def test_per_channel_rounding_is_within_half_a_step():
    w = torch.randn(50, 96, generator=torch.Generator().manual_seed(4))
    q = per_channel(w)
    assert q.group == 96 and q.offset is None and not q.exact
    assert ((q.dequantise() - w).abs() <= q.scale / 2 + 1e-7).all()


def test_codes_survive_the_cache_file(tmp_path):
    codes = {"a.b": _weight(10, 64, 32, True), "c": _weight(6, 32, 16, False)}
    codes["c"].exact = True
    save_codes(codes, tmp_path / "codes.safetensors")
    back = load_codes(tmp_path / "codes.safetensors")
    assert set(back) == set(codes)
    for name, w in codes.items():
        assert torch.equal(back[name].dequantise(), w.dequantise())
        assert (back[name].group, back[name].exact) == (w.group, w.exact)
    (tmp_path / "bad.safetensors").write_bytes(b"not safetensors")
    assert load_codes(tmp_path / "bad.safetensors") is None
    assert load_codes(tmp_path / "missing.safetensors") is None


# ------------------------------------------------------------------ a GGUF's own codes
def _random_blocks(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """Random raw blocks of a GGUF type with finite, moderate fp16 scales."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = getattr(GGMLQuantizationType, kind)
    size = GGML_QUANT_SIZES[qtype][1]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    halves = {"Q8_0": [0], "Q5_0": [0], "Q4_K": [0, 2], "Q6_K": [size - 2]}[kind]
    for at in halves:
        blocks[:, at:at + 2] = rng.uniform(1e-3, 5e-2, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return blocks


@pytest.mark.parametrize("kind,group", [("Q8_0", 32), ("Q5_0", 32), ("Q4_K", 32), ("Q6_K", 16)])
def test_gguf_codes_reproduce_ggufs_own_dequantisation_bit_for_bit(kind, group):
    from gguf import GGMLQuantizationType, quants

    blocks = _random_blocks(kind, 12)
    codes, scale, offset, g = _codes_and_scales(kind, blocks)
    assert g == group and codes.min() >= -128 and codes.max() <= 127
    assert np.array_equal(codes, np.round(codes))
    rows = 3  # 12 blocks as 3 rows
    w = Int8Weight(torch.from_numpy(codes.reshape(rows, -1).astype(np.int8)),
                   torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, -1))),
                   None if offset is None else torch.from_numpy(np.ascontiguousarray(offset.reshape(rows, -1))),
                   g, exact=True)
    expected = quants.dequantize(blocks, getattr(GGMLQuantizationType, kind)).reshape(rows, -1)
    assert torch.equal(w.dequantise(), torch.from_numpy(expected))


def test_gguf_names_map_to_the_modules_transformers_builds():
    assert hf_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj"
    assert hf_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj"
    assert hf_name("token_embd.weight") == "model.embed_tokens"
    assert hf_name("blk.0.attn_norm.weight") is None


# ------------------------------------------------------------------ the model, the setting
def test_quantise_model_replaces_every_linear_and_ties_the_embedding(tiny):
    handle = load_model("tiny:gemma3", device="cpu", weights="int8")
    model = handle.model
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert isinstance(emb, Int8Embedding) and isinstance(head, Int8Linear) and emb.int8 is head.int8
    assert handle.arch.tied_lm_head and handle.weights == "int8" and not handle.int8_exact
    assert handle.facts()["parameters"] == tiny("gemma3").facts()["parameters"]
    cost = handle.precision_cost
    assert cost["prompts"] == 6 and 0 < cost["max_abs_dp"] < 0.1 and cost["rounded"] > 0


def test_int8_logits_follow_the_float32_model_within_the_rounding(tiny):
    f32 = tiny("llama")
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.no_grad():
        before = f32.model(ids).logits
    import copy

    model = copy.deepcopy(f32.model)
    made = quantise_model(model)
    assert made["rounded"] and not made["exact"]
    with torch.no_grad():
        after = model(ids).logits
    assert (after - before).abs().max() < 0.05 * before.abs().max()
    assert not torch.equal(after, before)  # it is really int8


def test_the_setting_is_checked():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert check_weights("auto", cpu, "auto") == "auto"
    assert check_weights("int8", cpu, "float32") == "int8"
    with pytest.raises(PrecisionError, match="CPU setting"):
        check_weights("int8", cuda, "auto")
    with pytest.raises(PrecisionError, match="unknown weights"):
        check_weights("int4", cpu, "auto")
    with pytest.raises(PrecisionError, match="computes in float32"):
        check_weights("int8", cpu, "bfloat16")
    with pytest.raises(ModelLoadError, match="unknown weights"):
        load_model("tiny:llama", device="cpu", weights="fp8")


def test_bfloat16_weights_mean_a_bfloat16_model_and_auto_keeps_random_models_float32():
    assert load_model("tiny:llama", device="cpu", weights="bfloat16").dtype == torch.bfloat16
    handle = load_model("tiny:llama", device="cpu")
    assert handle.weights == "float32" and handle.dtype == torch.float32


def test_the_default_bound():
    assert within_default_bound({"max_abs_dp": 0.005, "top1_agree": 6, "prompts": 6})
    assert not within_default_bound({"max_abs_dp": 0.02, "top1_agree": 6, "prompts": 6})
    assert not within_default_bound({"max_abs_dp": 0.001, "top1_agree": 5, "prompts": 6})
    assert not within_default_bound(None)


def test_the_unembedding_facts_and_projection_read_the_codes(tiny):
    from steer_ui import concepts
    from steer_ui.model.analysis import vocab_projection

    handle = load_model("tiny:gemma3", device="cpu", weights="int8")
    facts = concepts.lm_head_facts(handle)
    int8 = handle.arch.int8_unembedding
    assert facts["bytes"] == int8.nbytes() and facts["dtype"].startswith("int8")
    assert 0 < facts["share"] <= 1 and facts["model_parameters"] == tiny("gemma3").parameter_count()
    v = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(6))
    table = vocab_projection(handle, v, top_k=5)
    expected = int8.dequantise() @ v
    assert table["token_id"].tolist()[:5] == torch.topk(expected, 5).indices.tolist()


def test_a_training_loop_dequantises_the_unembedding_once_and_lets_it_go():
    handle = load_model("tiny:gemma3", device="cpu", weights="int8")
    arch = handle.arch
    assert arch.unembedding is not arch.unembedding  # outside a loop: a fresh copy per read
    with arch.dense_unembedding():
        dense = arch.unembedding
        assert arch.unembedding is dense and torch.equal(dense, arch.int8_unembedding.dequantise())
        with arch.dense_unembedding():  # nested: the same copy
            assert arch.unembedding is dense
        assert arch.unembedding is dense
    assert arch.unembedding is not dense


def test_a_kept_cost_belongs_to_the_kernel_that_measured_it(tmp_path):
    """int8's cost against float32 depends on the order of the kernel's sums: a cost measured by another
    build (a changed kernel source, another CPU) is measured again at the next load, not shown."""
    from steer_ui.model.int8 import kernel_identity
    from steer_ui.model.precision import read_cost, write_cost

    path = tmp_path / "int8_cost.json"
    write_cost(path, {"max_abs_dp": 1e-6, "top1_agree": 6, "prompts": 6, "kernel": kernel_identity()})
    assert read_cost(path, kernel_identity())["max_abs_dp"] == 1e-6
    assert read_cost(path, "int8_kernel-another-build") is None
    assert read_cost(path) is not None  # a reader that does not ask about the kernel
    path.write_text("{not json")
    assert read_cost(path, kernel_identity()) is None


@pytest.mark.parametrize("weights", ["int8", "float32"])
def test_an_unembedding_that_pauses_between_slices_gives_the_same_logits_bit_for_bit(monkeypatch, weights):
    """The decode engine slices the unembedding so a slider move waits at most one slice.  On int8 weights the
    slices (7 rows here, not a multiple of the kernel's tiles of 4) change no logit: each vocabulary row is its
    own sum.  A float32 BLAS blocks its sums by the matrix's size, so there only to float32's rounding."""
    from steer_ui.model import architecture

    handle = load_model("tiny:gemma3", device="cpu", weights=weights)
    arch = handle.arch
    normed = torch.randn(3, arch.hidden_size, generator=torch.Generator().manual_seed(8))
    whole = arch.logits(normed)
    monkeypatch.setattr(architecture, "PAUSE_VOCAB_ROWS", 7)
    pauses = []
    sliced = arch.logits(normed, pause=lambda: pauses.append(1))
    assert len(pauses) == -(-whole.shape[-1] // 7) > 1
    if weights == "int8":
        assert torch.equal(sliced, whole)
    else:
        torch.testing.assert_close(sliced, whole, rtol=1e-5, atol=1e-6)
