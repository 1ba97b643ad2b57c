"""Each weight precision against float32 on the fixed prompts: docs/models.md's Weight precision table, measured.

    python -m steer_ui.tools.precision_table [--model embedded] [--tokens 16]

Loads the model as float32, int8 and bfloat16 in one process (int8 only on a CPU) and prints, per precision,
max |Δ next-token probability| and top-1 agreement against float32 over ``precision.PROBE_PROMPTS``, and where
its greedy text first parts from float32's within ``--tokens`` tokens.  Speed is the bench's (``vs_float32``).
"""
from __future__ import annotations

import argparse

from ..model.generation import Sampling, side_by_side
from ..model.loading import load_model
from ..model.precision import PROBE_PROMPTS, next_token_probs


def greedy(handle, prompt: str, tokens: int) -> list[int]:
    return [t.token_id for t in side_by_side(handle, prompt, [], Sampling(max_new_tokens=tokens)).unsteered.tokens]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """1-based position of the first differing token, None if identical."""
    return next((i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def compare(model: str | None, tokens: int, weights=("int8", "bfloat16")) -> list[dict]:
    reference = load_model(model, device="cpu", weights="float32")
    ref_probs = next_token_probs(reference)
    ref_text = {p: greedy(reference, p, tokens) for p in PROBE_PROMPTS}
    rows = []
    for name in weights:
        handle = load_model(model, device="cpu", weights=name)
        probs = next_token_probs(handle)
        rows.append({"weights": name, "max_abs_dp": float((probs - ref_probs).abs().max()),
                     "top1": f"{int((probs.argmax(-1) == ref_probs.argmax(-1)).sum())}/{len(PROBE_PROMPTS)}",
                     "parts_at": {p: first_difference(ref_text[p], greedy(handle, p, tokens)) for p in PROBE_PROMPTS}})
        del handle
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args(argv)
    print("| weights | max |Δp| vs float32 | top-1 | greedy text parts from float32 at token |")
    print("|---|---|---|---|")
    for row in compare(args.model, args.tokens):
        parts = [f"{p!r}: {at if at else 'never'}" for p, at in row["parts_at"].items()]
        print(f"| {row['weights']} | {row['max_abs_dp']:.2g} | {row['top1']} | {'; '.join(parts)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
