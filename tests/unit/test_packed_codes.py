"""Packed 5-bit codes (issue #50): a GGUF's Q5_0 and Q4_K codes, which fit in [-16, 15], kept at 5 bytes per 8
(``int8.pack5``) and read by the kernel's AVX-512 VBMI products (``int5_matmul`` in int8_kernel.c): the same
integers as the int8 codes, so the same sums, bit for bit, from 5/8 of the bytes.  The AVX2 path does not read
them, so on a machine without AVX-512 VBMI nothing is packed.
"""
import math

import pytest
import torch

from steer_ui.model import int8 as int8_mod
from steer_ui.model.int8 import Int8Weight, int8_weights, pack5, pack_small_codes, quantise_model, unpack5
from steer_ui.model.generation import DecodeBatch
from steer_ui.model.handle import from_model
from steer_ui.tiny import tiny_model
from test_static_decode import SCHEDULE, _run, _specs


def _reads_packed_codes() -> bool:
    fn = int8_mod._kernel()
    return fn is not None and fn.int5 is not None


needs_avx512 = pytest.mark.skipif(not _reads_packed_codes(),
                                  reason="no C compiler or no AVX-512 here: packed codes are not read")


def _weight(out_features, in_features, group, affine, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-16, 16, (out_features, in_features), generator=g, dtype=torch.int8)
    scale = torch.rand(out_features, in_features // group, generator=g) * 0.02
    offset = torch.randn(out_features, in_features // group, generator=g) * 0.01 if affine else None
    return Int8Weight(codes, scale, offset, group)


def test_packing_keeps_every_code_from_minus_16_to_15():
    codes = torch.arange(-16, 16, dtype=torch.int8).repeat(3, 4)[:, torch.randperm(128)].contiguous()
    packed = pack5(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 128 // 8 * 5)
    assert torch.equal(unpack5(packed, 128), codes)


# Q5_0's groups of 32, Q4_K's affine groups of 32, groups of 16; an output count no tile of 4 divides
CASES = [(300, 640, 32, False), (301, 640, 32, True), (257, 2048, 16, False), (5, 64, 16, True), (7, 128, 64, False)]


@needs_avx512
@pytest.mark.parametrize("out_features,in_features,group,affine", CASES)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 7, 24])
def test_packed_products_equal_the_int8_products_bit_for_bit(out_features, in_features, group, affine, rows):
    fn = int8_mod._kernel()
    w = _weight(out_features, in_features, group, affine, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(1))
    on_codes = w.kernel_product(fn, x)
    w.packed = pack5(w.codes)
    on_packed = w.kernel_product(fn, x)
    assert torch.equal(on_packed, on_codes)
    expected = (x.double() @ w.dequantise().double().T).float()
    assert torch.allclose(on_packed, expected, rtol=1e-5, atol=1e-4 * float(expected.abs().max()))


@needs_avx512
def test_a_rows_result_on_packed_codes_does_not_depend_on_the_rows_sent_with_it():
    fn = int8_mod._kernel()
    w = _weight(261, 640, 32, True, seed=3)
    w.packed = pack5(w.codes)
    x = torch.randn(13, 640, generator=torch.Generator().manual_seed(4))
    together = w.kernel_product(fn, x)
    for lo, hi in ((0, 1), (1, 4), (4, 9), (12, 13), (3, 13)):  # every tile shape and the dequantised buffer
        assert torch.equal(w.kernel_product(fn, x[lo:hi].contiguous()), together[lo:hi]), (lo, hi)
    half = w.slice(0, 130)  # a slice of output rows keeps its packed rows
    assert torch.equal(half.kernel_product(fn, x), together[:, :130])


def _small_codes_gemma3():
    """A 6-block tiny Gemma 3 with int8 weights whose block codes are rounded to 5 bits in groups of 32 (as a
    GGUF's Q5_0 are); the tied unembedding keeps 8-bit codes."""
    model, tok = tiny_model("gemma3", layers=6)
    quantise_model(model)
    head = model.get_output_embeddings().int8
    for w in int8_weights(model):
        if w is not head:  # a scale per group of 32, as a GGUF's
            w.scale = (w.scale * 8.0).expand(-1, w.codes.shape[1] // 32).contiguous()
            w.group = 32
            w.codes.copy_(torch.round(w.codes.float() / 8.0).clamp(-16, 15).to(torch.int8))
    return model, tok


def test_only_codes_within_5_bits_are_packed_and_only_where_the_avx512_path_reads_them(monkeypatch):
    model, _ = _small_codes_gemma3()
    weights = int8_weights(model)
    monkeypatch.setenv("STEER_UI_PACKED_CODES", "0")
    assert pack_small_codes(model) == 0 and all(w.packed is None for w in weights)
    monkeypatch.delenv("STEER_UI_PACKED_CODES")
    packed = pack_small_codes(model)
    if not _reads_packed_codes():
        assert packed == 0
        return
    head = model.get_output_embeddings().int8
    assert head.packed is None  # codes of 8 bits
    assert packed == len(weights) - 1 and all(w.packed is not None for w in weights if w is not head)
    assert all(w.read_bytes() < w.codes.numel() for w in weights if w is not head)
    if int8_mod._kernel(("-mno-avx512f",)) is not None:
        assert int8_mod._kernel(("-mno-avx512f",)).int5 is None  # the AVX2 build never gets packed codes


@needs_avx512
@pytest.mark.parametrize("decode", ["fused", "dynamic"])
def test_a_decode_on_packed_codes_gives_the_same_tokens_and_numbers_bit_for_bit(decode):
    """The fused block kernel (a negative group tells it a weight is packed) and the torch path's products."""
    model, tok = _small_codes_gemma3()
    handle = from_model(model, tok, model_id="tiny:gemma3")
    specs = _specs(handle)
    _, unpacked = _run(handle, decode, SCHEDULE, specs)
    assert pack_small_codes(model) > 0
    batch, packed = _run(handle, decode, SCHEDULE, specs)
    assert batch.decode_path["path"] == decode
    for a_result, b_result in zip(packed, unpacked):
        for side in ("unsteered", "steered"):
            a, b = getattr(a_result, side), getattr(b_result, side)
            assert [(t.token_id, t.logprob, t.alternatives) for t in a.tokens] == \
                [(t.token_id, t.logprob, t.alternatives) for t in b.tokens]
            assert all(math.isfinite(t.logprob) for t in a.tokens)
    assert DecodeBatch(handle, decode=decode).decode_path["path"] == decode
