"""What the tests of the integer-product kernels (W8A8's int8 rows, W8A16's int16 rows; issue #50) share: the
random weights in GGUF's layouts and the bound that rounding a row to ``levels`` steps each side of zero allows."""
from pathlib import Path

import pytest
import torch

from steer_ui.model.int8 import Int8Weight

CPU_FLAGS = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").is_file() else ""
AMX = " amx_int8 "  # the /proc/cpuinfo flag of AMX's integer tiles (Sapphire Rapids and later)
NO_TILES = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")  # a build without them, on a CPU that has them


def random_weight(out_features, in_features, group, affine, seed=0, low=-128, high=128) -> Int8Weight:
    """Codes drawn from [low, high), scales up to 0.02, offsets (``affine``) of about 0.01."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(low, high, (out_features, in_features), generator=g, dtype=torch.int8)
    scale = torch.rand(out_features, in_features // group, generator=g) * 0.02
    offset = torch.randn(out_features, in_features // group, generator=g) * 0.01 if affine else None
    return Int8Weight(codes, scale, offset, group)


def rounding_bound(w: Int8Weight, x: torch.Tensor, levels: int) -> torch.Tensor:
    """(rows, out) float64: each element of a row moves by at most half its step ``max|x| / levels``, so each
    output by at most that times ``Σ_k |W[n, k]|``; plus float32's sums, 1e-5 of ``Σ |x| |W|``."""
    weights = w.dequantise().double().abs()
    xs = x.double().abs().amax(1, keepdim=True) / levels
    return 0.5 * xs * weights.sum(1)[None, :] + 1e-5 * (x.double().abs() @ weights.T) + 1e-12


def built(kernel, name: str, flags: tuple[str, ...], needs: str | None = None):
    """The kernel ``kernel`` (``int8._w8a8_kernel`` or ``_w8a16_kernel``) built with ``flags`` as the path
    ``name`` ("native" or the path it must report), skipped where the CPU lacks ``needs`` (a /proc/cpuinfo flag
    with its spaces); the native build of a VNNI machine must take the VNNI path (the int16 kernel's packed
    weights: AMX's tiles where the CPU has them, else VNNI's)."""
    if needs is not None and needs not in CPU_FLAGS:
        pytest.skip(f"this CPU lacks{needs}")
    fn = kernel(flags)
    assert fn is not None
    if name == "native" and " avx512_vnni " in CPU_FLAGS and " avx512bw " in CPU_FLAGS:
        assert fn.path == "avx512-vnni", fn.path
        if kernel.__name__ == "_w8a16_kernel":
            # packed weights take AMX's tiles where the CPU has them (Linux grants them to the process)
            tiles = AMX in CPU_FLAGS and " amx_tile " in CPU_FLAGS
            assert fn.packed == ("amx" if tiles else "avx512-vnni"), fn.packed
    if name != "native":
        assert fn.path == name
    return fn


def rows_with_an_outlier(rows: int, in_features: int, seed: int) -> torch.Tensor:
    """Random rows, row 0 with one outlier that widens its scale (as Gemma's residual has)."""
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed)) * 3
    x[0, 0] = 40.0
    return x


def assert_within_rounding(w: Int8Weight, x: torch.Tensor, got, levels: int) -> None:
    """``got`` is ``x @ W.T`` in float32, within :func:`rounding_bound` of a float64 reference."""
    assert got is not None and got.dtype == torch.float32 and got.shape == (x.shape[0], w.codes.shape[0])
    reference = x.double() @ w.dequantise().double().T
    error = (got.double() - reference).abs()
    assert (error <= rounding_bound(w, x, levels)).all(), float((error / rounding_bound(w, x, levels)).max())



def on_packed_weights(handle, group: int = 32) -> None:
    """Every int8 weight of ``handle`` rounded again in groups of ``group`` inputs (a tiny model's rounded rows are
    wider than the packed path takes; GGUF's groups are 16 and 32), with integer products on int16 activations on
    for every product, as the loader sets them where a packed path exists (AMX's tiles, AVX-512 VNNI); skipped
    where there is none."""
    from steer_ui.model import int8

    fn = int8._w8a16_kernel()
    if fn is None or fn.packed is None:
        pytest.skip("no packed int16 path here (the CPU lacks AMX's tiles and AVX-512 VNNI)")
    for w in int8.int8_weights(handle.model):
        rows, k = w.codes.shape
        blocks = w.dequantise().view(rows, k // group, group)
        scale = blocks.abs().amax(2).clamp_min(1e-12) / 127
        w.codes = torch.round(blocks / scale[..., None]).clamp(-127, 127).to(torch.int8).view(rows, k).contiguous()
        w.scale, w.offset, w.group, w.packed, w.w8a16 = scale.contiguous(), None, group, None, True
