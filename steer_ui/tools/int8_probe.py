"""What re-quantising the float weights to int8 would cost, and torch's own int8 kernels (issue #37's groundwork).

The app's int8 (:mod:`steer_ui.model.int8`) uses the GGUF's own codes and costs nothing in accuracy; this tool
measures the alternatives that led there: symmetric int8 rounded from the float32 weights, per output channel
or per group, and torch's kernels for them.

    python -m steer_ui.tools.int8_probe [--model embedded] [--repeats 20] [--keep PART[,PART] ...] [--group 32]
    python -m steer_ui.tools.int8_probe --kernel-rows [--repeats 20] [--rows 1,3,24,32]

``--kernel-rows`` prints only the app's kernel over row counts (1 and 3 rows: decode steps; 24 and 32: eight
users' batch, the slider's re-run of a 32-token prompt), both of its vector paths where this CPU has
AVX-512, against float32 ``x @ w.T``; docs/bench.md's kernel tables come from it.

Prints, for the embedded model's shapes, the best-of-``repeats`` time of a 3-row product with a float32 weight
(``x @ w.T`` and the kernels the app picks today: oneDNN's linear for the blocks, :func:`architecture.unembed`
for the 262,144-row unembedding) beside ``torch.ops.aten._weight_int8pack_mm`` with bfloat16 activations (with
float32 activations it falls back to a slow path on this build) and a per-group int8 weight dequantised into
float32 a slab at a time; then the cost in accuracy of int8 weights (symmetric, scale = max |w| / 127 per
output channel or per group of 32 inputs, dequantised to float32 so that only the weights' rounding is
measured, and once through the real kernel) against float32 on the bench's fixed prompts
(``measures.PROBE_PROMPTS``, as ``bench`` measures a dtype's cost): max |Δ next-token probability| and top-1
agreement, for the blocks' linear layers alone and with the tied embedding / unembedding as well, each
linear's own share, and the mixes ``--keep`` names (those linears kept in float32).  One process, one run:
compare ratios, not the times of another run.
"""
from __future__ import annotations

import argparse

import torch

from .measures import PROBE_PROMPTS, next_token_probs
from .timing import ms, timings

SHAPES = ((2048, 640), (640, 2048), (1024, 640), (262144, 640))  # Gemma 3 270M: MLP, attention, unembedding


def per_channel_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 scale per output row) with w ≈ q * scale[:, None] (the app's rounding for weights
    without codes of their own, :func:`steer_ui.model.int8.per_channel`)."""
    from ..model.int8 import per_channel

    rounded = per_channel(w)
    return rounded.codes, rounded.scale[:, 0]


def per_group_int8(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 scale per output row and group of ``group`` input columns), dequantised as
    q * scale.repeat_interleave(group, 1)."""
    rows, cols = w.shape
    grouped = w.reshape(rows, cols // group, group)
    scale = grouped.abs().amax(-1).clamp_min(1e-12) / 127
    return torch.round(grouped / scale[..., None]).clamp(-127, 127).to(torch.int8).reshape(rows, cols), scale


def dequantised_product(q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, rows: int = 2048) -> torch.Tensor:
    """``x @ w.T`` for per-group int8 ``w`` with float32 activations, by dequantising ``rows`` rows of ``w`` at
    a time into float32 (what torch offers without a fused kernel; exact where the codes hold ``w`` exactly)."""
    out_features, in_features = q.shape
    group = in_features // scale.shape[1]
    out = x.new_empty((x.shape[0], out_features))
    for start in range(0, out_features, rows):
        w = q[start:start + rows].float().view(-1, scale.shape[1], group).mul_(scale[start:start + rows, :, None])
        torch.matmul(x, w.view(-1, in_features).T, out=out[:, start:start + rows])
    return out


def _best_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    return ms(min(timings(fn, repeats, torch.device("cpu"))))


def kernel_times(repeats: int) -> list[dict]:
    from ..model.architecture import _fast_linear_forward, unembed
    from ..model.int8 import Int8Weight

    rows = []
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features in SHAPES:
        w = torch.randn(out_features, in_features, generator=gen) * 0.05
        x = torch.randn(3, in_features, generator=gen)
        q, scale = per_channel_int8(w)
        xb, sb = x.to(torch.bfloat16), scale.to(torch.bfloat16)
        linear = torch.nn.Linear(in_features, out_features, bias=False)
        linear.weight.data = w
        gq, gs = per_group_int8(w, 32)
        app_int8 = Int8Weight(gq, gs.contiguous(), None, 32)  # the app's kernel, on the unembedding's layout
        with torch.no_grad():
            app = (lambda: unembed(w, x)) if out_features > 100_000 else (lambda: _fast_linear_forward(linear, x))
            rows.append({"shape": f"{out_features}x{in_features}", "float32_ms": _best_ms(lambda: x @ w.T, repeats),
                         "app_float32_ms": _best_ms(app, repeats),
                         "int8_bf16_ms": _best_ms(lambda: torch.ops.aten._weight_int8pack_mm(xb, q, sb), repeats),
                         "group_int8_fp32_ms": _best_ms(lambda: dequantised_product(gq, gs, x), repeats),
                         "app_int8_ms": _best_ms(lambda: app_int8.matmul(x), repeats)})
    return rows


def kernel_rows(repeats: int, row_counts=(1, 3, 24, 32), shapes=SHAPES) -> list[dict]:
    """The app's int8 kernel (per group of 32, float32 activations) on the model's shapes over ``row_counts``:
    ms and GF/s, the AVX2 path beside the native one where the native one is AVX-512, float32 ``x @ w.T``."""
    from ..model.int8 import Int8Weight, _kernel

    native = _kernel()
    paths = {"native": native}
    if native is not None and native.wide:
        paths["avx2"] = _kernel(("-mno-avx512f",))
    out = []
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features in shapes:
        w = torch.randn(out_features, in_features, generator=gen) * 0.05
        gq, gs = per_group_int8(w, 32)
        weight = Int8Weight(gq, gs.contiguous(), None, 32)
        for n in row_counts:
            x = torch.randn(n, in_features, generator=gen)
            flops = 2 * n * out_features * in_features
            row = {"shape": f"{out_features}x{in_features}", "rows": n,
                   "float32_ms": _best_ms(lambda: x @ w.T, repeats)}
            for name, fn in paths.items():
                if fn is not None:
                    row[f"{name}_ms"] = _best_ms(lambda: weight.kernel_product(fn, x), repeats)
            for key in [k for k in row if k.endswith("_ms")]:
                row[key.replace("_ms", "_gflops")] = round(flops / (row[key] / 1e3) / 1e9, 2)
            out.append(row)
    return out


def _dequantised(w: torch.Tensor, group: int | None) -> torch.Tensor:
    if group is None:
        q, scale = per_channel_int8(w)
        return q.float() * scale[:, None]
    q, scale = per_group_int8(w, group)
    return q.float() * scale.repeat_interleave(group, 1)


def _kernel_forward(module: torch.nn.Linear, q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor):
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = torch.ops.aten._weight_int8pack_mm(flat, q, scale).float()
    if module.bias is not None:
        out = out + module.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def accuracy(model_source: str, min_weights: int = 1 << 16, sensitivity: int = 5,
             mixes: tuple[tuple[int | None, tuple[str, ...]], ...] = ()) -> list[dict]:
    """Max |Δp| and top-1 agreement of int8 weights against float32 (linear layers of at least ``min_weights``
    values, as the app's fast kernels take them): per output channel (the weights' rounding alone, then through
    ``_weight_int8pack_mm`` with bfloat16 activations), per group of 32 input columns, and per output channel
    with the ``sensitivity`` linears whose rounding alone costs most kept in float32; then each of ``mixes``,
    (group or None for per channel, name parts): the unembedding and every block linear rounded but those whose
    name contains one of the parts."""
    import functools

    from ..model.loading import load_model

    handle = load_model(model_source, weights="float32")  # the float weights it rounds, not the app's int8
    model = handle.model
    unembedding = model.get_output_embeddings().weight
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               and m.weight is not unembedding and m.weight.numel() >= min_weights]
    originals = {name: m.weight.data.clone() for name, m in linears}
    forwards = {name: m.__dict__.get("forward") for name, m in linears}  # the app's fast kernels, if installed
    original_unembedding = unembedding.data.clone()
    reference = next_token_probs(handle)

    def report(what: str) -> dict:
        probs = next_token_probs(handle)
        return {"int8": what, "max_abs_dp": float((probs - reference).abs().max()),
                "top1_agreement": float((probs.argmax(-1) == reference.argmax(-1)).float().mean())}

    def restore() -> None:
        for name, m in linears:
            m.weight.data = originals[name].clone()
            m.__dict__.pop("forward", None)
            if forwards[name] is not None:
                m.forward = forwards[name]
        unembedding.data = original_unembedding.clone()

    def round_unembedding(group: int | None) -> None:  # tied in Gemma: the embedding lookups are rounded too
        unembedding.data = _dequantised(original_unembedding.float(), group).to(unembedding.dtype)

    def round_blocks(group: int | None, skip=()) -> None:
        for name, m in linears:
            if name not in skip:
                m.weight.data = _dequantised(originals[name].float(), group).to(m.weight.dtype)

    out = [{"int8": "per group of 32 inputs: the unembedding's round trip",
            "max_abs_dw": float((_dequantised(original_unembedding.float(), 32) - original_unembedding).abs().max())}]
    round_blocks(None)
    out.append(report("per output channel: block linear layers"))
    round_unembedding(None)
    out.append(report("per output channel: block linear layers and the unembedding"))
    restore()
    for name, m in linears:  # the kernel the app would run: bfloat16 activations into each product
        q, scale = per_channel_int8(originals[name].float())
        m.forward = functools.partial(_kernel_forward, m, q, scale.to(torch.bfloat16))
    out.append(report("per output channel through _weight_int8pack_mm (bf16 activations): block linear layers"))
    restore()
    round_blocks(32)
    out.append(report("per group of 32 inputs: block linear layers"))
    round_unembedding(32)
    out.append(report("per group of 32 inputs: block linear layers and the unembedding"))
    restore()
    if sensitivity:
        alone = []
        for name, m in linears:  # each linear's rounding on its own
            m.weight.data = _dequantised(originals[name].float(), None)
            alone.append((report(name)["max_abs_dp"], name))
            m.weight.data = originals[name].clone()
        worst = [name for _, name in sorted(alone, reverse=True)[:sensitivity]]
        out.append({"int8": "the linears whose rounding alone costs most", "worst": [
            {"linear": name, "max_abs_dp": dp} for dp, name in sorted(alone, reverse=True)[:sensitivity]]})
        round_blocks(None, skip=set(worst))
        out.append(report(f"per output channel: block linear layers but those {sensitivity} (kept float32)"))
        restore()
    for group, parts in mixes:
        round_unembedding(group)
        round_blocks(group, skip={name for name, _ in linears if any(part in name for part in parts)})
        scales = f"per group of {group} inputs" if group else "per output channel"
        out.append(report(f"{scales}: the unembedding and block linear layers but {', '.join(parts)} (float32)"))
        restore()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--keep", action="append", default=[], metavar="PART[,PART]",
                        help="also measure the unembedding and every block linear in int8 but those whose name "
                             "contains a PART (kept float32); repeatable, e.g. --keep layers.17.mlp.down_proj")
    parser.add_argument("--group", type=int, default=32, help="group size for --keep (0: per output channel)")
    parser.add_argument("--kernel-rows", action="store_true", help="only the app's kernel over row counts")
    parser.add_argument("--rows", default="1,3,24,32", help="row counts for --kernel-rows, comma-separated")
    args = parser.parse_args(argv)
    if args.kernel_rows:
        counts = tuple(int(n) for n in args.rows.split(",") if n.strip())
        for row in kernel_rows(args.repeats, counts):
            paths = " · ".join(f"{name} {row[name + '_ms']:.3f} ms ({row[name + '_gflops']:.0f} GF/s)"
                               for name in ("native", "avx2") if name + "_ms" in row)
            print(f"{row['shape']:>11}, {row['rows']:>2} rows: {paths} · float32 x@w.T {row['float32_ms']:.3f} ms "
                  f"({row['float32_gflops']:.0f} GF/s)")
        return 0
    for row in kernel_times(args.repeats):
        print(f"{row['shape']:>11}: float32 x@w.T {row['float32_ms']:.3f} ms · app's float32 kernel "
              f"{row['app_float32_ms']:.3f} ms · int8 weights, bf16 activations {row['int8_bf16_ms']:.3f} ms · "
              f"per-group int8 dequantised to float32 {row['group_int8_fp32_ms']:.3f} ms · the app's int8 kernel "
              f"(per group of 32, float32 activations) {row['app_int8_ms']:.3f} ms")
    mixes = tuple((args.group or None, tuple(keep.split(","))) for keep in args.keep)
    for row in accuracy(args.model, mixes=mixes):
        if "max_abs_dw" in row:
            print(f"int8 {row['int8']}: max |Δw| {row['max_abs_dw']:.3g}")
            continue
        if "worst" in row:
            print(f"int8 {row['int8']}: " + ", ".join(f"{w['linear']} {w['max_abs_dp']:.4f}" for w in row["worst"]))
            continue
        print(f"int8 {row['int8']}: max |Δp| {row['max_abs_dp']:.4f}, top-1 agreement {row['top1_agreement']:.3f} "
              f"over {len(PROBE_PROMPTS)} prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
