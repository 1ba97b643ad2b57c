"""Many users at once: the request batcher against one-after-another, and the slider under load.

* ``many_users_speedup``: 8 sessions' generations (4 prompts of different
  lengths and a chat rendered by the chat template path, 2 vectors, 8
  different α, greedy and seeded sampling; one unsteered, three of one term,
  two of two terms at two blocks, two chats with two terms: :data:`KINDS`)
  run one after another ÷ the same 8 sent at once (they share the engine's
  decode batch).  Each side is the median of ``reps``, interleaved.
* ``many_users_exact``: how many of the 8 concurrent results equal their
  solo results token for token (both sides) with every reported probability
  within 1e-5.
* ``slider_p95_under_load_ms`` ÷ ``slider_p50_idle_ms``: a slider move (the
  next-token view through the service's path, which pauses the decode between
  steps) while 4 other sessions generate, against the same moves when idle.
"""
from __future__ import annotations

import math
import time

from ..model.analysis import next_token
from ..model.engine import Engine
from ..model.generation import Request, Sampling, max_positions
from ..model.hooks import Steer
from ..model.units import to_raw_alpha
from ..vector import random_vector
from .timing import at_once, median, ms, percentile, ratio

PROMPTS = ("Hi", "The weather in Paris today is", "My favourite thing about long train journeys is that",
           "Write a short story about a robot who learns to paint. Once upon a time, in a quiet town by the sea,")


# what each of the eight requests is (issue #48): every kind the page and the API send, mixed in one batch
KINDS = ("unsteered", "one term", "several terms", "chat", "one term", "several terms", "chat, prompt steered",
         "one term")
CHAT = [{"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "What is the weather like in Paris today?"}]


def chat_prompt(handle) -> str:
    """:data:`CHAT` rendered by the app's chat template path: the model's own template, else Gemma's turns."""
    from .. import chat

    template, _ = chat.template_of(handle)
    return chat.render(handle, CHAT, None if template else chat.GEMMA_TURNS)


def _requests(handle, layer: int, n_tokens: int) -> list[tuple]:
    """Eight (prompt, steers, sampling), one per :data:`KINDS`: several terms add a second vector at another
    block; a chat steers the last prompt token and the generated ones (its prompt too, where steered)."""
    hidden = handle.arch.hidden_size
    vectors = [random_vector(hidden, layer, seed=s).directions[layer] for s in (0, 1)]
    other = layer - 1 if layer > 0 else min(layer + 1, handle.arch.num_layers - 1)
    chat = chat_prompt(handle)
    out = []
    for i, kind in enumerate(KINDS):
        alpha = to_raw_alpha(handle, 0.1 + 0.05 * i, layer, relative=True) * (1 if i % 2 else -1)
        sampling = Sampling(max_new_tokens=n_tokens, stop_at_eos=False,
                            temperature=0.0 if i < 5 else 0.8, seed=i)
        positions = {"chat": "last", "chat, prompt steered": "all"}.get(kind, "all")
        steers = [Steer(layer=layer, vector=vectors[i % 2], alpha=alpha, positions=positions)]
        if kind == "unsteered":
            steers = []
        elif kind != "one term":  # several terms, and a chat's spec of two
            steers.append(Steer(layer=other, vector=vectors[(i + 1) % 2], positions=positions,
                                alpha=to_raw_alpha(handle, 0.15, other, relative=True)))
        out.append((chat if kind.startswith("chat") else PROMPTS[i % 4], steers, sampling))
    return out


def _one(engine: Engine, handle, spec) -> object:
    result = None
    for event in engine.submit(Request.make(handle, *spec)):
        result = event.result
    return result


def _sequential(engine, handle, specs) -> tuple[float, list]:
    start = time.perf_counter()
    results = [_one(engine, handle, spec) for spec in specs]
    return time.perf_counter() - start, results


def _concurrent(engine, handle, specs) -> tuple[float, list]:
    return at_once([lambda spec=spec: _one(engine, handle, spec) for spec in specs])


def _difference(a, b) -> dict:
    """How two results of one request differ: the first token where either side parts (None if none) and
    the largest gap of any reported probability before it."""
    first, max_dp = None, 0.0
    for side in ("unsteered", "steered"):
        x, y = getattr(a, side).tokens, getattr(b, side).tokens
        for i, (s, t) in enumerate(zip(x, y)):
            if s.token_id != t.token_id:
                first = i if first is None else min(first, i)
                break
            max_dp = max([max_dp, abs(math.exp(s.logprob) - math.exp(t.logprob))]
                         + [abs(p - q) for (_, p), (_, q) in zip(s.alternatives, t.alternatives)])
        if len(x) != len(y) and first is None:
            first = min(len(x), len(y))
    return {"first_token_parted": first, "max_abs_delta_prob": max_dp}


def _equal(a, b, tol: float = 1e-5) -> bool:
    """Token for token on both sides, every reported probability within ``tol``."""
    difference = _difference(a, b)
    return difference["first_token_parted"] is None and difference["max_abs_delta_prob"] <= tol


def _slider_latencies(engine, handle, layer: int, moves: int, waits: list | None = None) -> list[float]:
    """Each move's seconds, sent back to back; ``waits`` gets how long each waited for its turn (the rest ran)."""
    vec = random_vector(handle.arch.hidden_size, layer, seed=2).directions[layer]
    out = []
    for i in range(moves):
        steer = Steer(layer=layer, vector=vec, alpha=to_raw_alpha(handle, 0.02 * (i % 10), layer, relative=True))
        start = time.perf_counter()

        def move(steer=steer, start=start):
            if waits is not None:
                waits.append(time.perf_counter() - start)
            next_token(handle, PROMPTS[1], [steer])

        engine.run_move(move)  # as the app's slider moves run
        out.append(time.perf_counter() - start)
    return out


def bench_slider_under_load(engine: Engine, handle, layer: int, specs, moves: int, log) -> dict:
    """Slider moves sent back to back, idle and then while 4 of ``specs`` generate, and the decode's pace meanwhile."""
    log("bench: slider moves idle, then while 4 sessions generate")
    _slider_latencies(engine, handle, layer, 3)  # warm the prefix cache
    idle_waits, waits = [], []
    idle = _slider_latencies(engine, handle, layer, moves, idle_waits)
    longest = min(4096, (max_positions(handle) or 4096) - 128)  # as long as the positions allow (prompts < 128)
    load = [(p, s, Sampling(max_new_tokens=longest, stop_at_eos=False)) for p, s, _ in specs[:4]]
    tickets = [engine.submit(Request.make(handle, *spec)) for spec in load]
    time.sleep(0.5)  # the four are decoding
    steps_before, start = engine.stats.steps, time.perf_counter()
    loaded = _slider_latencies(engine, handle, layer, moves, waits)
    during = (engine.stats.steps - steps_before) / (time.perf_counter() - start)
    steps_before, start = engine.stats.steps, time.perf_counter()
    time.sleep(1.0)
    after = (engine.stats.steps - steps_before) / (time.perf_counter() - start)
    for t in tickets:
        t.cancel()
    return {
        "slider_p50_idle_ms": ms(median(idle)), "slider_p95_idle_ms": ms(percentile(idle, 0.95)),
        "slider_p50_under_load_ms": ms(median(loaded)), "slider_p95_under_load_ms": ms(percentile(loaded, 0.95)),
        "slider_p95_load_over_idle_p50": ratio(percentile(loaded, 0.95), median(idle)),
        # where a move's time under load goes: waiting for the decode's turn, then its own pass
        "slider_wait_p50_under_load_ms": ms(median(waits)),
        "slider_run_p50_under_load_ms": ms(median([t - w for t, w in zip(loaded, waits)])),
        "slider_run_p50_idle_ms": ms(median([t - w for t, w in zip(idle, idle_waits)])),
        # what the turn-taking costs the four generations while the moves come back to back
        "decode_steps_per_s_during_moves": round(during, 2),
        "decode_steps_per_s_after_moves": round(after, 2),
    }


def bench_many_users(handle, layer: int, n_tokens: int, reps: int, log, moves: int = 20) -> dict:
    engine = Engine(handle, max_requests=8)
    specs = _requests(handle, layer, n_tokens)
    log(f"bench: many users, 8 generations of {n_tokens} tokens, one after another vs at once, {reps} reps")
    _one(engine, handle, specs[0])  # warm-up
    # and one untimed round at once: the store grown to eight requests' rows and columns is captured once per
    # shape on CUDA (seconds, once per engine), which the first timed rep would otherwise carry (2.5 s of 2.8 at
    # stop 53; a warm-up of fewer tokens left a column growth, and its capture, to a timed rep)
    _concurrent(engine, handle, specs)
    seq, conc, exact = [], [], []
    for _ in range(reps):
        t_seq, solo = _sequential(engine, handle, specs)
        t_conc, together = _concurrent(engine, handle, specs)
        seq.append(t_seq)
        conc.append(t_conc)
        exact.append(sum(_equal(a, b) for a, b in zip(together, solo)))
        differences = [_difference(a, b) for a, b in zip(together, solo)]
    slider = bench_slider_under_load(engine, handle, layer, specs, moves, log)
    engine.close(wait=60)  # the thread ends once the cancelled rows are dropped
    return {
        "requests": 8, "new_tokens": n_tokens, "prompts": len(PROMPTS) + 1, "vectors": 2, "reps": reps,
        "kinds": list(KINDS),
        "sequential_ms": ms(median(seq)), "concurrent_ms": ms(median(conc)),
        "sequential_ms_all": [ms(x) for x in seq], "concurrent_ms_all": [ms(x) for x in conc],
        "many_users_speedup": ratio(median(seq), median(conc)),
        "many_users_exact": min(exact), "exact_per_rep": exact,
        # the last rep's, request by request: where an inexact result parted from its solo run
        "difference_from_solo": differences,
        **slider,
        "engine": {"peak_requests": engine.stats.peak_requests, "mean_rows_per_step": engine.stats.rows_per_step},
    }


MANY_PROMPTS = 16


def many_prompts(n: int = MANY_PROMPTS) -> list[str]:
    """``n`` distinct prompts of different lengths (the four above, each with a different ending)."""
    endings = ("", " and", " but", " so", " because", " while", " although", " until")
    return [PROMPTS[i % len(PROMPTS)] + endings[(i // len(PROMPTS)) % len(endings)] for i in range(n)]


def bench_many_prompts(handle, layer: int, n_tokens: int, reps: int, log) -> dict:
    """``many_prompts_speedup``: 16 prompts' side-by-side generations one after another ÷ the same 16 in one
    comparison (issue #31): both generations through the decode batch (``policy.compare_in_flight`` at a time,
    as the app runs it), then every per-prompt measure the app's *Many prompts* table shows (first-token KL,
    fluency of both texts, distinct share, concept score).  The sequential side computes none of those, so the
    ratio understates what the comparison saves."""
    from .. import steerability
    from ..policy import Policy

    in_flight = Policy().compare_in_flight
    engine = Engine(handle, max_requests=Policy().batch_requests)
    vector = random_vector(handle.arch.hidden_size, layer, seed=0).directions[layer]
    steers = [Steer(layer=layer, vector=vector, alpha=to_raw_alpha(handle, 0.2, layer, relative=True))]
    prompts = many_prompts()
    sampling = Sampling(max_new_tokens=n_tokens, stop_at_eos=False)
    specs = [(p, steers, sampling) for p in prompts]
    log(f"bench: many prompts, {len(prompts)} side by side of {n_tokens} tokens one after another vs one "
        f"comparison ({in_flight} in flight), {reps} reps")
    _one(engine, handle, specs[0])  # warm-up

    seq, together, generation_only = [], [], []
    for _ in range(reps):
        seq.append(_sequential(engine, handle, specs)[0])
        # one comparison, its generations timed inside it: two separate runs' medians could cross (CI, stop 41)
        start = time.perf_counter()
        generated = steerability.generate_all(engine, steerability.requests_for(handle, prompts, steers, sampling),
                                              in_flight, prompts)
        generation_only.append(time.perf_counter() - start)
        steerability.compare(handle, generated, steers, steers[0], 1.0)
        together.append(time.perf_counter() - start)
    engine.close(wait=60)
    return {
        "prompts": len(prompts), "new_tokens": n_tokens, "in_flight": in_flight, "reps": reps,
        "sequential_ms": ms(median(seq)), "comparison_ms": ms(median(together)),
        "comparison_generation_ms": ms(median(generation_only)),
        "sequential_ms_all": [ms(x) for x in seq], "comparison_ms_all": [ms(x) for x in together],
        "many_prompts_speedup": ratio(median(seq), median(together)),
        "many_prompts_generation_speedup": ratio(median(seq), median(generation_only)),
    }


def profile_engine(handle, layer: int, n_tokens: int, reps: int) -> str:
    """The engine thread's own time (cProfile around each scheduler iteration) over ``reps`` rounds of the eight
    requests at once, after an untimed round: the twenty costliest functions by own time, then by cumulative."""
    import cProfile
    import io
    import pstats

    engine = Engine(handle, max_requests=8)
    specs = _requests(handle, layer, n_tokens)
    _concurrent(engine, handle, specs)
    profiler = cProfile.Profile()
    iteration = engine._iteration

    def profiled(batch):
        profiler.enable()
        try:
            return iteration(batch)
        finally:
            profiler.disable()

    engine._iteration = profiled
    steps, prefills, start = engine.stats.steps, engine.stats.prefills, time.perf_counter()
    for _ in range(reps):
        _concurrent(engine, handle, specs)
    wall = time.perf_counter() - start
    steps, prefills = engine.stats.steps - steps, engine.stats.prefills - prefills
    engine.close(wait=60)
    out = io.StringIO()
    # prefill passes per round: one where the eight arrive as one burst (Engine._gather_burst)
    out.write(f"{reps} rounds of 8 at once: {1e3 * wall / reps:.1f} ms a round, {steps} steps, "
              f"{1e3 * wall / max(steps, 1):.2f} ms a step, {prefills} prefill passes\n")
    for key in ("tottime", "cumtime"):
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(20)
    return out.getvalue()


def main(argv=None) -> None:
    """``python -m steer_ui.tools.many_users --slider-only --reps 3``: this section alone, one JSON line per repetition."""
    import argparse
    import json

    from ..model.loading import EMBEDDED, load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--slider-only", action="store_true", help="only the slider under load")
    parser.add_argument("--weights", default="auto", help="auto, float32, bfloat16 or int8 (as the bench takes it)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="e.g. float32 on a GPU, to tell the batching's exactness "
                                                        "from bfloat16's rounding")
    parser.add_argument("--turn-share", type=float, default=None,
                        help="the engine's turn as a share of a slider move (Engine.turn_share), for A/B runs")
    parser.add_argument("--profile-engine", action="store_true",
                        help="instead: where the engine thread's time goes while the eight decode at once (cProfile)")
    args = parser.parse_args(argv)
    handle = load_model(args.model, device=args.device, dtype=args.dtype, weights=args.weights)
    layer = handle.arch.num_layers // 2
    if args.profile_engine:
        print(profile_engine(handle, layer, 32, args.reps))
        return
    turn = {} if args.turn_share is None else {"turn_share": args.turn_share}
    if turn and not args.slider_only:
        parser.error("--turn-share goes with --slider-only")
    for _ in range(args.reps):
        if args.slider_only:
            engine = Engine(handle, max_requests=8, **turn)
            specs = _requests(handle, layer, 32)
            # as in the full section, the engine has decoded these row counts before the timed moves
            _concurrent(engine, handle, [(p, s, Sampling(max_new_tokens=4, stop_at_eos=False)) for p, s, _ in specs[:4]])
            out = bench_slider_under_load(engine, handle, layer, specs, 20, lambda _m: None)
            engine.close(wait=60)
        else:
            out = bench_many_users(handle, layer, 32, 3, lambda _m: None)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
