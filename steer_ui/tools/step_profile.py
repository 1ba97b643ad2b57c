"""Where a CPU decode step's time goes (issue #50), at the row counts the app decodes: 1 row (one steered
sequence, the API), 3 rows (the page's side by side), 8 rows (eight API clients) and 24 rows (eight pages).

For each row count, one :class:`DecodeBatch` on the app's default path decodes ``--steps`` steps; each step is
timed whole, then once more under torch.profiler, where every int8 product (a ctypes call the profiler cannot see
inside) is a ``record_function`` range named by its weight's kind.  The table splits the step into the int8
products by kind, torch's operators grouped (attention, norms, rope/soft-cap/elementwise, the rest), and what
is left of the wall time: Python and the profiler's own cost.  (``profile_step`` is the GPU twin: kernels'
time against host time.)

``python -m steer_ui.tools.step_profile`` (about a minute on two cores); ``--weights float32`` for the float
model; ``--rows 1,3`` for fewer cases; ``--crossover`` times the int8 kernel against the W8A8 one, ``--w8a8-accuracy``
measures what int8 activations cost.  State the load average beside its numbers (it prints it).
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

# torch operators by what they do in a Gemma step (the rest is "other": indexing, copies, cat, the KV store)
GROUPS = {
    "attention": ("scaled_dot_product", "softmax", "bmm", "baddbmm", "_efficient_attention", "_flash_attention",
                  "matmul", "mm"),
    "norm": ("rsqrt", "pow", "mean", "norm", "rms_norm", "fused_rms_norm"),
    "elementwise (rope, soft-cap, act, residual)": ("mul", "add", "sub", "neg", "cos", "sin", "tanh", "gelu",
                                                    "div", "silu", "cat", "where"),
}


def _kind(shape: tuple[int, int], hidden: int, vocab: int) -> str:
    out, inp = shape
    if out >= vocab:
        return "unembedding"
    if inp == hidden and out > 2 * hidden:
        return "mlp gate/up"
    if out == hidden and inp > 2 * hidden:
        return "mlp down"
    return "attention q/k/v/o"


@contextlib.contextmanager
def _labelled_products(hidden: int, vocab: int):
    """Every :meth:`Int8Weight.matmul` inside a ``record_function`` named by its weight's kind."""
    from torch.profiler import record_function

    from ..model.int8 import Int8Weight

    original = Int8Weight.matmul

    def labelled(self, x, pause=None):
        with record_function(f"int8 {_kind(self.shape, hidden, vocab)}"):
            return original(self, x, pause)

    Int8Weight.matmul = labelled
    try:
        yield
    finally:
        Int8Weight.matmul = original


@contextlib.contextmanager
def _labelled_blocks():
    """Every fused block call (block_kernel.c, a ctypes call: its products, norms, rope and attention) inside a
    ``record_function`` range, so the fused path's C time is not counted as Python."""
    from torch.profiler import record_function

    from ..model import fused_decode

    original = fused_decode._kernel
    built = original()
    if built is None:
        yield
        return
    step, scratch = built

    def labelled(*args):
        with record_function("fused block (C: products, norms, rope, attention)"):
            return step(*args)

    fused_decode._kernel = lambda: (labelled, scratch)
    try:
        yield
    finally:
        fused_decode._kernel = original


def _group(key: str) -> str:
    name = key.split("::")[-1].lstrip("_")
    for group, names in GROUPS.items():
        if any(name == n or name.startswith(n + "_") or name == n.lstrip("_") for n in names):
            return group
    return "other torch operators"


def _dispatched(fn) -> int:
    """How many torch operators ``fn`` dispatches (as Python calls them: a load-independent count of a step's
    per-operator overhead)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def profile_rows(handle, steer, rows: int, steps: int, prompt: str, decode: str | None = None) -> dict:
    """One row count: median wall ms of a step (advance + sample) and the profiled breakdown in ms a step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..model.generation import DecodeBatch, Request, Sampling

    side = rows % 3 == 0
    requests = rows // 3 if side else rows

    def fresh() -> DecodeBatch:
        batch = DecodeBatch(handle, decode=decode)
        made = [Request.make(handle, prompt, [steer], Sampling(max_new_tokens=steps + 8, temperature=0.0,
                                                                stop_at_eos=False, unsteered=side,
                                                                counterfactual=side))
                for _ in range(requests)]
        batch.admit(made)
        assert batch.rows == rows, (batch.rows, rows)
        batch.sample()
        return batch

    def run(batch, n) -> tuple[list[float], list[float]]:
        forward, unembed = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            batch.advance()
            t1 = time.perf_counter()
            batch.sample()
            t2 = time.perf_counter()
            forward.append(t1 - t0)
            unembed.append(t2 - t1)
        return forward, unembed

    with torch.inference_mode():
        batch = fresh()
        run(batch, 2)  # warm-up
        forward, sample = run(batch, steps)
        batch = fresh()
        run(batch, 1)
        hidden, vocab = handle.arch.hidden_size, handle.arch.vocab_size
        with _labelled_products(hidden, vocab), _labelled_blocks(), \
                profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            run(batch, steps)
            profiled_wall = time.perf_counter() - start
        dispatched = _dispatched(lambda: run(batch, 1))
    parts: dict[str, float] = {}
    for e in prof.key_averages():
        if e.key.startswith(("int8 ", "fused block")):
            parts[e.key] = parts.get(e.key, 0.0) + e.self_cpu_time_total
        elif e.key.startswith(("aten::", "_")) or "::" in e.key:
            g = _group(e.key)
            parts[g] = parts.get(g, 0.0) + e.self_cpu_time_total
    top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
    ms = {k: v / 1e3 / steps for k, v in parts.items()}  # µs total → ms a step
    accounted = sum(ms.values())
    return {"rows": rows, "forward_ms": 1e3 * statistics.median(forward), "sample_ms": 1e3 * statistics.median(sample),
            "step_ms": 1e3 * statistics.median([a + b for a, b in zip(forward, sample)]),
            "profiled_step_ms": 1e3 * profiled_wall / steps, "parts_ms": ms,
            "python_and_profiler_ms": 1e3 * profiled_wall / steps - accounted,
            "decode_path": batch.decode_path.get("path"), "dispatched": dispatched,
            "top": [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in top]}


def fused_norms_ab(handle, steer, prompt: str, rows: int, rounds: int = 10, steps: int = 8) -> dict:
    """A step with Gemma's norms fused (the app's load) against their own forwards, ``rounds`` alternating blocks
    of ``steps`` steps each in one batch; medians of the per-step times in ms."""
    import torch

    from ..model.generation import DecodeBatch, Request, Sampling

    fused = {m: m.__dict__["forward"] for m in handle.model.modules()
             if type(m).__name__.endswith("RMSNorm") and "forward" in m.__dict__}
    side = rows % 3 == 0
    batch = DecodeBatch(handle)
    batch.admit([Request.make(handle, prompt, [steer], Sampling(max_new_tokens=2 * rounds * steps + 8,
                                                                 temperature=0.0, stop_at_eos=False,
                                                                 unsteered=side, counterfactual=side))
                 for _ in range(rows // 3 if side else rows)])
    batch.sample()
    times = {"fused": [], "own": []}
    with torch.inference_mode():
        for _ in range(rounds):
            for mode in ("fused", "own"):
                for m, forward in fused.items():
                    if mode == "fused":
                        m.forward = forward
                    else:
                        m.__dict__.pop("forward", None)
                for _ in range(steps):
                    start = time.perf_counter()
                    batch.advance()
                    batch.sample()
                    times[mode].append(time.perf_counter() - start)
    for m, forward in fused.items():
        m.forward = forward
    return {"rows": rows, "norms": len(fused), "fused_ms": 1e3 * statistics.median(times["fused"]),
            "own_ms": 1e3 * statistics.median(times["own"])}


def markdown(results: list[dict]) -> str:
    kinds = ["fused block (C: products, norms, rope, attention)", "int8 attention q/k/v/o", "int8 mlp gate/up",
             "int8 mlp down", "int8 unembedding", "attention", "norm", "elementwise (rope, soft-cap, act, residual)",
             "other torch operators"]
    extra = sorted({k for r in results for k in r["parts_ms"]} - set(kinds))
    kinds += extra
    head = "| ms a step | " + " | ".join(f"{r['rows']} row{'s' * (r['rows'] > 1)}" for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]

    def row(label, values):
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    row("step (unprofiled median: forward + sample)",
        [f"{r['step_ms']:.2f} ({r['forward_ms']:.2f} + {r['sample_ms']:.2f})" for r in results])
    row("step under the profiler", [f"{r['profiled_step_ms']:.2f}" for r in results])
    for k in kinds:
        row(k, [f"{r['parts_ms'].get(k, 0.0):.2f}" for r in results])
    row("Python, hooks, the profiler's own cost (the rest)", [f"{r['python_and_profiler_ms']:.2f}" for r in results])
    row("torch operators dispatched a step (count)", [str(r["dispatched"]) for r in results])
    return "\n".join(lines)


# the embedded model's product shapes and GGUF groups: attention/MLP up in Q4_K (32, affine), MLP down in Q6_K
# (16), the tied unembedding in Q8_0 (32)
CROSSOVER_SHAPES = ((1024, 640, 32, True), (2048, 640, 32, True), (640, 2048, 16, False), (262144, 640, 32, False))


def crossover(row_counts=(1, 3, 4, 8, 16, 24, 32, 64, 128), reps: int = 7, shapes=CROSSOVER_SHAPES,
              integer: str = "w8a8") -> list[dict]:
    """The float32-arithmetic kernel (today's int8 path) against an integer-product one (``integer``: "w8a8" or
    "w8a16"), each row count and shape timed alternately ``reps`` times on random codes of the model's shapes;
    the best of each in ms (on a shared machine the best is the least disturbed)."""
    import torch

    from ..model.int8 import Int8Weight, _kernel, random_weight

    fn = _kernel()
    by_integers = {"w8a8": Int8Weight.w8a8_product, "w8a16": Int8Weight.w8a16_product}[integer]
    out = []
    for n, k, group, affine in shapes:
        gen = torch.Generator().manual_seed(0)
        w = random_weight(n, k, group, affine, gen, low=-32, high=32)
        for rows in row_counts:
            x = torch.randn(rows, k, generator=gen)
            today, integers = [], []
            for _ in range(reps):
                for times, product in ((today, lambda: w.kernel_product(fn, x)), (integers, lambda: by_integers(w, x))):
                    start = time.perf_counter()
                    product()
                    times.append(time.perf_counter() - start)
            out.append({"shape": f"{n} x {k} (group {group}{', affine' if affine else ''})", "rows": rows,
                        "float32_ms": 1e3 * min(today), "integer_ms": 1e3 * min(integers)})
    return out


def w8a8_accuracy(model: str, blocks=(None, 64, 32, 16)) -> list[dict]:
    """What int8 activations cost on ``model``'s bench prompts (precision.fingerprint against float32 weights):
    the W8A8 kernel itself (one scale per row, every product), then a simulation of finer activation scales
    (each block of ``block`` inputs rounded to int8 with its own scale, llama.cpp's q8_0 being 32, then today's
    product), on every product or on the block linears only (the unembedding left on float activations)."""
    import torch

    from ..model.int8 import Int8Weight, int8_weights
    from ..model.loading import load_model
    from ..model.precision import cost, fingerprint

    reference = fingerprint(load_model(model, weights="float32"))
    handle = load_model(model, weights="int8")
    rows = [{"activations": "int8 weights only (today)", "products": "all",
             **cost(reference, fingerprint(handle, alpha=reference["alpha"]))}]
    for w in int8_weights(handle.model):
        w.w8a8 = True
    rows.append({"activations": "W8A8 kernel, one scale per row", "products": "all",
                 **cost(reference, fingerprint(handle, alpha=reference["alpha"]))})
    for w in int8_weights(handle.model):
        w.w8a8 = False
    original = Int8Weight.matmul
    vocab = handle.arch.vocab_size

    def simulated(block, skip_unembedding):
        def matmul(self, x, pause=None):
            if skip_unembedding and self.shape[0] >= vocab:
                return original(self, x, pause)
            flat = x.reshape(-1, x.shape[-1]).float()
            v = flat.view(flat.shape[0], -1, block or flat.shape[1])
            d = v.abs().amax(-1, keepdim=True) / 127
            rounded = torch.where(d > 0, torch.round(v / torch.where(d > 0, d, 1)), 0) * d
            return original(self, rounded.view(x.shape), pause)
        return matmul

    try:
        for block in blocks:
            for skip in (False, True):
                Int8Weight.matmul = simulated(block, skip)
                rows.append({"activations": f"simulated, one scale per {f'{block} inputs' if block else 'row'}",
                             "products": "block linears" if skip else "all",
                             **cost(reference, fingerprint(handle, alpha=reference["alpha"]))})
    finally:
        Int8Weight.matmul = original
    return rows


def main(argv=None) -> None:
    import argparse

    import torch

    from ..model.loading import EMBEDDED, load_model
    from .measures import GENERATION_PROMPT, seeded_steer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--rows", default="1,3,8,24")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--decode", default=None, help="the decode path (auto, dynamic, fused, static); "
                                                       "default: as the app takes it")
    parser.add_argument("--threads", type=int, default=0, help="torch's threads (default: as the app sets them)")
    parser.add_argument("--crossover", action="store_true",
                        help="time the int8 kernel against the integer-product (W8A8) kernel instead")
    parser.add_argument("--crossover-path", default="w8a8", choices=("w8a8", "w8a16"),
                        help="the integer-product kernel --crossover times")
    parser.add_argument("--crossover-rows", default="1,3,4,8,16,24,32,64,128", help="row counts for --crossover")
    parser.add_argument("--own-norms", action="store_true",
                        help="profile with the norms' own forwards (the step before they were fused)")
    parser.add_argument("--norms-ab", action="store_true",
                        help="a step with Gemma's norms fused against their own forwards, alternating")
    parser.add_argument("--top", action="store_true", help="also list each row count's costliest operators")
    parser.add_argument("--w8a8-accuracy", action="store_true",
                        help="what int8 activations cost against float32 weights, by activation scale block")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.w8a8_accuracy:
        load_start = os.getloadavg()
        print("| activations | products | max abs dp | top-1 | max abs ddlogit |")
        print("|---|---|---|---|---|")
        for r in w8a8_accuracy(args.model):
            print(f"| {r['activations']} | {r['products']} | {r['max_abs_dp']:.4f} | {r['top1_agree']}/{r['prompts']} "
                  f"| {r['max_abs_ddlogit']:.3f} |")
        print(f"load average {load_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
        return
    if args.crossover:
        from ..model.int8 import _w8a8_kernel, _w8a16_kernel

        load_start = os.getloadavg()
        path = args.crossover_path
        rows = crossover(tuple(int(r) for r in args.crossover_rows.split(",")), integer=path)
        build = (_w8a8_kernel if path == "w8a8" else _w8a16_kernel)()
        name = path.upper()
        print(f"{name} path {build.path}, torch threads {torch.get_num_threads()}; load average "
              f"{load_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; best of 7, alternating")
        print(f"| shape | rows | int8 weights, float32 products (ms) | {name} (ms) | {name} / float32 |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['shape']} | {r['rows']} | {r['float32_ms']:.3f} | {r['integer_ms']:.3f} | "
                  f"{r['integer_ms'] / r['float32_ms']:.2f} |")
        return
    handle = load_model(args.model, weights=args.weights)
    if args.own_norms:  # the step before the norms were fused (issue #50's before profile)
        for module in handle.model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.__dict__.pop("forward", None)
    layer = handle.arch.num_layers // 2
    handle.layer_norms()
    steer, _ = seeded_steer(handle, layer)
    if args.norms_ab:
        load_start = os.getloadavg()
        for r in args.rows.split(","):
            ab = fused_norms_ab(handle, steer, GENERATION_PROMPT, int(r))
            print(f"{ab['rows']} rows, {ab['norms']} norms: fused {ab['fused_ms']:.2f} ms a step, own forwards "
                  f"{ab['own_ms']:.2f} ms (own / fused {ab['own_ms'] / ab['fused_ms']:.3f})")
        print(f"torch threads {torch.get_num_threads()}; load average {load_start[0]:.2f} at the start, "
              f"{os.getloadavg()[0]:.2f} at the end; medians of 10 alternating blocks of 8 steps")
        return
    load_start = os.getloadavg()
    results = [profile_rows(handle, steer, int(r), args.steps, GENERATION_PROMPT, args.decode)
               for r in args.rows.split(",")]
    load_end = os.getloadavg()
    print(f"model {args.model}, weights {handle.weights}, torch threads {torch.get_num_threads()}, "
          f"decode path {results[0]['decode_path']}, {args.steps} steps a row count; "
          f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    print(markdown(results))
    if args.top:
        for r in results:
            print(f"== {r['rows']} rows: costliest operators by self time (ms a step, calls a step)")
            for key, ms, calls in r["top"]:
                print(f"{ms:8.2f} ms {calls:5d}x  {key[:80]}")


if __name__ == "__main__":
    main()
