"""Recording a piece of work as a CUDA graph: the one place the capture's rules live.

Two paths capture: the decode step over the static KV store
(:mod:`.static_decode`) and the slider's re-run of the blocks above a cached
prefix (:mod:`.prefix`).  Both follow the same rules:

* one capture at a time in the process (torch's documented rule:
  ``torch.cuda.graph``'s ``__enter__`` synchronises the whole device, which is
  invalid while another thread's capture is under way);
* on a stream of the caller's own (the shared default capture stream may be
  recording someone else's work), made to wait for the caller's stream so
  the inputs it wrote are there, and waited for by it afterwards;
* ``capture_error_mode="thread_local"``: other threads' passes (the slider,
  training, the engine) may run and allocate while one thread records;
  their kernels go to their own streams;
* a warm-up run of the work itself first, on the same stream, so lazily
  initialised state (cuBLAS handles, workspaces) exists before recording.

The caller replays the graph and reads the tensors the recorded work
returned: each replay overwrites them in place, so a caller shared by
threads reads them under its own lock.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

import torch

T = TypeVar("T")

_CAPTURE_LOCK = threading.Lock()


def record(device: torch.device, stream: torch.cuda.Stream, work: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """(graph, what ``work`` returned while recorded): ``work`` run once eagerly, then recorded on ``stream``.

    Raises ``RuntimeError`` where the work cannot be recorded (a host sync
    inside it, say); the caller then keeps running it eagerly.
    """
    graph = torch.cuda.CUDAGraph()
    # the device: kernels of a model on cuda:1 launched while cuda:0 is current would run on cuda:1's stream,
    # outside the capture (an empty graph, stale results).  The outer stream context puts this thread's stream
    # back even when torch.cuda.graph's exit raises before restoring it (a failed capture).
    with _CAPTURE_LOCK, torch.cuda.device(device), torch.cuda.stream(stream):
        stream.wait_stream(torch.cuda.current_stream(device))  # the caller's writes, on the caller's stream
        work()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            out = work()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph, out
