"""Handing a thread's OpenMP helpers back when it stops computing, so the one that computes keeps its pace.

PyTorch's CPU operations, its BLAS and the int8 kernel run their parallel loops on one OpenMP runtime
(libgomp in the Linux wheels), which gives every thread that has entered a parallel loop its own team of
helper threads, kept until that thread exits.  While helpers outnumber the CPUs, libgomp stops spinning
between loops (100 spins instead of 300,000): each of a decode step's ~200 parallel loops then wakes its
helper through the kernel, a few tens of microseconds each.  The app computes in several threads (the
engine's, gradio's request threads for slider moves and sweeps, the loader), so on 2 cores one idle team
was enough to throttle all of them.  Measured on the embedded model, int8, 2-core EPYC: 8 generations one
after another through the engine took 6.9 s while the loading thread still held its team, 4.2 s after it
handed it back (the same decode alone in one thread: 4.0 s); 8 at once 2.4 s and 2.2 s.

So a thread hands its team back when it is done: the service's door after every call, a slider move at the
end of its turn, a client when it hands its work to the engine, and the engine when it goes idle.  The
next parallel loop in that thread makes a new team (one thread start, ~0.3 ms here); a slider move makes
its team while it waits for its turn (:func:`prepare_helpers`), since a thread started while the decode
keeps both CPUs busy waits its turn behind it.  Where the runtime is not libgomp, or has no
``omp_pause_resource_all``, this is a no-op.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import os
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: release the calling thread's resources, keep the runtime
_RUNTIMES = ("libgomp.so.1", "libgomp.so", "libomp.so", "libomp.dylib", "libiomp5.so")

_pause = None
_looked = False
_lock = threading.Lock()


def _runtime_pause():
    """``omp_pause_resource_all`` of the OpenMP runtime already in this process (never loads one), or None."""
    global _pause, _looked
    with _lock:
        if not _looked:
            _looked = True
            # RTLD_NOLOAD: only a runtime already loaded (torch's); opening one by name could load a second
            noload = getattr(os, "RTLD_NOLOAD", None)
            for name in _RUNTIMES if noload is not None else ():
                try:
                    library = ctypes.CDLL(name, mode=noload | getattr(os, "RTLD_LOCAL", 0))
                except OSError:
                    continue
                fn = getattr(library, "omp_pause_resource_all", None)
                if fn is not None:
                    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
                    _pause = fn
                    break
    return _pause


def release_helpers() -> bool:
    """Hand the calling thread's OpenMP helper threads back (see the module docstring); True if the runtime
    took the request.  Cheap when the thread holds none; never call it from inside a parallel region."""
    if "torch" not in sys.modules:  # no runtime to ask yet
        return False
    fn = _runtime_pause()
    return fn is not None and fn(OMP_PAUSE_SOFT) == 0


# torch runs an elementwise loop in parallel past 32,768 elements (its grain size): one such loop makes a team
_TEAM_ELEMENTS = 1 << 16


def prepare_helpers() -> None:
    """Make the calling thread's OpenMP team now, with a trivial parallel loop (a few microseconds once it
    exists).  A thread that is about to wait for its turn calls this first: a new thread started while both
    CPUs are busy is queued behind the running ones (Linux places a new task after them), and the first
    parallel loop waits for it.  Measured with the bench's slider moves while 4 sessions generate
    (``python -m steer_ui.tools.many_users --slider-only --reps 3``, 20 moves a run): a move that made its team
    when its turn came took p50 33-36 ms (6 runs), one that made it while waiting 25-28 ms (9 runs)."""
    import torch

    torch.empty(_TEAM_ELEMENTS).fill_(0.0)


_depth = threading.local()


@contextmanager
def computing() -> Iterator[None]:
    """A stretch of work in this thread; the outermost one hands the thread's helpers back when it ends."""
    _depth.n = getattr(_depth, "n", 0) + 1
    try:
        yield
    finally:
        _depth.n -= 1
        if not _depth.n:
            release_helpers()


def handing_back(fn: Callable) -> Callable:
    """``fn`` run inside :func:`computing`; a generator function's every step is (each ``next`` may run in
    another of the server's threads, and each hands back its own)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def steps(*args, **kwargs):
            inner = fn(*args, **kwargs)
            try:
                while True:
                    with computing():
                        try:
                            item = next(inner)
                        except StopIteration as stop:
                            return stop.value
                    yield item
            finally:
                with computing():
                    inner.close()
        return steps

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with computing():
            return fn(*args, **kwargs)
    return call


def hand_back_after_calls(cls: type) -> type:
    """Class decorator: every public method of ``cls`` (plain or generator, static ones too) :func:`handing_back`."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(handing_back(attr.__func__)))
        elif inspect.isfunction(attr):
            setattr(cls, name, handing_back(attr))
    return cls
