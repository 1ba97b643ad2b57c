"""Integer products on int8 activations (W8A8, issue #50): ``w8a8_kernel.c`` against a float64 reference.

The bound is the activations' rounding, derived, not tuned: each row is rounded with one scale ``xs = max|x| /
127``, so every element moves by at most ``xs / 2``, and the product (the dequantised weights times the rounded
row: the offsets multiply the rounded rows' group sums) moves by at most ``xs / 2 · Σ_k |W[n, k]|``.  The integer
sums are exact, so beyond that only float32's own sums add: a slack of 1e-5 of ``Σ |x| |W|``.  Each vector path is checked where this machine can run it (the AVX2 one is built with
``-mno-avx512f`` on an AVX-512 machine, the plain C one with ``-mno-avx2`` too), and a row's result must not
depend on the rows sent with it, bit for bit.
"""
import shutil

import pytest
import torch

from steer_ui.model import int8 as int8_mod
from rounded_activations import assert_within_rounding, built, random_weight as _weight, rows_with_an_outlier

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc): no W8A8 kernel here")

PATHS = {
    "native": (),
    "avx2": ("-mno-avx512f",),
    "c": ("-mno-avx2", "-mno-avx512f"),
}


def _build(path: str):
    return built(int8_mod._w8a8_kernel, path, PATHS[path], " avx2 " if path == "avx2" else None)


# GGUF's groups: Q8_0 (32), Q4_K (32, affine: codes 0..15), Q6_K (16, codes -32..31), per output row (group = in);
# odd output counts (tile edges), an input width that ends short of a 64-code vector (48, 80, 208)
CASES = [(300, 640, 32, False, -128, 128), (257, 640, 32, True, 0, 16), (129, 2048, 16, False, -32, 32),
         (33, 48, 16, True, -128, 128), (7, 80, 16, False, -128, 128), (65, 208, 16, True, 0, 16),
         (5, 640, 640, False, -127, 128), (3, 128, 64, True, -128, 128)]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("out_features,in_features,group,affine,low,high", CASES)
@pytest.mark.parametrize("rows", [1, 3, 6, 25])
def test_the_product_is_within_the_activations_rounding(path, out_features, in_features, group, affine, low, high,
                                                        rows):
    fn = _build(path)
    w = _weight(out_features, in_features, group, affine, seed=rows, low=low, high=high)
    x = rows_with_an_outlier(rows, in_features, out_features)
    got = w.w8a8_product(x, fn)
    assert_within_rounding(w, x, got, 127)
    # and it is the integer product, not the float one: with the scale unrounded the error would be ~0
    if rows > 1 and in_features >= 128:
        assert float((got.double() - x.double() @ w.dequantise().double().T).abs().max()) > 1e-6


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("out_features,in_features,group,affine,low,high", CASES[:4])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(path, out_features, in_features, group, affine, low,
                                                              high):
    fn = _build(path)
    w = _weight(out_features, in_features, group, affine, seed=9, low=low, high=high)
    x = torch.randn(13, in_features, generator=torch.Generator().manual_seed(10))
    together = w.w8a8_product(x, fn)
    for lo, hi in ((0, 1), (1, 4), (4, 9), (12, 13), (3, 13), (2, 7)):
        assert torch.equal(w.w8a8_product(x[lo:hi].contiguous(), fn), together[lo:hi]), (lo, hi)


def test_exact_when_the_activations_are_already_on_the_int8_grid():
    """Rows whose values are integers up to ±127 with 127 present round to themselves: the product is then
    the float64 one up to float32's sums (the integer part is exact)."""
    fn = _build("native")
    w = _weight(40, 640, 32, False, seed=3)
    x = torch.randint(-127, 128, (5, 640), generator=torch.Generator().manual_seed(4)).float()
    x[:, 0] = 127.0
    got = w.w8a8_product(x, fn).double()
    reference = x.double() @ w.dequantise().double().T
    assert torch.allclose(got, reference, rtol=1e-5, atol=1e-4)


def test_the_offsets_meet_the_rounded_rows():
    """With affine codes all of one sign (Q4_K's 0..15), the rounding must meet the centred weights: the product
    equals the dequantised weights times the rounded row, up to float32's sums."""
    fn = _build("native")
    w = _weight(64, 640, 32, True, seed=6, low=0, high=16)
    x = torch.randn(4, 640, generator=torch.Generator().manual_seed(7))
    xs = x.abs().amax(1, keepdim=True) / 127
    rounded = torch.round(x * (127 / x.abs().amax(1, keepdim=True))).double() * xs.double()
    expected = rounded @ w.dequantise().double().T
    got = w.w8a8_product(x, fn).double()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_zero_and_non_finite_rows():
    fn = _build("native")
    w = _weight(20, 64, 32, True, seed=5)
    x = torch.zeros(3, 64)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    got = w.w8a8_product(x, fn)
    assert torch.equal(got[0], torch.zeros(20))  # no activations: nothing, offsets included
    assert not torch.isfinite(got[1]).any() and not torch.isfinite(got[2]).any()


def test_groups_a_vector_path_cannot_take_are_refused_not_guessed():
    """Groups of 8 or 72 (not GGUF's) are not the vector paths'; the caller then keeps today's product."""
    fn = _build("native")
    if fn.path == "c":
        pytest.skip("the plain C path takes every group")
    for group in (8, 72):
        w = _weight(10, 144, group, False)
        assert w.w8a8_product(torch.randn(2, 144), fn) is None
