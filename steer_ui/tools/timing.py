"""Timing and memory helpers of the benchmark: synced timings, medians, ratios, RSS, load average.

Every figure the benchmark reports is built from these, so a change to how
a timing is taken (device syncs, percentiles, NaN for an empty side) is made
once.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Callable

import torch

from ..model.int8 import int8_weights


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def at_once(calls: list[Callable[[], object]]) -> tuple[float, list]:
    """Seconds until every one of ``calls`` has returned, each in its own thread, all released together (as
    many clients sending at the same moment), and their results in order; a call's error is raised here."""
    import threading

    results: list = [None] * len(calls)
    errors: list = []
    barrier = threading.Barrier(len(calls) + 1)

    def client(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - raised in the caller's thread, below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start, results


def timings(fn: Callable[[], object], reps: int, device: torch.device) -> list[float]:
    """Seconds of ``reps`` back-to-back calls of ``fn``, each bracketed by device syncs."""
    out = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - start)
    return out


def interleaved(runs: dict[str, Callable[[], object]], reps: int) -> dict[str, list]:
    """Each run's results over ``reps`` rounds after one uncounted warm-up round of all of them, the runs taking
    turns within a round and the order turned each round, so a drift in the machine's speed falls on every side
    alike."""
    results: dict[str, list] = {name: [] for name in runs}
    order = list(runs)
    for rep in range(reps + 1):
        for name in (order if rep % 2 else order[::-1]):
            result = runs[name]()
            if rep:
                results[name].append(result)
    return results


def median(xs) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def percentile(xs, q: float) -> float:
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("nan")


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux/macOS), else the current RSS."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):
        return rss_bytes()


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


@contextmanager
def cache_dir(path: str):
    """Point ``STEER_UI_CACHE`` somewhere else for the block (cold caches), then restore it."""
    old = os.environ.get("STEER_UI_CACHE")
    os.environ["STEER_UI_CACHE"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("STEER_UI_CACHE", None)
        else:
            os.environ["STEER_UI_CACHE"] = old


def parameter_bytes(module: torch.nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of distinct parameter storage (a tied unembedding counts once)."""
    seen, total = set(), 0
    for p in module.parameters():
        key = (p.data_ptr(), p.numel())
        if key in seen:
            continue
        seen.add(key)
        size = torch.empty((), dtype=dtype).element_size() if dtype is not None else p.element_size()
        total += p.numel() * size
    return total + sum(w.nbytes() for w in int8_weights(module))  # int8 weights: codes, scales, offsets

