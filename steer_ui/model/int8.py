"""Weight-only int8: weights kept as int8 codes with float32 scales, multiplied with float32 activations.

A decode step on a CPU reads every weight once, so its time is the weights' bytes: Gemma 3 270M in float32 is
1.07 GB a step, its tied unembedding alone 671 MB.  Here each weight matrix is int8 codes ``q`` with a float32
scale ``s`` (and, for affine formats, an offset ``o``) per group of inputs of each output row,
``W[n, k] = q[n, k] · s[n, k // group] + o[n, k // group]``:

* from a GGUF (:mod:`gguf_codes`), the file's own codes and scales, groups of 16 or 32: ``dequantise()``
  equals the float32 weights the app otherwise loads, bit for bit (``exact``);
* otherwise, rounded from the float32 weights with one symmetric scale per output row (``max |w| / 127``).

Only the weights are int8.  Activations, the residual stream (where steering adds α·v), norms, attention
and every sum stay float32: :meth:`Int8Weight.matmul` dequantises each weight into float32 as a small C
kernel reads it (``int8_kernel.c``, compiled at first use with the machine's C compiler) and takes float32 dot
products, so on exact codes the result is the float32 product up to the order of its sums.  Without a C
compiler, or for many rows at once (prefills), it dequantises slabs of rows and multiplies them with torch.
Calls that need gradients through the weights' inputs (TSV training) use the dequantised float32 matrix.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..paths import cache_root
from . import huge_pages

KERNEL_MAX_ROWS = 64  # the AVX2 path's limit (decode steps, the many-users batch, the slider's re-runs)
_SLAB_ROWS = 4096  # the torch path dequantises this many output rows at a time (~10 MB at 640 inputs)
_SOURCE = Path(__file__).with_name("int8_kernel.c")
_W8A8_SOURCE = Path(__file__).with_name("w8a8_kernel.c")
_W8A16_SOURCE = Path(__file__).with_name("w8a16_kernel.c")
_BUILD_LOCK = threading.Lock()


def local_includes(source: bytes) -> list[str]:
    """The files a kernel source includes from its own folder (``#include "name"``)."""
    return [name.decode() for name in re.findall(rb'^#include "([^"]+)"', source, flags=re.M)]


def _kernel_target(extra_flags: tuple[str, ...] = (), source_path: Path = _SOURCE) -> tuple[Path, list[str]]:
    """Where the kernel built from this source, with these flags, for this CPU lives; and the flags."""
    source = source_path.read_bytes()
    for included in local_includes(source):  # a change there rebuilds this one
        source += (source_path.parent / included).read_bytes()
    flags = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC", *extra_flags]
    cpu = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").is_file() else ""
    cpu_flags = next((line for line in cpu.splitlines() if line.startswith("flags")), platform.processor())
    key = hashlib.sha256(source + " ".join(flags).encode() + cpu_flags.encode() + platform.machine().encode())
    return cache_root() / "kernels" / f"{source_path.stem}-{key.hexdigest()[:16]}.so", flags


def _library(source_path: Path, extra_flags: tuple[str, ...]):
    """The C file built (once per source, flags and CPU; kept in the cache) and loaded, or None where no C
    compiler works."""
    target, flags = _kernel_target(extra_flags, source_path)
    with _BUILD_LOCK:
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            # the process id too: two processes (several app processes on one cache) may build at once, and a
            # thread id is only unique within one process
            tmp = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                subprocess.run(["cc", *flags, "-o", str(tmp), str(source_path)], check=True, capture_output=True,
                               timeout=120)
                tmp.replace(target)
            except (OSError, subprocess.SubprocessError):
                tmp.unlink(missing_ok=True)
                return None
    return ctypes.CDLL(str(target))


_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]


def _entry(source_path: Path, extra_flags: tuple[str, ...], name: str, about: str):
    """(the product function ``name`` of the built file, the int its ``about`` function returns), or (None, None)
    where no C compiler works.  Every kernel's product takes the same arguments."""
    library = _library(source_path, extra_flags)
    if library is None:
        return None, None
    fn = getattr(library, name)
    fn.restype = ctypes.c_int
    fn.argtypes = _ARGS
    info = getattr(library, about)
    info.restype = ctypes.c_int
    return fn, info()


@functools.lru_cache(maxsize=None)
def _kernel(extra_flags: tuple[str, ...] = ()):
    """The compiled kernel's function, or None where no C compiler works (the torch path is used).

    ``extra_flags``: added to the compiler's (the tests build the AVX2 path on an AVX-512 machine with
    ``("-mno-avx512f",)``, since CI's machine may have either)."""
    fn, wide = _entry(_SOURCE, extra_flags, "int8_matmul", "int8_wide")
    if fn is not None:
        fn.wide = bool(wide)  # this build has the AVX-512 path
    return fn


@functools.lru_cache(maxsize=None)
def _w8a8_kernel(extra_flags: tuple[str, ...] = ()):
    """The integer-product kernel (``w8a8_kernel.c``: activations rounded to int8 per row, int8 · int8 sums in
    int32), or None where no C compiler works.  ``fn.path``: "avx512-vnni", "avx2" or "c"."""
    fn, path = _entry(_W8A8_SOURCE, extra_flags, "w8a8_matmul", "w8a8_path")
    if fn is not None:
        fn.path = {2: "avx512-vnni", 1: "avx2", 0: "c"}[path]
    return fn


@functools.lru_cache(maxsize=None)
def _w8a16_kernel(extra_flags: tuple[str, ...] = ()):
    """The int16-activation kernel (``w8a16_kernel.c``: activations rounded to int16 per row, int8 codes widened
    to int16, integer sums in int32), or None where no C compiler works.  ``fn.path``: "avx512-vnni",
    "avx512bw", "avx2" or "c"; ``fn.packed``: the path that takes every product on a weight packed once
    (``w8a16_pack``), "amx" (AMX's tiles) or "avx512-vnni", or None where this build and process have none."""
    fn, path = _entry(_W8A16_SOURCE, extra_flags, "w8a16_matmul", "w8a16_path")
    if fn is not None:
        fn.path = {3: "avx512-vnni", 2: "avx512bw", 1: "avx2", 0: "c"}[path]
        library = _library(_W8A16_SOURCE, extra_flags)
        fn.packed_bytes = library.w8a16_packed_bytes
        fn.packed_bytes.restype, fn.packed_bytes.argtypes = ctypes.c_int64, [ctypes.c_int64] * 3
        fn.pack = library.w8a16_pack
        fn.pack.restype = None
        fn.pack.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
        fn.packed_matmul = library.w8a16_packed_matmul
        fn.packed_matmul.restype, fn.packed_matmul.argtypes = ctypes.c_int, _ARGS
        fn.packed = {2: "amx", 1: "avx512-vnni", 0: None}[library.w8a16_packed_path()]
    return fn


def kernel_available() -> bool:
    return _kernel() is not None


def kernel_identity() -> str:
    """Which arithmetic int8 products use here: the kernel build (source, flags, CPU) or torch's path.  The
    order of the float32 sums, and so int8's measured cost against float32, belongs to it."""
    return _kernel_target()[0].stem if kernel_available() else "torch"


def w8a8_identity() -> str | None:
    """The W8A8 kernel's build (source, flags, CPU), whose cost the loader measures; None without a compiler."""
    return _kernel_target((), _W8A8_SOURCE)[0].stem if _w8a8_kernel() is not None else None


def w8a16_identity() -> str | None:
    """The W8A16 kernel's build (source, flags, CPU), whose cost the loader measures; None without a compiler."""
    fn = _w8a16_kernel()
    if fn is None:
        return None
    # whether the tiles are granted is the process's, not the build's; their results should equal VNNI's packed
    # path's bit for bit (the same int32 sums and epilogue), but no machine with both has checked that yet, so a
    # cost measured on one is not taken for the other
    return _kernel_target((), _W8A16_SOURCE)[0].stem + ("-amx" if fn.packed == "amx" else "")


@dataclass
class Int8Weight:
    """An (out, in) weight as int8 ``codes``, float32 ``scale`` (out, in // group) and optional ``offset``."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None
    group: int
    exact: bool = False  # the codes are the model's own (a GGUF's), not a rounding of its floats
    # every product takes integer products on int8 activations (W8A8, w8a8_kernel.c), or none does: a switch by
    # row count would make a request's result depend on how many others share its batch (the many-users batch
    # must equal each request alone; tests/unit/test_decode_batch.py caught a switch at 8 rows).  Set by the
    # loader only where the measured cost is within the default's bound (precision.py)
    w8a8: bool = False
    # the same for integer products on int16 activations (W8A16, w8a16_kernel.c), with the same gate
    w8a16: bool = False
    # the codes, scales and offsets packed 16 outputs a block (w8a16_kernel.c's w8a16_pack), made at the first
    # W8A16 product where this machine has a packed path: (kernel build, codes, scales, offsets or None)
    packed: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.offset) if t is not None)

    def slice(self, start: int, end: int | None) -> "Int8Weight":
        """Output rows ``start:end`` (views, no copy; of the packed form too, where it starts on a tile)."""
        out = Int8Weight(self.codes[start:end], self.scale[start:end],
                         None if self.offset is None else self.offset[start:end], self.group, self.exact,
                         self.w8a8, self.w8a16)
        packed = self.packed_form() if self.w8a16 else self.packed  # packed once, here, not once a slice
        if packed is not None and start % 16 == 0:
            build, codes, scale, offset = packed
            tiles = slice(start // 16, None if end is None else -(-end // 16))
            out.packed = (build, codes[tiles], scale[tiles], None if offset is None else offset[tiles])
        return out

    def dequantise(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows ``start:end`` as float32 (a multiply, then an add: the same roundings as a GGUF reader)."""
        return _float32(self.slice(start, end))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 rows ``ids`` (embedding lookups, one token's logit), any shape of ids."""
        flat = ids.reshape(-1)
        picked = Int8Weight(self.codes.index_select(0, flat), self.scale.index_select(0, flat),
                            None if self.offset is None else self.offset.index_select(0, flat), self.group)
        return _float32(picked).view(*ids.shape, self.codes.shape[1])

    def matmul(self, x: torch.Tensor, pause=None) -> torch.Tensor:
        """``x @ W.T`` for float32 ``x`` of shape (..., in); ``pause`` is called between slabs of a long product."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if torch.is_grad_enabled() and flat.requires_grad:
            return (flat @ self.dequantise().T).reshape(*shape[:-1], -1)
        flat = flat.float().contiguous()
        out_features = self.codes.shape[0]
        if (self.w8a8 or self.w8a16) and flat.device.type == "cpu":
            out = self.integer_product(flat, pause)
            if out is not None:
                return out.reshape(*shape[:-1], out_features)
        fn = _kernel() if flat.device.type == "cpu" else None
        # past KERNEL_MAX_ROWS, only the AVX-512 path beats torch on dequantised slabs (docs/bench.md), and the
        # slabs are where a long product pauses for interactive work
        if fn is not None and flat.shape[0] > KERNEL_MAX_ROWS and (pause is not None or not fn.wide):
            fn = None
        if fn is not None:
            out = self.kernel_product(fn, flat)
            if out is not None:
                return out.reshape(*shape[:-1], out_features)
        out = self._in_slabs(flat, pause, lambda start, end, into: torch.matmul(
            flat, self.dequantise(start, end).T, out=into))
        return out.reshape(*shape[:-1], out_features)

    def _in_slabs(self, flat: torch.Tensor, pause, fill) -> torch.Tensor | None:
        """``flat @ W.T`` by slabs of ``_SLAB_ROWS`` output rows, ``pause`` (where given) before each, so a long
        product gives way to interactive work: ``fill(start, end, into)`` writes the slab's columns into ``into``
        and returns it, or None to give up (then None)."""
        n = self.codes.shape[0]
        out = flat.new_empty((flat.shape[0], n))
        for start in range(0, n, _SLAB_ROWS):
            if pause is not None:
                pause()
            end = min(start + _SLAB_ROWS, n)
            if fill(start, end, out[:, start:end]) is None:
                return None
        return out

    def kernel_product(self, fn, flat: torch.Tensor) -> torch.Tensor | None:
        """``flat @ W.T`` (flat: contiguous float32 (rows, in) on the CPU) by the compiled kernel ``fn``; None if
        the kernel refuses the shape (inputs not a multiple of the group)."""
        return self._call(fn, flat)

    def _call(self, fn, flat: torch.Tensor) -> torch.Tensor | None:
        out = flat.new_empty((flat.shape[0], self.codes.shape[0]))
        status = fn(flat.data_ptr(), flat.shape[0], flat.shape[1], self.codes.data_ptr(), self.scale.data_ptr(),
                    None if self.offset is None else self.offset.data_ptr(), self.group, self.codes.shape[0],
                    out.data_ptr(), torch.get_num_threads())
        return out if status == 0 else None

    def integer_product(self, flat: torch.Tensor, pause=None) -> torch.Tensor | None:
        """The product by the integer path switched on (W8A8 or W8A16); a long one (past KERNEL_MAX_ROWS, with a
        ``pause``) in slabs of output rows with ``pause`` between, as the torch path pauses for interactive work.
        Each output is formed alone in these kernels, so slabs give the same numbers as one call."""
        product = Int8Weight.w8a8_product if self.w8a8 else Int8Weight.w8a16_product
        if pause is None or flat.shape[0] <= KERNEL_MAX_ROWS:
            return product(self, flat)

        def fill(start: int, end: int, into: torch.Tensor) -> torch.Tensor | None:
            part = product(self.slice(start, end), flat)
            return None if part is None else into.copy_(part)

        return self._in_slabs(flat, pause, fill)

    def w8a8_product(self, flat: torch.Tensor, fn=None) -> torch.Tensor | None:
        """``flat @ W.T`` with the activations rounded to int8 per row and integer products
        (``w8a8_kernel.c``; flat: contiguous float32 (rows, in) on the CPU); None where the kernel is missing or
        refuses the shape (a group its vector path does not take).  ``fn``: a build of it (tests)."""
        fn = fn if fn is not None else _w8a8_kernel()
        return None if fn is None else self._call(fn, flat)

    def w8a16_product(self, flat: torch.Tensor, fn=None) -> torch.Tensor | None:
        """``flat @ W.T`` with the activations rounded to int16 per row and integer products
        (``w8a16_kernel.c``); None where the kernel is missing or refuses the shape.  ``fn``: a build (tests)."""
        fn = fn if fn is not None else _w8a16_kernel()
        if fn is None:
            return None
        packed = self._packed_for(fn)
        if packed is None:
            return self._call(fn, flat)
        _, codes, scale, offset = packed
        out = flat.new_empty((flat.shape[0], self.codes.shape[0]))
        status = fn.packed_matmul(flat.data_ptr(), flat.shape[0], flat.shape[1], codes.data_ptr(), scale.data_ptr(),
                                  None if offset is None else offset.data_ptr(), self.group, self.codes.shape[0],
                                  out.data_ptr(), torch.get_num_threads())
        return out if status == 0 else None

    def packed_form(self) -> tuple | None:
        """(build, codes, scales, offsets) packed for this machine's packed path (AMX's tiles or AVX-512 VNNI),
        or None where it has none or it does not take this weight's group."""
        fn = _w8a16_kernel()
        return None if fn is None or fn.packed is None else self._packed_for(fn)

    def _packed_for(self, fn) -> tuple | None:
        """This weight packed for ``fn`` (made once, then kept), or None where ``fn`` has no packed path for it."""
        if self.packed is not None and self.packed[0] is fn:
            return self.packed
        n_out, k = self.codes.shape
        size = fn.packed_bytes(n_out, k, self.group)
        if not size:
            return None
        # on huge pages, the small weights side by side in the order they are packed (huge_pages.py): a step
        # streams them all
        codes = huge_pages.empty((size // (16 * k), k // self.group, 16 * self.group), torch.int8)
        scale = huge_pages.empty((size // (16 * k), k // self.group, 16), torch.float32)
        offset = None if self.offset is None else huge_pages.empty(tuple(scale.shape), torch.float32)
        codes_in, scale_in = self.codes.contiguous(), self.scale.contiguous()
        offset_in = None if self.offset is None else self.offset.contiguous()
        fn.pack(codes_in.data_ptr(), scale_in.data_ptr(), None if offset_in is None else offset_in.data_ptr(),
                n_out, k, self.group, codes.data_ptr(), scale.data_ptr(),
                None if offset is None else offset.data_ptr())
        self.packed = (fn, codes, scale, offset)
        return self.packed


def random_weight(n_out: int, k: int, group: int, affine: bool, generator: torch.Generator, low: int = -127,
                  high: int = 128) -> Int8Weight:
    """A weight of random codes in [low, high), scales up to 0.01 (and offsets, ``affine``): the shapes the
    benchmarks time the kernels on."""
    codes = torch.randint(low, high, (n_out, k), generator=generator, dtype=torch.int8)
    scale = torch.rand(n_out, k // group, generator=generator) * 0.01
    offset = torch.randn(n_out, k // group, generator=generator) * 0.01 if affine else None
    return Int8Weight(codes, scale, offset, group)


def _float32(w: Int8Weight) -> torch.Tensor:
    rows, cols = w.codes.shape
    out = w.codes.float().view(rows, cols // w.group, w.group).mul_(w.scale[..., None])
    if w.offset is not None:
        out.add_(w.offset[..., None])
    return out.view(rows, cols)


def int8_weights(model: nn.Module) -> list[Int8Weight]:
    """The distinct int8 weights of ``model`` (a tied embedding and unembedding count once)."""
    return list({id(m.int8): m.int8 for m in model.modules() if isinstance(getattr(m, "int8", None), Int8Weight)}
                .values())


def per_channel(w: torch.Tensor) -> Int8Weight:
    """Round a float weight to int8 with one symmetric scale per output row (max |w| / 127)."""
    w = w.detach().float()
    scale = (w.abs().amax(1).clamp_min(1e-12) / 127).contiguous()
    codes = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return Int8Weight(codes, scale[:, None].contiguous(), None, w.shape[1], exact=False)


class Int8Linear(nn.Module):
    """``nn.Linear`` on an :class:`Int8Weight`; ``weight`` gives the dequantised float32 matrix (for readers of
    shapes and of W_O, not for the forward pass)."""

    def __init__(self, int8: Int8Weight, bias: torch.Tensor | None):
        super().__init__()
        self.int8 = int8
        self.in_features, self.out_features = int8.shape[1], int8.shape[0]
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.int8.dequantise()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.int8.matmul(x)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per group of "
                f"{self.int8.group}{' (the model’s own codes)' if self.int8.exact else ''}")


class Int8Embedding(nn.Module):
    """An embedding table on an :class:`Int8Weight` (tied to the unembedding in Gemma); keeps a scaled
    embedding's ``embed_scale`` (Gemma multiplies every looked-up row by √hidden)."""

    def __init__(self, int8: Int8Weight, original: nn.Module):
        super().__init__()
        self.int8 = int8
        self.num_embeddings, self.embedding_dim = int8.shape
        self.padding_idx = getattr(original, "padding_idx", None)
        scale = getattr(original, "embed_scale", None)
        if isinstance(scale, torch.Tensor):
            self.register_buffer("embed_scale", scale.detach().clone(), persistent=False)
        else:
            self.embed_scale = scale

    @property
    def weight(self) -> torch.Tensor:
        return self.int8.dequantise()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.int8.rows(ids)
        if self.embed_scale is None:
            return rows
        return rows * (self.embed_scale.to(rows.dtype) if isinstance(self.embed_scale, torch.Tensor)
                       else self.embed_scale)


def quantise_model(model: nn.Module, codes: dict[str, Int8Weight] | None = None) -> dict:
    """Replace every ``nn.Linear`` of ``model`` (the unembedding included) by an :class:`Int8Linear`, in place;
    a tied input embedding becomes an :class:`Int8Embedding` on the same codes.  ``codes``: module name → the
    model's own int8 weights (:func:`gguf_codes.read_codes`), used where given; every other linear is rounded
    per output row.  Returns {"exact": names on their own codes, "rounded": names rounded}.

    GPT-2's ``Conv1D`` layers and untied embeddings stay float32 (an embedding lookup reads a few rows a step,
    so int8 would only save memory there, at a cost in accuracy)."""
    codes = dict(codes or {})
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {module: name for name, module in model.named_modules()}
    exact, rounded, seen = [], [], {}

    def int8_of(name: str, weight: torch.Tensor) -> Int8Weight:
        key = weight.data_ptr()
        if key not in seen:
            made = codes.get(name)
            seen[key] = made if made is not None else per_channel(weight)
            (exact if seen[key].exact else rounded).append(name)
        return seen[key]

    tied = (emb is not None and head is not None and isinstance(emb, nn.Embedding)
            and emb.weight.data_ptr() == head.weight.data_ptr())
    if tied:
        shared = int8_of(names[emb], emb.weight)
        model.set_input_embeddings(Int8Embedding(shared, emb))
        seen[head.weight.data_ptr()] = shared
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                full = f"{parent_name}.{child_name}" if parent_name else child_name
                setattr(parent, child_name, Int8Linear(int8_of(full, child.weight), child.bias))
    return {"exact": exact, "rounded": rounded}


def save_codes(codes: dict[str, Int8Weight], path: Path) -> None:
    """Write ``codes`` (module name → weight) to a safetensors file, atomically (never a pickle)."""
    from safetensors.torch import save_file

    tensors, meta = {}, {}
    for name, w in codes.items():
        tensors[f"{name}.codes"], tensors[f"{name}.scale"] = w.codes.contiguous(), w.scale.contiguous()
        if w.offset is not None:
            tensors[f"{name}.offset"] = w.offset.contiguous()
        meta[name] = json.dumps({"group": w.group, "exact": w.exact})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)


def load_codes(path: Path) -> dict[str, Int8Weight] | None:
    """What :func:`save_codes` wrote, or None if the file is missing or unreadable."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta, keys = f.metadata() or {}, set(f.keys())
            out = {}
            for name, about in meta.items():
                info = json.loads(about)
                offset = f.get_tensor(f"{name}.offset") if f"{name}.offset" in keys else None
                out[name] = Int8Weight(f.get_tensor(f"{name}.codes"), f.get_tensor(f"{name}.scale"), offset,
                                       int(info["group"]), bool(info["exact"]))
            return out
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError):
        return None
