"""A GGUF's own integer codes and scales, read back as int8 weights that reproduce its dequantised floats exactly.

The embedded model's GGUF (Q4_K_M) stores every weight matrix as small integers with a scale (and for Q4_K an
offset) per block of 16 or 32 inputs: Q8_0 and Q5_0 ``w = d · q`` per 32, Q6_K ``w = (d · s_j) · q`` per 16,
Q4_K ``w = (d · s_j) · q − dmin · m_j`` per 32, with q in [−128, 127].  Re-quantising the dequantised floats to
int8 costs ~0.02 in next-token probability on this model (docs/bench.md); these codes cost nothing, because
they are the model.  The block layouts are unpacked by the ``gguf`` package itself: each block is dequantised
with its scale fields set to 1 and its minimum to 0, which leaves the codes (Q8_0's codes are its bytes); the
scales are read from the fields.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .int8 import Int8Weight

# GGUF tensor names → Hugging Face module names (Gemma and Llama-style decoders, as transformers maps them).
_BLOCK_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_F16_ONE = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
_F16_ZERO = np.zeros(2, np.uint8)


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.ffn_down.weight`` → ``model.layers.3.mlp.down_proj``; ``token_embd.weight`` → ``model.embed_tokens``."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens"
    if gguf_name == "output.weight":
        return "lm_head"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"
    return None


def _codes_and_scales(kind: str, blocks: np.ndarray):
    """(codes (blocks, values) as int8 or as whole float32 values, scale, offset or None, group) for one tensor's
    raw blocks."""
    from gguf import quants

    if kind == "Q8_0":  # 2-byte d, then 32 int8 codes as they are
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (blocks, 1): one group per block
        return np.ascontiguousarray(blocks[:, 2:]).view(np.int8), scale, None, 32
    unit = blocks.copy()
    if kind == "Q5_0":  # 2-byte d, 4 bytes of high bits, 16 bytes of low nibbles
        unit[:, :2] = _F16_ONE
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        return quants.dequantize(unit, quants.GGMLQuantizationType.Q5_0), scale, None, 32
    if kind == "Q6_K":  # 128 low bits, 64 high bits, 16 int8 sub-scales, 2-byte d
        unit[:, 192:208] = 1
        unit[:, 208:210] = _F16_ONE
        d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
        scale = d * blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
        return quants.dequantize(unit, quants.GGMLQuantizationType.Q6_K), scale, None, 16
    if kind == "Q4_K":  # 2-byte d, 2-byte dmin, 12 bytes of 6-bit sub-scales and minimums, the codes
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, m = quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
        unit[:, 0:2], unit[:, 2:4] = _F16_ONE, _F16_ZERO
        unit[:, 4:16] = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)  # every s_j = 1, every m_j = 0
        offset = -(dmin * m.astype(np.float32))
        return quants.dequantize(unit, quants.GGMLQuantizationType.Q4_K), d * sc.astype(np.float32), offset, 32
    return None


def read_codes(gguf: Path, reference: dict[str, torch.Tensor]) -> dict[str, Int8Weight]:
    """The GGUF's codes for each module named in ``reference`` (HF name → its float32 weight as loaded), kept
    only where codes · scale + offset equals that weight bit for bit (a tensor the loader permuted or a block
    type not handled here is left out, and the caller rounds it from the floats instead)."""
    from gguf import GGUFReader

    out: dict[str, Int8Weight] = {}
    for tensor in GGUFReader(str(gguf)).tensors:
        name = hf_name(tensor.name)
        if name not in reference:
            continue
        blocks = np.asarray(tensor.data)
        rows = blocks.shape[0]
        unpacked = _codes_and_scales(tensor.tensor_type.name, blocks.reshape(-1, _block_bytes(tensor)))
        if unpacked is None:
            continue
        codes, scale, offset, group = unpacked
        width = codes.size // rows
        if codes.dtype != np.int8 and (codes.min() < -128 or codes.max() > 127):
            continue
        weight = Int8Weight(torch.from_numpy(codes.reshape(rows, width).astype(np.int8, copy=False)),
                            torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, -1))),
                            None if offset is None else torch.from_numpy(np.ascontiguousarray(offset.reshape(rows, -1))),
                            group, exact=True)
        if weight.shape == tuple(reference[name].shape) and torch.equal(weight.dequantise(), reference[name]):
            out[name] = weight
    return out


def _block_bytes(tensor) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[tensor.tensor_type][1]
