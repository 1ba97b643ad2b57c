"""The fused decode step's block kernel at a git revision against this tree's, alternated in one process.

    python -m steer_ui.tools.kernel_ab --old HEAD~1 [--prompt-repeat 40] [--tokens 64] [--reps 4]
    python -m steer_ui.tools.kernel_ab --vocab-pass [--reps 8]   # the one-pass logits summary against torch's passes
    python -m steer_ui.tools.kernel_ab --unembedding-int16 [--reps 4]  # the unembedding on float, then int16 activations
    python -m steer_ui.tools.kernel_ab --blocks-int16 [--reps 4]  # the block products on float, then int16 (packed)
    python -m steer_ui.tools.kernel_ab --w8a16-old REV [--reps 6]  # w8a16_kernel.c's packed product at REV vs now
    python -m steer_ui.tools.kernel_ab --w8a16-high-bytes [--reps 6]  # the same without the low bytes' products
    python -m steer_ui.tools.kernel_ab --w8a16-decode-old REV [--reps 4]  # the same, in whole decodes and many users
    python -m steer_ui.tools.kernel_ab --huge-pages [--reps 20]  # the packed unembedding on 4 KiB vs 2 MiB pages
    python -m steer_ui.tools.kernel_ab --twins [--reps 4]  # every row computed vs counterfactual rows sharing

On these shared 2-core machines the same step moves by 10-30 % between runs, more than most kernel changes
win or lose. So both builds of ``block_kernel.c`` (with the files each includes) decode in one
process, turn about, each rep starting with the other. A steered-only decode and a side-by-side decode of
``--tokens`` greedy tokens follow a warm-up of each, after the bench's generation prompt written
``--prompt-repeat`` times: a long context weighs attention more. Prints one JSON with each build's median step
per rep, new/old per rep, and whether the two builds' texts were equal.  ``--unembedding-int16`` also runs the
bench's many-users section (8 requests of 32 tokens, one after another and at once) for each side in turn;
``--blocks-int16`` too, with the block products (every weight but the unembedding) on float activations, then on
int16 ones on packed weights (AMX's tiles or AVX-512 VNNI; the unembedding as loaded).  ``--w8a16-old`` times the
packed int16 product alone, ``w8a16_kernel.c`` at a revision against this tree's, on random codes of the embedded
model's shapes at the row counts the app decodes (the two revisions must pack alike: the outputs are compared);
``--w8a16-decode-old`` puts that revision's packed product under every packed weight (the fused blocks and the
unembedding) for the decodes and the many-users section, turn about with this tree's (a product alone streams a
small weight from the caches, a decode streams all of them from memory).
``--w8a16-high-bytes`` times this tree's packed product without its low bytes' products (old; wrong sums,
for timing only) against the whole one: what int8 activations on the packed layout could cost at most, one
``vpdpbusd`` per 64 multiply-adds with the broadcasts and the groups' float steps as today.
``--huge-pages`` times the packed int16 product of one unembedding-sized weight from two copies of its packed
codes in one process, one kept on 4 KiB pages and one on 2 MiB pages, turn about.  ``--twins`` decodes (and runs
the many-users section) with every row computed in every block (old) and with counterfactual rows taking their
steered rows' blocks below the first steered one (new, :meth:`.fused_decode.FusedDecode.set_steering`).
"""
from __future__ import annotations

import ctypes
import json
import statistics
import subprocess
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from ..model import fused_decode, vocab_pass
from ..model.generation import DecodeBatch
from ..model.int8 import _W8A16_SOURCE, local_includes
from ..model.loading import EMBEDDED, load_model
from .measures import GENERATION_PROMPT, _ours, seeded_steer

MODES = ("steered_only", "side_by_side")


def sources_at(revision: str, into: Path, source: Path = fused_decode._SOURCE) -> Path:
    """A kernel's C file (the block kernel unless ``source`` says another) as ``revision`` has it, with the files
    it includes (as that revision has them), written under ``into``; the kernel's path there."""
    root = Path(__file__).resolve().parents[2]
    folder = source.parent.relative_to(root).as_posix()

    def write(name: str) -> bytes:
        text = subprocess.run(["git", "show", f"{revision}:{folder}/{name}"], cwd=root, check=True,
                              capture_output=True).stdout
        (into / name).write_bytes(text)
        return text

    for name in local_includes(write(source.name)):
        write(name)
    return into / source.name


def _turns(sides: dict, reps: int, calls: int = 1) -> dict[str, list[float]]:
    """Each of ``sides`` (name -> a call to time) timed ``reps`` times, the sides taking turns and each turn
    starting with the other side: per side, each turn's best of ``calls`` calls, in ms."""
    import time

    times = {name: [] for name in sides}
    for rep in range(reps):
        for name in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
            best = float("inf")
            for _ in range(calls):
                start = time.perf_counter()
                sides[name]()
                best = min(best, time.perf_counter() - start)
            times[name].append(1e3 * best)
    return times


W8A16_SHAPES = ((262144, 640, 32, False), (2048, 640, 32, False), (1024, 640, 32, False), (640, 1024, 32, True),
                (640, 2048, 16, False), (256, 640, 32, False))  # the embedded model's weights (out, in, group, affine)


def w8a16_products(old_source: Path, reps: int, rows=(1, 3, 8, 16, 24), shapes=W8A16_SHAPES) -> list[dict]:
    """The packed int16 product of ``old_source``'s build against this tree's, into preallocated outputs (a fresh
    25 MB output faults its pages in every call): per shape and row count, the median over ``reps`` turns of each
    build's best of a few calls, in ms, and whether the outputs were equal bit for bit."""
    import torch

    from ..model.int8 import _ARGS, _library

    builds = {}
    for name, source in (("old", old_source), ("new", _W8A16_SOURCE)):
        fn = _library(source, ()).w8a16_packed_matmul
        fn.restype, fn.argtypes = ctypes.c_int, _ARGS
        builds[name] = fn
    out = []
    for (n, k, group, affine), count, calls, call in packed_cases(shapes, rows):
        ys = {name: torch.empty(count, n) for name in builds}
        times = _turns({name: lambda name=name: call(builds[name], ys[name]) for name in builds}, reps, calls)
        old_ms, new_ms = statistics.median(times["old"]), statistics.median(times["new"])
        out.append({"shape": f"{n} x {k} (group {group}{', affine' if affine else ''})", "rows": count,
                    "old_ms": round(old_ms, 4), "new_ms": round(new_ms, 4),
                    "new_over_old": round(new_ms / old_ms, 3), "equal": torch.equal(ys["old"], ys["new"])})
    return out


def packed_cases(shapes, rows):
    """Per shape (out, in, group, affine) and row count: (shape, rows, how many calls a timing takes, a call that
    runs a packed product function on this case's random codes and inputs into a given (rows, out) tensor)."""
    import torch

    for n, k, group, affine in shapes:
        gen = torch.Generator().manual_seed(0)
        codes, scale, offset = _packed_random(n, k, group, affine, gen)
        for count in rows:
            x = torch.randn(count, k, generator=gen)

            def call(fn, y, x=x, count=count, n=n, k=k, group=group, weight=(codes, scale, offset)):
                codes_, scale_, offset_ = weight  # bound here: a case kept past the loop still runs its own shape
                return fn(x.data_ptr(), count, k, codes_.data_ptr(), scale_.data_ptr(),
                          None if offset_ is None else offset_.data_ptr(), group, n, y.data_ptr(),
                          torch.get_num_threads())

            yield (n, k, group, affine), count, 3 if n > 100_000 else 200, call


# the low bytes' products in w8a16_kernel.c's two VNNI loops (vnni_rows, vnni_rows_held)
_LOW_BYTES = ("al[r] = _mm512_dpbusd_epi32(al[r], _mm512_set1_epi32(l4), w);",
              "al = _mm512_dpbusd_epi32(al, _mm512_set1_epi32(l4), w[e]);")


def high_bytes_only(into: Path) -> Path:
    """This tree's ``w8a16_kernel.c`` with the low bytes' products left out of its VNNI loops, written under
    ``into``: the products of int8 activations (the high bytes) on the packed layout, everything else as today.
    Its sums are wrong; it exists to be timed (``--w8a16-high-bytes``)."""
    text = _W8A16_SOURCE.read_text()
    for line in _LOW_BYTES:
        if text.count(line) != 1:
            raise RuntimeError(f"w8a16_kernel.c no longer has the line {line!r} once: update kernel_ab._LOW_BYTES")
        text = text.replace(line, "(void)l4;")
    for name in local_includes(text.encode()):
        (into / name).write_bytes((_W8A16_SOURCE.parent / name).read_bytes())
    (into / _W8A16_SOURCE.name).write_text(text)
    return into / _W8A16_SOURCE.name


def _packed_random(n: int, k: int, group: int, affine: bool, gen) -> tuple:
    """A random weight's packed (codes, scales, offsets or None) for this machine's packed int16 path."""
    from ..model.int8 import random_weight

    packed = random_weight(n, k, group, affine, gen).packed_form()
    if packed is None:
        raise RuntimeError("no packed int16 path on this machine (AMX's tiles or AVX-512 VNNI)")
    return packed[1:]


def huge_pages_products(reps: int, rows=(1, 3, 16), n: int = 262144, k: int = 640, group: int = 32) -> dict:
    """The packed int16 product of a random (n, k) weight read from a copy of its packed codes on 4 KiB pages
    ("small") and from one on 2 MiB pages ("huge"), taking turns ``reps`` times per row count: the min and the
    median in ms, how much of each copy the kernel backs with huge pages (KiB), and whether the outputs were
    equal."""
    import torch

    from ..model import huge_pages
    from ..model.int8 import _w8a16_kernel

    fn = _w8a16_kernel()
    gen = torch.Generator().manual_seed(0)
    codes, scale, _ = _packed_random(n, k, group, False, gen)
    copies = {name: huge_pages.pages_copy(codes, huge=name == "huge") for name in ("small", "huge")}
    out = {"huge_kb": {name: huge_pages.huge_kb(c) for name, c in copies.items()}, "rows": []}
    for count in rows:
        x = torch.randn(count, k, generator=gen)
        ys = {name: torch.empty(count, n) for name in copies}

        def product(name: str):
            return lambda: fn.packed_matmul(x.data_ptr(), count, k, copies[name].data_ptr(), scale.data_ptr(), None,
                                            group, n, ys[name].data_ptr(), torch.get_num_threads())

        times = _turns({name: product(name) for name in copies}, reps)
        out["rows"].append({"rows": count, **{f"{name}_ms": [round(min(t), 3), round(statistics.median(t), 3)]
                                              for name, t in times.items()},
                            "equal": torch.equal(ys["small"], ys["huge"])})
    return out


def compare(handle, old_source: Path, prompt: str, tokens: int, reps: int) -> dict:
    """Per mode: each build's median step (ms) per rep, new/old per rep, and whether the texts were equal."""
    sides = {"old": lambda: fused_decode.kernel_built_from(old_source),
             "new": lambda: fused_decode.kernel_built_from(fused_decode._SOURCE)}
    return alternate(handle, sides, prompt, tokens, reps)


def alternate(handle, sides: dict, prompt: str, tokens: int, reps: int) -> dict:
    """:func:`compare` for any two ``sides`` ({"old": ..., "new": ...}: a context manager each, inside which that
    side decodes), taking turns."""
    steer = seeded_steer(handle, handle.arch.num_layers // 2)[0]
    out = {}
    for mode in MODES:
        steps = {name: [] for name in sides}
        texts = {}
        for rep in range(reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for name in order:
                with sides[name]():
                    batch = DecodeBatch(handle)
                    _ours(handle, prompt, [steer], 4, batch, steered_only=mode == "steered_only")  # warm-up
                    _, times, result = _ours(handle, prompt, [steer], tokens, batch,
                                             steered_only=mode == "steered_only")
                steps[name].append(round(1e3 * statistics.median(times), 3))
                texts[name] = (result.unsteered.text, result.steered.text)
        out[mode] = {"old_ms": steps["old"], "new_ms": steps["new"],
                     "new_over_old": [round(n / o, 3) for n, o in zip(steps["new"], steps["old"])],
                     "texts_equal": texts["old"] == texts["new"]}
    return out


@contextmanager
def packed_product_from(source: Path):
    """Inside, every packed product (the fused step's and the unembedding's) is ``source``'s build's; the weights
    stay packed as they are (the two sources must pack alike)."""
    from ..model.int8 import _ARGS, _library, _w8a16_kernel

    fn = _w8a16_kernel()
    if fn is None or fn.packed is None:
        raise RuntimeError("no packed path on this machine")
    other = _library(source, ()).w8a16_packed_matmul
    other.restype, other.argtypes = ctypes.c_int, _ARGS
    kept, fn.packed_matmul = fn.packed_matmul, other
    try:
        yield
    finally:
        fn.packed_matmul = kept


@contextmanager
def unembedding_activations(handle, int16: bool):
    """Inside, the unembedding's products take int16 activations (``int16``) or float ones; then as loaded."""
    with int16_activations([handle.arch.int8_unembedding], int16):
        yield


@contextmanager
def block_activations(handle, int16: bool):
    """Inside, every block product (each int8 weight but the unembedding) takes int16 activations (``int16``, on
    packed weights: the fused step takes them only there) or float ones; then as loaded."""
    from ..model.int8 import int8_weights

    unembedding = handle.arch.int8_unembedding
    with int16_activations([w for w in int8_weights(handle.model) if w is not unembedding], int16):
        if fused_decode.unsupported(handle):
            raise RuntimeError(f"the fused step cannot take this: {fused_decode.unsupported(handle)}")
        yield


@contextmanager
def int16_activations(weights: list, int16: bool):
    was = [w.w8a16 for w in weights]
    for w in weights:
        w.w8a16 = int16
    try:
        yield
    finally:
        for w, before in zip(weights, was):
            w.w8a16 = before


def many_users_alternated(handle, sides: dict, reps: int) -> dict:
    """The bench's many-users section (one repetition each time) for each of ``sides`` in turn: per side, the
    runs' times at once, one after another, their ratio, and how many of the 8 equalled their solo runs."""
    from .many_users import bench_many_users

    runs = {name: [] for name in sides}
    for rep in range(reps):
        for name in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
            with sides[name]():
                out = bench_many_users(handle, handle.arch.num_layers // 2, 32, 1, lambda _m: None, moves=5)
            runs[name].append({key: out[key] for key in ("concurrent_ms", "sequential_ms", "many_users_speedup",
                                                         "many_users_exact")})
    return {name: {"runs": r, "median_concurrent_ms": statistics.median(x["concurrent_ms"] for x in r),
                   "median_speedup": round(statistics.median(x["many_users_speedup"] for x in r), 3)}
            for name, r in runs.items()}


def with_many_users(handle, sides: dict, prompt: str, tokens: int, reps: int) -> dict:
    """:func:`alternate`'s decodes, then the many-users section (:func:`many_users_alternated`), for the same two
    ``sides``."""
    result = alternate(handle, sides, prompt, tokens, reps)
    result["many_users"] = many_users_alternated(handle, sides, reps)
    return result


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="the git revision whose block kernel is the A side")
    parser.add_argument("--vocab-pass", action="store_true",
                        help="instead: torch's passes over the logits (old) against the one-pass summary (new)")
    parser.add_argument("--unembedding-int16", action="store_true",
                        help="instead: the unembedding on float activations (old) against int16 ones (new), and "
                             "the many-users section with each")
    parser.add_argument("--blocks-int16", action="store_true",
                        help="instead: the block products on float activations (old) against int16 ones on packed "
                             "weights (new), and the many-users section with each")
    parser.add_argument("--w8a16-old", metavar="REVISION",
                        help="instead: w8a16_kernel.c's packed int16 product at REVISION (old) against this tree's")
    parser.add_argument("--w8a16-high-bytes", action="store_true",
                        help="instead: the packed int16 product without its low bytes' products (old) against the "
                             "whole one: a bound on int8 activations' gain")
    parser.add_argument("--w8a16-decode-old", metavar="REVISION",
                        help="instead: decodes and the many-users section with w8a16_kernel.c's packed product at "
                             "REVISION (old) against this tree's")
    parser.add_argument("--twins", action="store_true",
                        help="instead: every row computed in every block (old) against counterfactual rows taking "
                             "their twins' blocks (new), in decodes and the many-users section")
    parser.add_argument("--huge-pages", action="store_true",
                        help="instead: the packed unembedding-sized product on 4 KiB pages (old) against 2 MiB ones")
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--prompt-repeat", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args(argv)
    if args.huge_pages:
        print(json.dumps({"reps": args.reps, **huge_pages_products(args.reps)}))
        return
    if args.w8a16_old:
        with tempfile.TemporaryDirectory() as tmp:
            rows = w8a16_products(sources_at(args.w8a16_old, Path(tmp), _W8A16_SOURCE), args.reps)
        print(json.dumps({"old": args.w8a16_old, "reps": args.reps, "products": rows}))
        return
    if args.w8a16_high_bytes:
        with tempfile.TemporaryDirectory() as tmp:
            rows = w8a16_products(high_bytes_only(Path(tmp)), args.reps)
        print(json.dumps({"old": "high bytes only", "reps": args.reps, "products": rows}))
        return
    handle = load_model(args.model, weights="int8")
    if fused_decode.unsupported(handle):
        parser.error(f"the fused step cannot decode this model: {fused_decode.unsupported(handle)}")
    prompt = GENERATION_PROMPT * max(1, args.prompt_repeat)
    if args.vocab_pass:
        result = alternate(handle, {"old": vocab_pass.left_to_torch, "new": nullcontext}, prompt, args.tokens,
                           args.reps)
    elif args.unembedding_int16 or args.blocks_int16:
        if handle.arch.int8_unembedding is None:
            parser.error("the model's unembedding is not int8")
        switch = unembedding_activations if args.unembedding_int16 else block_activations
        sides = {"old": lambda: switch(handle, False), "new": lambda: switch(handle, True)}
        result = with_many_users(handle, sides, prompt, args.tokens, args.reps)
    elif args.twins:
        sides = {"old": fused_decode.every_row_computed, "new": nullcontext}
        result = with_many_users(handle, sides, prompt, args.tokens, args.reps)
    elif args.w8a16_decode_old:
        with tempfile.TemporaryDirectory() as tmp:
            old_source = sources_at(args.w8a16_decode_old, Path(tmp), _W8A16_SOURCE)
            sides = {"old": lambda: packed_product_from(old_source), "new": nullcontext}
            result = with_many_users(handle, sides, prompt, args.tokens, args.reps)
    elif not args.old:
        parser.error("give --old REVISION, --vocab-pass, --unembedding-int16, --blocks-int16, --w8a16-decode-old or "
                     "--twins")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = compare(handle, sources_at(args.old, Path(tmp)), prompt, args.tokens, args.reps)
    old = ("torch's passes" if args.vocab_pass else "float activations" if args.unembedding_int16 or args.blocks_int16
           else "every row computed" if args.twins else args.w8a16_decode_old or args.old)
    print(json.dumps({"old": old,
                      "prompt_repeat": args.prompt_repeat, "tokens": args.tokens,
                      "reps": args.reps, **result}))


if __name__ == "__main__":
    main()
