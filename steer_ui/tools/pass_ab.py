"""A prefix's re-run through the model's modules against the fused pass (``steer_ui/model/fused_pass.py``).

``python -m steer_ui.tools.pass_ab --reps 3`` takes turns, in one process: a slider move (the whole next-token
view, :func:`steer_ui.model.analysis.next_token`, at ten α on the bench's 32-token prompt) and the bench's sweep
section (21 one-row calls against one 21-α sweep), each through the modules and through the pass.  It prints the
medians and how far the two paths' logits part (float32 rounding, summed in another order).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ..model import fused_pass
from ..model.analysis import next_token, prefix_state
from ..model.loading import load_model
from .measures import SLIDER_TEXT, _prompt_of_tokens, bench_sweep, seeded_steer
from .timing import median, ms, ratio


def _moves(handle, prompt: str, steer, alphas) -> float:
    """The median seconds of a slider move's whole view over ``alphas``."""
    times = []
    for a in alphas:
        t0 = time.perf_counter()
        next_token(handle, prompt, [steer.with_alpha(a)])
        times.append(time.perf_counter() - t0)
    return median(times)


def compare(handle, layer: int, reps: int) -> dict:
    steer, _ = seeded_steer(handle, layer)
    prompt, _ = _prompt_of_tokens(handle, SLIDER_TEXT, 32)
    base = float(steer.scalar_alpha)
    alphas = [base * (-1.0 + 2.0 * i / 9) for i in range(10)]
    state = prefix_state(handle, prompt, layer)
    rows = steer.with_alpha(torch.tensor(alphas))
    fused = state.logits([rows], rows=len(alphas))
    with fused_pass.modules_only():
        modules = state.logits([rows], rows=len(alphas))
    out = {"why_not": fused_pass.why_not(state), "max_abs_delta_logit": float((fused - modules).abs().max()),
           "max_abs_delta_prob": float((fused.softmax(-1) - modules.softmax(-1)).abs().max()),
           "top1_same": bool(torch.equal(fused.argmax(-1), modules.argmax(-1)))}
    runs: dict[str, dict[str, list]] = {side: {"move": [], "separate": [], "batched": [], "speedup": []}
                                        for side in ("modules", "pass")}
    quiet = lambda *_: None  # noqa: E731
    for _ in range(reps):
        for side in ("modules", "pass"):
            if side == "modules":
                with fused_pass.modules_only():
                    move, sweep = _moves(handle, prompt, steer, alphas), bench_sweep(handle, steer, steer.vector,
                                                                                     layer, 3, quiet)
            else:
                move, sweep = _moves(handle, prompt, steer, alphas), bench_sweep(handle, steer, steer.vector, layer,
                                                                                 3, quiet)
            runs[side]["move"].append(ms(move))
            runs[side]["separate"].append(sweep["separate_ms"])
            runs[side]["batched"].append(sweep["batched_ms"])
            runs[side]["speedup"].append(round(sweep["sweep_speedup"], 3))
    for side, r in runs.items():
        out[side] = {**r, "move_p50_ms": median(r["move"]), "sweep_speedup_median": median(r["speedup"])}
    out["move_pass_over_modules"] = ratio(out["pass"]["move_p50_ms"], out["modules"]["move_p50_ms"])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--layer", type=int, default=None, help="the steered block (default: the middle one)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    handle = load_model(args.model)
    layer = handle.arch.num_layers // 2 if args.layer is None else args.layer
    print(json.dumps(compare(handle, layer, args.reps), indent=1))


if __name__ == "__main__":
    main()
