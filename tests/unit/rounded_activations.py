"""What the tests of the integer-product kernels (W8A8's int8 rows, W8A16's int16 rows; issue #50) share: the
random weights in GGUF's layouts and the bound that rounding a row to ``levels`` steps each side of zero allows."""
from pathlib import Path

import torch

from steer_ui.model.int8 import Int8Weight

CPU_FLAGS = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").is_file() else ""


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
