"""A CPU generator's float64 uniforms without torch's one-at-a-time loop (``mt_kernel.c``).

Each sampled request draws one uniform per vocabulary token per step from its own seeded stream
(:mod:`.sampler`): 262,144 float64s on the embedded model.  ``torch.rand`` makes them one call at a time behind
the generator's lock, ~1.2-2 ms a step here, as much as a tenth of a one-row decode step.  The kernel makes the
same numbers from the same MT19937 state, bit for bit, and leaves the generator where torch would have: the state
is read with ``get_state`` and written back with ``set_state``, so a seed gives the tokens it gave before and any
torch call on the generator afterwards continues the same stream.

Where the kernel cannot say (no C compiler, another device, a state layout this module does not know)
:func:`rand64` returns None and the caller keeps ``torch.rand``.
"""
from __future__ import annotations

import ctypes
import functools
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from .int8 import _library
from .switches import Setting

_SOURCE = Path(__file__).with_name("mt_kernel.c")
# torch's CPUGeneratorImplState: the seed (int64), left and seeded (int32 each), next (uint64), the 624 state words
# (each in a uint64), then the normal-sample caches; 5,056 bytes in all
_STATE_BYTES = 5056
_LEFT, _NEXT, _WORDS = 8, 16, 24
_N = 624
_off = Setting(False)  # left_to_torch


@functools.lru_cache(maxsize=None)
def _kernel(extra_flags: tuple[str, ...] = ()):
    library = _library(_SOURCE, extra_flags)
    if library is None:
        return None
    fn = library.mt_uniforms
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
    return fn


def rand64(rng: torch.Generator, n: int, floor: float = 0.0, out: torch.Tensor | None = None,
           kernel=None) -> torch.Tensor | None:
    """``torch.rand(n, dtype=torch.float64, generator=rng)`` with its zeros raised to ``floor``, and ``rng``
    advanced as that call advances it; None where the kernel cannot (see the module docstring).

    ``out``: a contiguous (n,) float64 CPU tensor to write them into.  Worth keeping from step to step: a fresh
    2 MB buffer is fresh pages, and faulting them in cost 0.67 ms here, more than drawing the numbers (0.27).
    ``kernel``: a build of it (tests)."""
    if rng.device.type != "cpu" or _off.value:
        return None
    fn = kernel or _kernel()
    if fn is None:
        return None
    state = rng.get_state()
    raw = state.numpy()
    if raw.shape != (_STATE_BYTES,):
        return None
    words64 = raw[_WORDS:_WORDS + 8 * _N].view(np.uint64)
    if int(words64.max()) >> 32:  # not 32-bit words in 64-bit slots: a layout this module does not know
        return None
    words = words64.astype(np.uint32)
    left_next = np.array([raw[_LEFT:_LEFT + 4].view(np.int32)[0], raw[_NEXT:_NEXT + 8].view(np.uint64)[0]],
                         dtype=np.int32)
    if out is None:
        out = torch.empty(n, dtype=torch.float64)
    elif out.shape != (n,) or out.dtype != torch.float64 or out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError("out must be a contiguous (n,) float64 CPU tensor")
    if fn(words.ctypes.data, left_next.ctypes.data, out.data_ptr(), n, floor) != 0:
        return None
    words64[:] = words
    raw[_LEFT:_LEFT + 4].view(np.int32)[0] = left_next[0]
    raw[_NEXT:_NEXT + 8].view(np.uint64)[0] = left_next[1]
    rng.set_state(state)
    return out


@contextmanager
def left_to_torch():
    """Inside, :func:`rand64` declines, so every draw is ``torch.rand``'s (A/B runs: ``python -m
    steer_ui.tools.sampling_cost --uniforms``)."""
    with _off.held(True):
        yield
