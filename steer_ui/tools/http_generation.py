"""How long a running app takes to generate, as a user's browser asks for it: over HTTP, through the queue,
the door and the engine.

    python app.py &                                        # or any running steer_ui app
    python -m steer_ui.tools.http_generation --url http://127.0.0.1:7860/ [--tokens 64] [--repeats 4]

Each repetition first moves the slider once (a ``/next_token`` call, as a user does before pressing Generate,
so a request thread has computed), then times one ``/generate`` of ``--tokens`` new tokens, greedy, on the
bundled random direction at ``--layer`` (default 9, the embedded model's middle block).  Prints one JSON
object: every time, the median and the median per step.  The bench times the decode inside one process; this
is the number a visitor meets.  A session keeps the unsteered side of its last generations
(:mod:`steer_ui.rooms.unsteered_memo`), so from the second repetition on only the steered and counterfactual
rows decode, as for a visitor who moves α and generates again; ``--new-seed-each`` gives every repetition a seed
of its own (greedy, so the same tokens), and with it every generation decodes all three rows.
"""
from __future__ import annotations

import argparse
import json
import time

from .timing import median

PROMPT = "The weather in Paris today is"
VECTOR = "random direction"
EMBEDDED_MIDDLE = 9  # the embedded Gemma 3 270M's middle block, the bench's steering layer


def measure(url: str, tokens: int = 64, repeats: int = 4, layer: int = EMBEDDED_MIDDLE,
            new_seed_each: bool = False) -> dict:
    """Time ``repeats`` generations of ``tokens`` tokens from the app at ``url`` (after one untimed); with
    ``new_seed_each`` each under a seed of its own, so that no generation finds its unsteered side kept."""
    from gradio_client import Client

    client = Client(url, verbose=False, download_files=False)

    def move(alpha: float):
        client.predict(PROMPT, VECTOR, layer, alpha, True, 0, api_name="/next_token")

    def generate(seed: int = 0):
        # the random direction's seed 0, greedy; the last value is the sampling's seed
        return client.predict(PROMPT, VECTOR, layer, 0.2, True, 0, True, 0.8, 0, 1.0, 1.0, tokens, seed,
                              api_name="/generate")

    move(0.2)
    out = generate()
    times = []
    for i in range(repeats):
        move(0.05 * i)
        start = time.perf_counter()
        out = generate(i + 1 if new_seed_each else 0)
        times.append(time.perf_counter() - start)
    steps = len(out[-1]["steered"]["tokens"])
    return {"url": url, "layer": layer, "new_tokens": tokens, "steps": steps, "new_seed_each": new_seed_each,
            "seconds": [round(t, 3) for t in times], "median_s": round(median(times), 3),
            "median_ms_per_step": round(median(times) / max(1, steps) * 1000, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7860/")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--layer", type=int, default=EMBEDDED_MIDDLE)
    parser.add_argument("--new-seed-each", action="store_true",
                        help="a seed of its own for each repetition: every generation decodes its unsteered side")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.url, args.tokens, args.repeats, args.layer, args.new_seed_each)))


if __name__ == "__main__":
    main()
