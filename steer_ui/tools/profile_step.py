"""Where the side-by-side decode step's time goes on a GPU (issue #51: the 8B step was 8.6 ms against a 4.4 ms
weight-read floor): the step's wall time, the GPU's busy time inside it, and torch.profiler's costliest
operations by GPU time and by host time.

``python -m steer_ui.tools.profile_step --model random:llama-8b --device cuda --dtype bfloat16`` (a minute on an
H200, most of it building the model); ``steer_ui/tools/gpu_run.sh`` runs it and keeps the text.
"""
from __future__ import annotations

import statistics
import time


def _table(prof, key: str, rows: int, title: str) -> list[str]:
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events) or 1
    lines = [f"== {title}"]
    for e in sorted(events, key=lambda e: -getattr(e, key))[:rows]:
        value = getattr(e, key)
        lines.append(f"{value / 1e3:9.2f} ms {100 * value / total:5.1f}% {e.count:6d}x  {e.key[:90]}")
    return lines


def fusions_ab(handle, steer, fused_batch, tokens: int, rounds: int) -> str:
    """The side-by-side step with the load's fusions (``fused_batch``, captured with them) against a batch
    captured with the model's own modules (:func:`~steer_ui.model.fused_ops.uninstalled`), runs of
    ``tokens`` alternating for ``rounds``; one line of medians."""
    from ..model import fused_ops
    from ..model.generation import DecodeBatch
    from .measures import GENERATION_PROMPT, _ours

    if not any(handle.fused.values()):
        return "fusions A/B: nothing was fused at load"
    own_batch = DecodeBatch(handle)
    with fused_ops.uninstalled(handle.model):
        _ours(handle, GENERATION_PROMPT, [steer], 4, own_batch)  # its capture, without the fusions
    times = {"fused": [], "own": []}
    for _ in range(rounds):
        _, steps, _ = _ours(handle, GENERATION_PROMPT, [steer], tokens, fused_batch)
        times["fused"] += steps
        with fused_ops.uninstalled(handle.model):
            _, steps, _ = _ours(handle, GENERATION_PROMPT, [steer], tokens, own_batch)
        times["own"] += steps
    fused, own = (1e3 * statistics.median(times[k]) for k in ("fused", "own"))
    return (f"fusions A/B ({rounds} alternating rounds of {tokens} steps): fused {fused:.3f} ms a step, the "
            f"model's own modules {own:.3f} ms (own / fused {own / fused:.3f})")


def host_waits(handle, steer, batch, tokens: int = 8) -> list[str]:
    """Where a step makes the host wait for the GPU (torch's sync debug mode warns at each such call), counted by
    the innermost line of this project that made it, per step."""
    import collections
    import traceback
    import warnings

    import torch

    from .measures import GENERATION_PROMPT, _ours

    seen: collections.Counter = collections.Counter()

    def place(*_args, **_kwargs):
        frames = [f for f in traceback.extract_stack()
                  if "steer_ui" in f.filename and not f.filename.endswith("profile_step.py")]
        f = frames[-1] if frames else None
        seen[f"{f.filename.split('steer_ui/')[-1]}:{f.lineno} {f.line}" if f else "outside steer_ui"] += 1

    lines = [f"== host waits for the GPU in {tokens} side-by-side steps (torch sync debug mode)"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = place
            torch.cuda.set_sync_debug_mode("warn")
            try:
                _ours(handle, GENERATION_PROMPT, [steer], tokens, batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    except Exception as exc:  # noqa: BLE001 - a diagnostic: say why it could not run, keep the profile
        return lines + [f"not measured: {type(exc).__name__}: {exc}"]
    return lines + [f"{n / tokens:6.2f} a step  {where[:150]}" for where, n in seen.most_common(20)]


def main(argv=None) -> None:
    import argparse

    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..model.generation import DecodeBatch
    from ..model.loading import load_model
    from .measures import GENERATION_PROMPT, _ours, seeded_steer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:llama-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the fusions' A/B")
    args = parser.parse_args(argv)

    handle = load_model(args.model, device=args.device, dtype=args.dtype)
    layer = handle.arch.num_layers // 2
    handle.layer_norms()
    steer, _ = seeded_steer(handle, layer)
    batch = DecodeBatch(handle)
    _ours(handle, GENERATION_PROMPT, [steer], 4, batch)  # warm-up, capture
    _, steps, _ = _ours(handle, GENERATION_PROMPT, [steer], args.tokens, batch)
    lines = [f"model {args.model} {args.dtype} on {handle.input_device}; path {batch.decode_path}; "
             f"fused at load {handle.fused}",
             f"side-by-side step: median {1e3 * statistics.median(steps):.3f} ms over {len(steps)} steps",
             fusions_ab(handle, steer, batch, args.tokens, args.rounds)]
    if handle.device.type == "cuda":
        lines += host_waits(handle, steer, batch)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if handle.device.type == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        _, steps, _ = _ours(handle, GENERATION_PROMPT, [steer], args.tokens, batch)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in events)  # kernels' time; host-side operators add none
    lines.append(f"profiled: {args.tokens} tokens in {wall * 1e3:.1f} ms (with the profiler's own cost); "
                 f"GPU busy {gpu / 1e3:.1f} ms = {gpu / 1e3 / max(len(steps) + 1, 1):.3f} ms a step")
    lines += _table(prof, "self_device_time_total", 25, "by GPU time (kernels)")
    lines += _table(prof, "self_cpu_time_total", 25, "by host time (self)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
