"""What weight-only int8 would buy and cost on this CPU (groundwork for issue #37; the app does not use it yet).

    python -m steer_ui.tools.int8_probe [--model embedded] [--repeats 20]

Prints, for the embedded model's shapes, the best-of-``repeats`` time of a 3-row product with a float32 weight
(``x @ w.T`` and the kernels the app picks today: oneDNN's linear for the blocks, :func:`architecture.unembed`
for the 262,144-row unembedding) beside ``torch.ops.aten._weight_int8pack_mm`` with bfloat16 activations (with
float32 activations it falls back to a slow path on this build); then the cost in accuracy of per-output-channel
int8 weights (symmetric, scale = max |w| / 127, dequantised to float32 so that only the weights' rounding is
measured) against float32 on the bench's fixed prompts (``measures.PROBE_PROMPTS``, as ``bench`` measures a
dtype's cost): max |Δ next-token probability| and top-1 agreement, for the blocks' linear layers alone and with
the tied embedding / unembedding as well.  One process, one run: compare
ratios, not the times of another run.
"""
from __future__ import annotations

import argparse

import torch

from .measures import PROBE_PROMPTS, next_token_probs
from .timing import ms, timings

SHAPES = ((2048, 640), (640, 2048), (1024, 640), (262144, 640))  # Gemma 3 270M: MLP, attention, unembedding


def per_channel_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 scale per output row) with w ≈ q * scale[:, None]."""
    scale = w.abs().amax(1).clamp_min(1e-12) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def _best_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    return ms(min(timings(fn, repeats, torch.device("cpu"))))


def kernel_times(repeats: int) -> list[dict]:
    from ..model.architecture import _fast_linear_forward, unembed

    rows = []
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features in SHAPES:
        w = torch.randn(out_features, in_features, generator=gen) * 0.05
        x = torch.randn(3, in_features, generator=gen)
        q, scale = per_channel_int8(w)
        xb, sb = x.to(torch.bfloat16), scale.to(torch.bfloat16)
        linear = torch.nn.Linear(in_features, out_features, bias=False)
        linear.weight.data = w
        with torch.no_grad():
            app = (lambda: unembed(w, x)) if out_features > 100_000 else (lambda: _fast_linear_forward(linear, x))
            rows.append({"shape": f"{out_features}x{in_features}", "float32_ms": _best_ms(lambda: x @ w.T, repeats),
                         "app_float32_ms": _best_ms(app, repeats),
                         "int8_bf16_ms": _best_ms(lambda: torch.ops.aten._weight_int8pack_mm(xb, q, sb), repeats)})
    return rows


def accuracy(model_source: str, min_weights: int = 1 << 16) -> list[dict]:
    """Max |Δp| and top-1 agreement of int8 weights against float32 (linear layers of at least ``min_weights``
    values, as the app's fast kernels take them)."""
    from ..model.loading import load_model

    handle = load_model(model_source)
    model = handle.model

    def report(what: str, probs: torch.Tensor) -> dict:
        return {"int8": what, "max_abs_dp": float((probs - reference).abs().max()),
                "top1_agreement": float((probs.argmax(-1) == reference.argmax(-1)).float().mean())}

    def round_trip(weight: torch.nn.Parameter) -> None:
        q, scale = per_channel_int8(weight.data.float())
        weight.data = (q.float() * scale[:, None]).to(weight.dtype)

    reference = next_token_probs(handle)
    out = []
    unembedding = model.get_output_embeddings().weight
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and weight is not unembedding and weight.numel() >= min_weights:
            round_trip(weight)
    out.append(report("block linear layers", next_token_probs(handle)))
    round_trip(unembedding)  # tied in Gemma: the embedding lookups are rounded too
    out.append(report("block linear layers and the unembedding", next_token_probs(handle)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    for row in kernel_times(args.repeats):
        print(f"{row['shape']:>11}: float32 x@w.T {row['float32_ms']:.3f} ms · app's float32 kernel "
              f"{row['app_float32_ms']:.3f} ms · int8 weights, bf16 activations {row['int8_bf16_ms']:.3f} ms")
    for row in accuracy(args.model):
        print(f"int8 {row['int8']}: max |Δp| {row['max_abs_dp']:.4f}, top-1 agreement {row['top1_agreement']:.3f} "
              f"over {len(PROBE_PROMPTS)} prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
