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
    args = parser.parse_args(argv)

    handle = load_model(args.model, device=args.device, dtype=args.dtype)
    layer = handle.arch.num_layers // 2
    handle.layer_norms()
    steer, _ = seeded_steer(handle, layer)
    batch = DecodeBatch(handle)
    _ours(handle, GENERATION_PROMPT, [steer], 4, batch)  # warm-up, capture
    _, steps, _ = _ours(handle, GENERATION_PROMPT, [steer], args.tokens, batch)
    lines = [f"model {args.model} {args.dtype} on {handle.input_device}; path {batch.decode_path}",
             f"side-by-side step: median {1e3 * statistics.median(steps):.3f} ms over {len(steps)} steps"]
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
