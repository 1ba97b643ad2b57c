"""How close the packed int16 product runs to this CPU's integer-instruction ceiling (issue #50).

``python -m steer_ui.tools.vnni_peak --reps 5``: first the rate at which the CPU retires AVX-512 VNNI products
(``vnni_peak.c``: ``vpdpbusd`` on registers only, one thread and the app's threads), which bounds the packed
product (``w8a16_kernel.c``: two of them, the activations' high and low bytes, per 64 multiply-adds); then the
packed product itself on random codes of the embedded model's weight shapes at the row counts the app's batches
have, as multiply-adds a second and as a share of that ceiling.  The batched ratios of the bench are bound by
these products (docs/bench.md, "The batched targets against the instruction ceiling"): this is where a faster
kernel would have to come from.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import torch

from ..model.int8 import _library, _w8a16_kernel
from .kernel_ab import W8A16_SHAPES, packed_cases

_SOURCE = Path(__file__).with_name("vnni_peak.c")
PRODUCTS_PER_64_MACS = 2  # int16 activations: the high bytes' vpdpbusd and the low bytes'


def products_per_second(threads: int, reps: int, loops: int = 20_000_000) -> float:
    """``vpdpbusd`` a second on ``threads`` threads (the best of ``reps`` runs of ~0.1 s), or -1 where the CPU or
    the compiler has no AVX-512 VNNI; None where no C compiler works."""
    library = _library(_SOURCE, ())
    if library is None:
        return None
    fn = library.vnni_products_per_second
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_int, ctypes.c_long]
    return max(fn(threads, loops) for _ in range(reps))


def packed_rates(reps: int, rows=(1, 3, 8, 16, 24), shapes=W8A16_SHAPES) -> list[dict]:
    """The packed product on random codes of each shape and row count: the median over ``reps`` of the best of a
    few calls, into a preallocated output, as ms and G multiply-adds a second."""
    fn = _w8a16_kernel()
    if fn is None or fn.packed is None:
        raise RuntimeError("no packed int16 path on this machine (AMX's tiles or AVX-512 VNNI)")
    out = []
    for (n, k, group, _affine), count, calls, call in packed_cases(shapes, rows):
        y = torch.empty(count, n)
        best = []
        for _ in range(reps):
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                call(fn.packed_matmul, y)
                times.append(time.perf_counter() - start)
            best.append(min(times))
        seconds = statistics.median(best)
        out.append({"shape": f"{n} x {k}", "group": group, "rows": count, "ms": round(1e3 * seconds, 4),
                    "g_macs_per_s": round(count * n * k / seconds / 1e9, 1)})
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", default="1,3,8,16,24")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    one, all_ = products_per_second(1, args.reps), products_per_second(threads, args.reps)
    if one is None or one < 0:
        raise SystemExit("no AVX-512 VNNI here (or no C compiler): the packed product's ceiling is not this one")
    ceiling = all_ * 64 / PRODUCTS_PER_64_MACS / 1e9
    print(f"vpdpbusd: {one / 1e9:.2f} G/s on one thread, {all_ / 1e9:.2f} G/s on {threads}; the packed product's "
          f"ceiling on int16 activations {ceiling:.0f} G multiply-adds/s ({PRODUCTS_PER_64_MACS} per 64)")
    rows = tuple(int(r) for r in args.rows.split(","))
    print("| shape (group) | " + " | ".join(f"{r} rows" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    table = packed_rates(args.reps, rows)
    for shape in dict.fromkeys((r["shape"], r["group"]) for r in table):
        cells = [r for r in table if (r["shape"], r["group"]) == shape]
        print(f"| {shape[0]} ({shape[1]}) | " + " | ".join(
            f"{r['ms']:.3g} ms, {r['g_macs_per_s']:.0f} G/s ({r['g_macs_per_s'] / ceiling:.0%})" for r in cells) + " |")


if __name__ == "__main__":
    main()
