"""A prefix's re-run through the model's modules against the fused pass (``steer_ui/model/fused_pass.py``).

``python -m steer_ui.tools.pass_ab --reps 3`` takes turns, in one process: a slider move (the whole next-token
view, :func:`steer_ui.model.analysis.next_token`, at ten α on the bench's 32-token prompt) and the bench's sweep
section (21 one-row calls against one 21-α sweep), each through the modules and through the pass.  It prints the
medians and how far the two paths' logits part (float32 rounding, summed in another order).

``--sweep-parts`` instead splits the bench's sweep section, through the pass, into the pass's blocks, the
unembedding and the rest, for the 21 one-row calls and for the one 21-α sweep (docs/bench.md, "The batched targets
against the instruction ceiling").
"""
from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager

import torch

from ..model import fused_pass
from ..model.analysis import next_token, prefix_state, sweep
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


@contextmanager
def _timed_parts(handle, parts: dict):
    """Inside, the pass's blocks (``fused_pass.final_last``) and the unembedding (``arch.logits``) add their
    seconds to ``parts``; then as they were."""
    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - start
        return call

    arch, blocks = handle.arch, fused_pass.final_last
    own = vars(arch).get("logits")  # an instance's own logits over the method (a caller's timer), put back after
    try:
        fused_pass.final_last = timed("blocks", blocks)
        object.__setattr__(arch, "logits", timed("unembedding", arch.logits))  # a frozen dataclass refuses set
        yield
    finally:
        fused_pass.final_last = blocks
        if own is not None:
            object.__setattr__(arch, "logits", own)
        elif "logits" in vars(arch):
            object.__delattr__(arch, "logits")  # the class's method again


def sweep_parts(handle, layer: int, reps: int) -> dict:
    """The bench's sweep section (21 α on its 32-token prompt, the α = 0 row free on both sides), the two sides
    taking turns: per side and turn, ms in the pass's blocks, in the unembedding and in the rest."""
    steer, _ = seeded_steer(handle, layer)
    prompt, _ = _prompt_of_tokens(handle, SLIDER_TEXT, 32)
    state = prefix_state(handle, prompt, layer)
    scale = float(steer.scalar_alpha)
    alphas = [scale * (-1.0 + 2.0 * i / 20) for i in range(21)]
    raw = steer.vector.to(torch.float32)
    sides = {"separate": lambda: [state.logits([steer.with_alpha(a)], rows=1) for a in alphas],
             "batched": lambda: sweep(handle, prompt, raw, layer, alphas)}
    sides["batched"]()  # warm-up: the first 21-row unembedding
    out = {side: [] for side in sides}
    for rep in range(reps):
        for side in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
            parts: dict = {}
            with _timed_parts(handle, parts):
                start = time.perf_counter()
                sides[side]()
                total = time.perf_counter() - start
            out[side].append({"total_ms": ms(total), **{f"{k}_ms": ms(v) for k, v in parts.items()},
                              "rest_ms": ms(total - sum(parts.values()))})
    out["sweep_speedup_per_turn"] = [ratio(a["total_ms"], b["total_ms"])
                                     for a, b in zip(out["separate"], out["batched"])]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--layer", type=int, default=None, help="the steered block (default: the middle one)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sweep-parts", action="store_true", help="instead: where the sweep section's time goes")
    args = parser.parse_args(argv)
    handle = load_model(args.model)
    layer = handle.arch.num_layers // 2 if args.layer is None else args.layer
    print(json.dumps((sweep_parts if args.sweep_parts else compare)(handle, layer, args.reps), indent=1))


if __name__ == "__main__":
    main()
