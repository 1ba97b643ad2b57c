"""Memory for weights that a decode step streams every token, on transparent huge pages.

A decode step reads every packed weight once (about 270 MB for the embedded model: the unembedding's 168 MB and
126 weights of 0.16-1.3 MB each).  On 4 KiB pages the CPU's prefetchers stop at each page's end and every page
costs a TLB entry; the packed unembedding's product read from 2 MiB pages took 0.8-0.95 of its time on 4 KiB ones
(``kernel_ab --huge-pages``; docs/bench.md, "Huge pages").  torch gives huge pages to buffers of
2 MiB and more where ``THP_MEM_ALLOC_ENABLE`` is set before its first allocation (``steer_ui/__init__.py`` sets
it), but not to the block weights, each under 2 MiB, nor to a process that imported torch first.  So packed
weights come from here: small ones side by side in 32 MiB arenas, in the order they are packed (the order a
step reads them), large ones alone, each region asked for huge pages (``madvise``) before it is written.
``STEER_UI_HUGE_PAGES=0`` asks for none (here and torch's: the before-and-after of docs/bench.md).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

import torch

HUGE = 2 << 20  # a transparent huge page on x86-64
ARENA = 32 << 20  # small buffers share arenas of this size
ALIGN = 64  # every buffer starts on a cache line (the kernels' vector loads)
_MADV_HUGEPAGE, _MADV_NOHUGEPAGE = 14, 15
SWITCH = "STEER_UI_HUGE_PAGES"  # "0": no huge pages asked for

_lock = threading.Lock()
_arena: torch.Tensor | None = None
_used = 0


def _advise(buffer: torch.Tensor) -> bool:
    """Asks the kernel for huge pages over the whole 2 MiB pages inside ``buffer`` (untouched memory gets them
    when first written); False where it cannot (no libc, not Linux, THP off)."""
    if os.environ.get(SWITCH) == "0":
        return False
    start = buffer.data_ptr()
    first = -(-start // HUGE) * HUGE
    last = (start + buffer.numel() * buffer.element_size()) // HUGE * HUGE
    return last > first and _madvise(first, last - first, _MADV_HUGEPAGE)


def _madvise(start: int, length: int, advice: int) -> bool:
    if length <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), advice) == 0
    except (OSError, AttributeError):
        return False


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape`` and ``dtype`` on huge pages where the kernel gives them: its own
    region past half an arena, else the next place in the current arena (a new one when it is full)."""
    global _arena, _used
    count = 1
    for size in shape:
        count *= int(size)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if nbytes > ARENA // 2:
        raw = torch.empty(nbytes + HUGE, dtype=torch.uint8)
        skip = -raw.data_ptr() % HUGE  # start on a huge page, so none of it is left on small ones
        region = raw[skip:skip + nbytes]
        _advise(region)
        return region.view(dtype).view(shape)
    with _lock:
        if _arena is None or _used + nbytes > _arena.numel():
            raw = torch.empty(ARENA + HUGE, dtype=torch.uint8)
            skip = -raw.data_ptr() % HUGE
            _arena = raw[skip:skip + ARENA]
            _advise(_arena)
            _used = 0
        region = _arena[_used:_used + nbytes]
        _used += -(-nbytes // ALIGN) * ALIGN
    return region.view(dtype).view(shape)


def pages_copy(tensor: torch.Tensor, huge: bool) -> torch.Tensor:
    """A copy of a CPU ``tensor`` from a huge page's start, asked onto huge pages (``huge``) or kept off them
    (``MADV_NOHUGEPAGE``, whatever torch or the system would choose): the two sides of ``kernel_ab --huge-pages``."""
    nbytes = tensor.numel() * tensor.element_size()
    raw = torch.empty(nbytes + HUGE, dtype=torch.uint8)
    skip = -raw.data_ptr() % HUGE
    region = raw[skip:skip + nbytes]
    if huge:
        _advise(region)
    else:  # the whole allocation, which torch may have asked huge pages for: none of it may hold one
        first = raw.data_ptr() // 4096 * 4096
        _madvise(first, raw.data_ptr() + raw.numel() - first, _MADV_NOHUGEPAGE)
    region.copy_(tensor.reshape(-1).view(torch.uint8))
    return region.view(tensor.dtype).view(tensor.shape)


def huge_kb(tensor: torch.Tensor) -> int | None:
    """How much of ``tensor``'s memory the kernel backs with huge pages now, in KiB (from /proc/self/smaps), or
    None where that cannot be read."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    low, high = (int(x, 16) for x in head.split("-"))
                    inside = low < end and high > start
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1])
    except OSError:
        return None
    return total
