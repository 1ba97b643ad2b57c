"""Integer products on int16 activations (W8A16, issue #50): ``w8a16_kernel.c`` against a float64 reference.

The bound is derived, not tuned.  Each row is rounded with one scale ``xs = max|x| / 32767``, so every element
moves by at most ``xs / 2`` and the product (the dequantised weights times the rounded row; the offsets multiply
the rounded rows' group sums) by at most ``xs / 2 · Σ_k |W[n, k]|``.  The int32 sums are exact (converted to float
at each group's end and every 512 inputs, so whole-row groups cannot overflow), so beyond that only float32's own
sums add: a slack of 1e-5 of ``Σ |x| |W|``.  Every path this machine can run is built and checked: weights packed
once (``w8a16_pack``) take AMX's tiles in the native build of an AMX machine and VNNI's ``vpdpbusd`` in a VNNI
build without the tiles (``-mno-amx-*``, or the native build elsewhere), and the same builds' unpacked kernel is
checked beside them; on an AVX-512 machine also the build without VNNI (``-mno-avx512vnni``), AVX2's
(``-mno-avx512f``) and plain C's (``-mno-avx2`` too); and a row's result must not depend on the rows sent with it,
bit for bit.
"""
import shutil

import pytest
import torch

from steer_ui.model import int8 as int8_mod
from steer_ui.model.int8 import Int8Weight
from rounded_activations import (NO_TILES, assert_within_rounding, built, random_weight as _weight,
                                 rows_with_an_outlier)

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc): no W8A16 kernel here")

BUILDS = {
    "native": ((), None),
    "avx512-vnni": (NO_TILES, " avx512_vnni "),
    "avx512bw": (("-mno-avx512vnni", *NO_TILES), " avx512bw "),
    "avx2": (("-mno-avx512f", *NO_TILES), " avx2 "),
    "c": (("-mno-avx2", "-mno-avx512f", *NO_TILES), None),
}


def _build(name: str):
    return built(int8_mod._w8a16_kernel, name, *BUILDS[name])


def _products(w: Int8Weight, x: torch.Tensor, fn) -> list:
    """``x @ W.T`` by each path ``fn``'s build has for ``w``: on the packed weight where it packs (the product the
    switch takes), and by the unpacked kernel, which a group the packed path does not take still reaches."""
    out = [w.w8a16_product(x, fn)]
    if w.packed is not None:
        out.append(w.kernel_product(fn, x.contiguous()))
    return out


# GGUF's groups: Q8_0 (32), Q4_K (32, affine: codes 0..15), Q6_K (16, codes -32..31), per output row (the group
# is the whole row, 640 and 2048 wide: past 512 inputs, where one int32 chunk ends); odd output counts (tile
# edges), input widths ending on half a 32-code vector (48, 80, 208), a multiple-of-32 group (96, affine)
CASES = [(300, 640, 32, False, -128, 128), (257, 640, 32, True, 0, 16), (129, 2048, 16, False, -32, 32),
         (33, 48, 16, True, -128, 128), (7, 80, 16, False, -128, 128), (65, 208, 16, True, 0, 16),
         (5, 640, 640, False, -127, 128), (3, 2048, 2048, False, -127, 128), (9, 192, 96, True, -128, 128)]


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("out_features,in_features,group,affine,low,high", CASES)
@pytest.mark.parametrize("rows", [1, 3, 8, 24, 65])
def test_the_product_is_within_the_activations_rounding(build, out_features, in_features, group, affine, low, high,
                                                        rows):
    fn = _build(build)
    w = _weight(out_features, in_features, group, affine, seed=rows, low=low, high=high)
    x = rows_with_an_outlier(rows, in_features, out_features)
    for got in _products(w, x, fn):
        assert_within_rounding(w, x, got, 32767)


def test_whole_row_groups_do_not_overflow_int32():
    """Every activation at the row's maximum (32767 after rounding) and every code -128, 2048 inputs in one
    group: 2048 · 32767 · 128 is 4 times int32's range, so only the 512-input chunks keep the sum right."""
    for build in BUILDS:
        fn = _build(build)
        w = Int8Weight(torch.full((3, 2048), -128, dtype=torch.int8), torch.full((3, 1), 0.5), None, 2048)
        x = torch.ones(2, 2048)
        expected = -128 * 0.5 * 2048
        assert torch.equal(w.w8a16_product(x, fn), torch.full((2, 3), expected)), build


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("out_features,in_features,group,affine,low,high", CASES[:4] + CASES[6:7])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(build, out_features, in_features, group, affine, low,
                                                              high):
    fn = _build(build)
    w = _weight(out_features, in_features, group, affine, seed=9, low=low, high=high)
    x = torch.randn(29, in_features, generator=torch.Generator().manual_seed(10))
    for path, together in enumerate(_products(w, x, fn)):
        for lo, hi in ((0, 1), (1, 4), (4, 13), (12, 13), (3, 29), (2, 11), (28, 29)):
            assert torch.equal(_products(w, x[lo:hi].contiguous(), fn)[path], together[lo:hi]), (path, lo, hi)


def test_the_offsets_meet_the_rounded_rows():
    """With affine codes all of one sign (Q4_K's 0..15) the rounding must meet the centred weights: the product
    equals the dequantised weights times the rounded row, up to float32's sums."""
    fn = _build("native")
    w = _weight(64, 640, 32, True, seed=6, low=0, high=16)
    x = torch.randn(4, 640, generator=torch.Generator().manual_seed(7))
    top = x.abs().amax(1, keepdim=True)
    rounded = torch.round(x * (32767 / top)).double() * (top / 32767).double()
    expected = rounded @ w.dequantise().double().T
    got = w.w8a16_product(x, fn).double()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_zero_and_non_finite_rows():
    for build in BUILDS:
        fn = _build(build)
        w = _weight(20, 64, 32, True, seed=5)
        x = torch.zeros(3, 64)
        x[1, 3] = float("nan")
        x[2, 5] = float("inf")
        got = w.w8a16_product(x, fn)
        assert torch.equal(got[0], torch.zeros(20)), build  # no activations: nothing, offsets included
        assert not torch.isfinite(got[1]).any() and not torch.isfinite(got[2]).any(), build


@pytest.mark.parametrize("build", ["avx512-vnni", "native"])
def test_groups_a_vector_path_cannot_take_are_refused_not_guessed(build):
    """Groups of 8 or 48 (not GGUF's) are not the unpacked AVX-512 path's: the caller then keeps today's product.
    The packed path takes any group of a multiple of 4 up to 64, so there they are multiplied, within the
    rounding; a group of 80 is neither's."""
    fn = _build(build)
    if fn.path not in ("avx512-vnni", "avx512bw"):
        pytest.skip("only the AVX-512 paths refuse these")
    for group in (8, 48, 80):
        w = _weight(10, 240, group, False)
        x = torch.randn(2, 240)
        assert w.kernel_product(fn, x) is None
        if fn.packed and group <= 64:
            assert_within_rounding(w, x, w.w8a16_product(x, fn), 32767)
        else:
            assert w.w8a16_product(x, fn) is None


def test_the_switch_routes_every_product_and_survives_slices():
    """``Int8Weight.w8a16`` (set by the loader within the bound) sends every product, any row count, through
    the kernel; a slice keeps it; a shape the kernel refuses keeps today's product."""
    fn = _build("native")
    w = _weight(70, 640, 32, False, seed=11)
    x = torch.randn(9, 640, generator=torch.Generator().manual_seed(12))
    w.w8a16 = True
    for rows in (1, 3, 9):
        assert torch.equal(w.matmul(x[:rows]), w.w8a16_product(x[:rows].contiguous(), fn))
    assert w.slice(10, 20).w8a16 and torch.equal(w.slice(10, 20).matmul(x), w.w8a16_product(x, fn)[:, 10:20])
    if fn.path in ("avx512-vnni", "avx512bw"):
        odd = _weight(10, 160, 80, False)  # a group neither the unpacked nor the packed path takes
        odd.w8a16 = True
        assert torch.equal(odd.matmul(x[:2, :160]), odd.kernel_product(int8_mod._kernel(), x[:2, :160].contiguous()))


def test_the_model_line_names_the_integer_path_the_loader_switches_on_and_only_that():
    """The line shows the cost of the arithmetic in use: W8A8 where the loader turns it on, else W8A16 on the
    unembedding where that is within the bound; W8A16 for every product, measured within the bound but left off
    by the loader without AMX's tiles (precision.AUTO_INTEGER_PATHS), is named only where the loader recorded it
    in use (``in_use``, on a machine with the tiles)."""
    from steer_ui.ui.model_tab import weights_text

    measured = {"max_abs_dp": 2e-6, "top1_agree": 6, "prompts": 6,
                "w8a8": {"on": True, "max_abs_dp": 0.004, "top1_agree": 6, "prompts": 6},
                "w8a16": {"on": True, "max_abs_dp": 0.00042, "top1_agree": 6, "prompts": 6},
                "w8a16_unembedding": {"on": True, "max_abs_dp": 0.00014, "top1_agree": 6, "prompts": 6}}
    line = weights_text("en", {"weights": "int8", "int8_exact": True, "precision_cost": measured})
    assert "8-bit activations" in line and "0.004" in line
    measured["w8a8"]["on"] = False
    line = weights_text("en", {"weights": "int8", "int8_exact": True, "precision_cost": measured})
    assert "unembedding's products on 16-bit activations" in line and "0.00014" in line and "0.00042" not in line
    measured["in_use"] = "w8a16"  # the loader's choice where the tiles take every product
    line = weights_text("en", {"weights": "int8", "int8_exact": True, "precision_cost": measured})
    assert "integer products on 16-bit activations" in line and "0.00042" in line and "0.00014" not in line
    del measured["in_use"]
    measured["w8a16_unembedding"]["on"] = False
    line = weights_text("en", {"weights": "int8", "int8_exact": True, "precision_cost": measured})
    assert "activations" not in line and "2e-06" in line and "0.00042" not in line


def test_the_unembeddings_cost_is_measured_with_only_its_switch_on_and_put_back():
    """precision.w8a16_unembedding_cost turns W8A16 on for the unembedding alone while it measures (the block
    products keep float activations) and leaves every switch as it found it; rounded codes are not measured."""
    from steer_ui.model import precision
    from steer_ui.model.int8 import int8_weights
    from steer_ui.model.loading import load_model

    handle = load_model("tiny:gemma3", device="cpu", weights="int8")
    reference = precision.fingerprint(handle)
    unembedding = handle.arch.int8_unembedding
    seen = []
    real = int8_mod.Int8Weight.w8a16_product

    def spy(self, flat, fn=None):
        seen.append(self.codes.untyped_storage().data_ptr())  # a slice of the unembedding shares its storage
        return real(self, flat, fn)

    int8_mod.Int8Weight.w8a16_product = spy
    try:
        measured = precision.w8a16_unembedding_cost(handle, reference, exact_codes=True)
    finally:
        int8_mod.Int8Weight.w8a16_product = real
    assert measured["status"] == "measured" and measured["max_abs_dp"] >= 0
    assert seen and set(seen) == {unembedding.codes.untyped_storage().data_ptr()}
    assert {w.w8a16 for w in int8_weights(handle.model)} == {False}
    assert precision.w8a16_unembedding_cost(handle, reference, exact_codes=False)["on"] is False


@pytest.mark.parametrize("switch", ["w8a16", "w8a8"])
def test_a_long_integer_product_pauses_between_slabs_with_the_same_numbers(monkeypatch, switch):
    """A product past KERNEL_MAX_ROWS with a ``pause`` (a prefill, an extraction) runs in slabs of output rows and
    pauses between them for interactive work, as the torch path does; each output is formed alone, so the slabs
    give the one call's numbers bit for bit."""
    monkeypatch.setattr(int8_mod, "_SLAB_ROWS", 128)
    w = _weight(500, 640, 32, True)
    setattr(w, switch, True)
    x = torch.randn(int8_mod.KERNEL_MAX_ROWS + 9, 640, generator=torch.Generator().manual_seed(5))
    pauses = []
    paused = w.matmul(x, pause=lambda: pauses.append(1))
    assert len(pauses) == 4  # 500 outputs in slabs of 128
    assert torch.equal(paused, w.matmul(x))
    assert torch.equal(paused[:, 130:140], w.slice(130, 140).matmul(x))


def _packed(build: str = "native"):
    fn = _build(build)
    if fn.packed is None:
        pytest.skip("no packed int16 path in this build (the CPU lacks AMX's tiles and AVX-512 VNNI)")
    return fn


@pytest.mark.parametrize("build", ["native", "avx512-vnni"])
@pytest.mark.parametrize("group", [16, 32, 64])
@pytest.mark.parametrize("rows", [3, 8])  # VNNI's two loops: rows innermost (under 4 rows), codes held (4 and more)
def test_the_packed_byte_split_is_exact_at_the_extremes(group, build, rows):
    """An int16 code splits into a signed high byte and an unsigned low one, each its own product (a tile's, or
    VNNI's vpdpbusd on the codes + 128, corrected by the high bytes' sum); at the codes' extremes (every
    activation at +-32767, every weight code -128 or 127, groups up to 64) the shifted high sum is at its
    largest, and the result must still be the exact integer sum times the scales."""
    fn = _packed(build)
    k = 4 * group
    codes = torch.where(torch.arange(k) % 3 == 0, -128, 127).to(torch.int8).repeat(5, 1)
    codes[1] = -128  # every product of row 1 at the extreme
    w = Int8Weight(codes, torch.full((5, 4), 0.25), None, group)
    x = torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0).repeat(rows, 1)
    x[1] = 1.0  # row 1 of the activations all at +32767
    codes_x = torch.round(x / (x.abs().amax(1, keepdim=True) / 32767))
    exact = (codes_x.double() @ codes.double().T) * 0.25 * (1 / 32767)
    got = w.w8a16_product(x, fn)
    assert w.packed is not None
    assert torch.allclose(got.double(), exact, rtol=2e-7, atol=0), (got, exact)
    assert float(got[1, 1]) == pytest.approx(-128 * 0.25 * k, rel=1e-7)


def test_a_weight_is_packed_once_and_its_tile_slices_share_the_packing():
    """The packed path reads a packed copy (w8a16_pack); a slice that starts on a 16-row block reads views of it,
    not a packing of its own (the unembedding is multiplied in slabs of rows); any slice gives its rows'
    numbers."""
    _packed()
    w = _weight(100, 640, 32, True, seed=3, low=0, high=16)
    w.w8a16 = True
    x = torch.randn(5, 640, generator=torch.Generator().manual_seed(4))
    whole = w.matmul(x)
    packed = w.packed
    assert packed is not None and packed[1].shape == (7, 20, 16 * 32)
    part = w.slice(32, 90)
    assert part.packed[1].data_ptr() == packed[1][2].data_ptr()
    assert torch.equal(part.matmul(x), whole[:, 32:90])
    assert torch.equal(w.slice(5, 37).matmul(x), whole[:, 5:37])  # off a tile's edge: packed apart, same numbers
    assert w.packed is packed


def test_amxs_tiles_and_vnnis_packed_path_give_the_same_bits():
    """The two packed paths form the same exact int32 sum per group and share the float epilogue, so a machine's
    results do not depend on whether Linux grants the tiles; checked where the CPU has them."""
    tiles, vnni = _packed("native"), _packed("avx512-vnni")
    if tiles.packed != "amx":
        pytest.skip("no AMX tiles here to compare VNNI's packed path with")
    assert vnni.packed == "avx512-vnni"
    for out_features, in_features, group, affine, low, high in CASES[:6]:
        w = _weight(out_features, in_features, group, affine, seed=2, low=low, high=high)
        x = rows_with_an_outlier(19, in_features, 3)
        assert torch.equal(w.w8a16_product(x, tiles), w.w8a16_product(x, vnni)), (out_features, in_features, group)
