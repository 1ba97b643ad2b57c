"""Where the batched sweep and the batched activation extraction spend their time (issue #31 asked for this before
any tuning): one torch.profiler run of each, the bench's own inputs, the twelve costliest operations by self time
with their shapes.

``python -m steer_ui.tools.profile_batched`` (about a minute on two cores); docs/bench.md reads it.
"""
from __future__ import annotations

import time


def _top(prof, title: str, rows: int = 12) -> list[str]:
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    lines = [f"== {title}: {total / 1e3:.0f} ms of operator self time"]
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]:
        lines.append(f"{e.self_cpu_time_total / 1e3:8.1f} ms {100 * e.self_cpu_time_total / total:5.1f}% "
                     f"{e.count:5d}x {e.key:30s} {str(e.input_shapes)[:110]}")
    return lines


def main(argv=None) -> None:
    import argparse

    from torch.profiler import ProfilerActivity, profile

    from ..data import load_dataset
    from ..data.activations import extract
    from ..model.analysis import sweep
    from ..model.loading import EMBEDDED, load_model
    from ..vector import random_vector
    from .measures import DATASETS, SLIDER_TEXT, _prompt_of_tokens

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED)
    args = parser.parse_args(argv)
    handle = load_model(args.model)
    layer = handle.arch.num_layers // 2
    prompt, n_tokens = _prompt_of_tokens(handle, SLIDER_TEXT, 32)
    vector = random_vector(handle.arch.hidden_size, layer, seed=0).directions[layer].float()
    alphas = [-1.0 + 2.0 * i / 20 for i in range(21)]
    sweep(handle, prompt, vector, layer, alphas)  # warm-up, as the bench does
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        sweep(handle, prompt, vector, layer, alphas)
        wall = time.perf_counter() - start
    print("\n".join(_top(prof, f"batched sweep: 21 α, {n_tokens}-token prompt, block {layer}, "
                               f"wall {wall * 1e3:.0f} ms")))
    dataset = load_dataset(str(DATASETS / "capitals_statements.csv"))
    extract(handle, dataset, batch_size=32, cache=False)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        extract(handle, dataset, batch_size=32, cache=False)
        wall = time.perf_counter() - start
    print("\n".join(_top(prof, f"batched extraction: {len(dataset)} statements, batch 32, "
                               f"wall {wall * 1e3:.0f} ms")))


if __name__ == "__main__":
    main()
