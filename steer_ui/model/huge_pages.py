"""Memory for weights that a decode step streams every token, on transparent huge pages.

A decode step reads every packed weight once (about 270 MB for the embedded model: the unembedding's 168 MB and
126 weights of 0.16-1.3 MB each).  On 4 KiB pages the CPU's prefetchers stop at each page's end and every page
costs a TLB entry; the packed unembedding's product read from 2 MiB pages took 0.81-0.96 of its time on 4 KiB ones
(``kernel_ab --huge-pages``; docs/bench.md, "Huge pages").  torch gives huge pages to buffers of
2 MiB and more where ``THP_MEM_ALLOC_ENABLE`` is set before its first allocation (``steer_ui/__init__.py`` sets
it), but not to the block weights, each under 2 MiB, nor to a process that imported torch first.  So packed
weights come from here: small ones side by side in 32 MiB arenas, in the order they are packed (the order a
step reads them), large ones alone, each a new mapping asked for huge pages (``madvise``) before it is written.
``STEER_UI_HUGE_PAGES=0`` asks for none (here and torch's: the before-and-after of docs/bench.md).
"""
from __future__ import annotations

import math
import mmap
import os
import threading

import torch

HUGE = 2 << 20  # a transparent huge page on x86-64
ARENA = 32 << 20  # small buffers share arenas of this size
ALIGN = 64  # every buffer starts on a cache line (the kernels' vector loads)
SWITCH = "STEER_UI_HUGE_PAGES"  # "0": no huge pages asked for

_lock = threading.Lock()
_arena: torch.Tensor | None = None
_used = 0


def _fresh(nbytes: int, huge: bool) -> torch.Tensor:
    """``nbytes`` (uint8) of a new anonymous mapping, from a huge page's start, asked onto huge pages (``huge``,
    unless :data:`SWITCH` is "0") or kept off them.  A new mapping, not the allocator's: memory used before keeps
    the pages it had, whatever is asked of it later.  The tensor keeps the mapping alive."""
    # private: a shared anonymous mapping is shared memory, whose huge pages are another setting's
    region = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None and not (huge and os.environ.get(SWITCH) == "0"):
        try:
            region.madvise(advice)
        except OSError:  # a kernel without transparent huge pages
            pass
    raw = torch.frombuffer(region, dtype=torch.uint8)
    skip = -raw.data_ptr() % HUGE
    return raw[skip:skip + nbytes]


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape`` and ``dtype`` on huge pages where the kernel gives them: its own
    mapping past half an arena, else the next place in the current arena (a new one when it is full)."""
    global _arena, _used
    nbytes = math.prod(int(size) for size in shape) * dtype.itemsize
    if nbytes > ARENA // 2:
        return _fresh(nbytes, huge=True).view(dtype).view(shape)
    with _lock:
        if _arena is None or _used + nbytes > _arena.numel():
            _arena, _used = _fresh(ARENA, huge=True), 0
        region = _arena[_used:_used + nbytes]
        _used += -(-nbytes // ALIGN) * ALIGN
    return region.view(dtype).view(shape)


def pages_copy(tensor: torch.Tensor, huge: bool) -> torch.Tensor:
    """A copy of a CPU ``tensor`` on huge pages (``huge``) or kept off them whatever torch or the system would
    choose: the two sides of ``kernel_ab --huge-pages``."""
    region = _fresh(tensor.numel() * tensor.element_size(), huge)
    region.copy_(tensor.reshape(-1).view(torch.uint8))
    return region.view(tensor.dtype).view(tensor.shape)


def huge_kb(tensor: torch.Tensor) -> int | None:
    """How much memory the kernel backs with huge pages now in the mappings ``tensor`` lies in, in KiB (from
    /proc/self/smaps; a neighbouring buffer the kernel merged into the same mapping counts too), or None where
    that cannot be read."""
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
