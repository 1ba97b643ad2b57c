"""What a sampled token costs on the CPU, the sampler's way against the whole-vocabulary way, on real logits.

``python -m steer_ui.tools.sampling_cost [--reps 20] [--decode] [--uniforms]``

The next-token logits of the precision probe's six prompts (the embedded model unless ``--model``), for three settings an
API client or the page sends.  Each rep times, for one row, the whole-vocabulary way (top-p by sorting the
vocabulary, the Gumbel noise of every token added to every logit) and the sampler's (:mod:`steer_ui.model.sampler`),
the two alternated, each from a fresh draw of the same seeded stream; both include drawing the step's uniforms.
Prints the median milliseconds a row and step, and how many of the draws picked the same token.  ``--decode``
also times whole decode steps of one sampled sequence (steered only and side by side) in this tree.
``--uniforms`` times a step's uniforms drawn by ``torch.rand`` (into a new tensor, then clamped, as before) and by
:mod:`steer_ui.model.mt_stream` (into a kept buffer), turn about, and whether they were equal; then sampled decode
steps (T 1.0, steered only and side by side) with each, turn about, and whether the texts were equal.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch

from ..model import mt_stream, sampler
from ..model.generation import DecodeBatch, Sampling, stream_side_by_side
from ..model.hooks import Steer
from ..model.precision import PROBE_PROMPTS
from ..model.units import to_raw_alpha
from ..vector import random_vector
from .measures import GENERATION_PROMPT
from .timing import median

SETTINGS = {"T 1.0": dict(temperature=1.0), "T 0.8, top-p 0.95": dict(temperature=0.8, top_p=0.95),
            "T 0.7, top-k 40, top-p 0.9": dict(temperature=0.7, top_k=40, top_p=0.9)}


def whole_vocabulary(logits: torch.Tensor, s: Sampling, rng: torch.Generator) -> torch.Tensor:
    """The token by the whole-vocabulary formulas: every filter over every token, noise for every token."""
    u = sampler.uniforms(rng, logits.shape[-1])
    x = logits / s.temperature
    top_k = s.top_k if s.top_k and s.top_k < x.shape[-1] else 0
    x = sampler.top_p_by_sorting(x, s.top_p, top_k) if s.top_p < 1.0 else \
        (sampler.top_k_filter(x, top_k) if top_k else x)
    return sampler.whole_vocabulary_draw(x, u)


def the_samplers_way(logits: torch.Tensor, s: Sampling, rng: torch.Generator) -> torch.Tensor:
    u = sampler.uniforms(rng, logits.shape[-1])
    return sampler.choose(sampler.process_logits(logits, None, s), s, u)


def next_token_logits(handle) -> list[torch.Tensor]:
    rows = []
    with torch.inference_mode():
        for prompt in PROBE_PROMPTS:
            ids = handle.tokenizer(prompt, return_tensors="pt").input_ids.to(handle.input_device)
            rows.append(handle.model(input_ids=ids).logits[:, -1].float().cpu())
    return rows


def time_sampling(handle, reps: int) -> dict:
    rows = next_token_logits(handle)
    out = {}
    for name, kwargs in SETTINGS.items():
        s = Sampling(**kwargs)
        times: dict[str, list[float]] = {"whole vocabulary": [], "sampler": []}
        same = total = 0
        for row in rows:
            for rep in range(reps):
                picked = {}
                for way, fn in (("whole vocabulary", whole_vocabulary), ("sampler", the_samplers_way)):
                    rng = sampler.noise_generator(rep, "cpu")
                    start = time.perf_counter()
                    picked[way] = int(fn(row, s, rng))
                    times[way].append(time.perf_counter() - start)
                same += picked["whole vocabulary"] == picked["sampler"]
                total += 1
        out[name] = {way: round(median(t) * 1e3, 2) for way, t in times.items()} | {"same_token": f"{same}/{total}"}
    return out


def _decode_steer(handle) -> Steer:
    """The decode timings' steer: a seeded random direction at a third of the blocks, relative α 0.3."""
    layer = handle.arch.num_layers // 3
    vector = random_vector(handle.arch.hidden_size, layer, seed=2).directions[layer]
    return Steer(layer=layer, vector=vector, alpha=to_raw_alpha(handle, 0.3, layer, relative=True))


def time_decode(handle, tokens: int = 48, reps: int = 4) -> dict:
    steer = _decode_steer(handle)
    out = {}
    for name, kwargs in list(SETTINGS.items())[:2] + [("greedy", dict(temperature=0.0))]:
        for alone in (True, False):
            batch, steps = DecodeBatch(handle), []
            for rep in range(reps):
                s = Sampling(max_new_tokens=tokens, stop_at_eos=False, seed=rep, unsteered=not alone,
                             counterfactual=not alone, **kwargs)
                stamps = [time.perf_counter() for _ in stream_side_by_side(handle, GENERATION_PROMPT, [steer], s,
                                                                           batch=batch)]
                batch.advance()
                if rep:  # the first run warms up
                    steps += [b - a for a, b in zip(stamps, stamps[1:])]
            out[f"{name}, {'steered only' if alone else 'side by side'}"] = round(median(steps) * 1e3, 2)
    return out


def time_uniforms(vocab: int = 262_144, reps: int = 300) -> dict:
    """Median ms of one step's draw each way, alternated, and whether every pair of draws was equal."""
    ours, theirs = sampler.noise_generator(0, "cpu"), sampler.noise_generator(0, "cpu")
    kept = torch.empty(vocab, dtype=torch.float64)
    times: dict[str, list[float]] = {"torch.rand": [], "mt_stream": []}
    equal = True
    for _ in range(reps):
        start = time.perf_counter()
        with mt_stream.left_to_torch():
            expected = sampler.uniforms(theirs, vocab)
        times["torch.rand"].append(time.perf_counter() - start)
        start = time.perf_counter()
        got = sampler.uniforms(ours, vocab, out=kept)
        times["mt_stream"].append(time.perf_counter() - start)
        equal &= torch.equal(got, expected)
    return {way: round(median(t) * 1e3, 3) for way, t in times.items()} | {"equal": equal, "reps": reps}


def decode_with_each_draw(handle, reps: int = 4, tokens: int = 48) -> dict:
    """The sampled steered-only and side-by-side steps (T 1.0) with torch's draw and the kernel's, turn about:
    per way the median step of each rep, in ms, and whether the texts were equal."""
    steer = _decode_steer(handle)
    ways = {"torch.rand": mt_stream.left_to_torch, "mt_stream": contextlib.nullcontext}
    out = {}
    for alone in (True, False):
        steps: dict[str, list[float]] = {way: [] for way in ways}
        texts: dict[str, set] = {way: set() for way in ways}
        for rep in range(reps + 1):  # the first round warms up
            for way in (list(ways) if rep % 2 else list(reversed(ways))):
                s = Sampling(max_new_tokens=tokens, stop_at_eos=False, seed=7, temperature=1.0, unsteered=not alone,
                             counterfactual=not alone)
                stamps, last = [], None
                with ways[way]():
                    for last in stream_side_by_side(handle, GENERATION_PROMPT, [steer], s):
                        stamps.append(time.perf_counter())
                if rep:
                    steps[way].append(round(median([b - a for a, b in zip(stamps, stamps[1:])]) * 1e3, 2))
                texts[way].add((last.result.unsteered.text, last.result.steered.text))
        out["steered only" if alone else "side by side"] = {
            **steps, "texts_equal": texts["torch.rand"] == texts["mt_stream"] and len(texts["mt_stream"]) == 1}
    return out


def main(argv=None) -> None:
    import json

    from ..model.loading import EMBEDDED, load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--decode", action="store_true", help="also the decode step of one sampled sequence")
    parser.add_argument("--uniforms", action="store_true",
                        help="instead: a step's uniforms from torch.rand and from the C generator, then sampled "
                             "decode steps with each, turn about")
    args = parser.parse_args(argv)
    if args.uniforms:
        print(json.dumps({"uniforms_ms": time_uniforms()}), flush=True)
        print(json.dumps({"decode_step_ms": decode_with_each_draw(load_model(args.model))}))
        return
    handle = load_model(args.model)
    print(json.dumps({"ms_a_row_and_step": time_sampling(handle, args.reps)}, indent=1), flush=True)
    if args.decode:
        print(json.dumps({"decode_step_ms": time_decode(handle)}, indent=1))


if __name__ == "__main__":
    main()
