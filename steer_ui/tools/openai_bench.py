"""Many API clients at once (issue #49): ``/v1`` streams, each with its own steering, served together against the
same streams one after another and against the same streams served one at a time behind a lock (saklas's way).

* ``openai_concurrency_speedup``: 8 streamed completions (4 prompts; 7 steerings of 2 random directions at
  different relative α, one unsteered; greedy) sent one after another ÷ the same 8 sent at once by 8 clients.
  They go over HTTP to ``/v1`` on a server in this process (uvicorn, the app's own router and door, this
  handle), so the time includes reading each request, the SSE chunks and the client's parsing.
* ``openai_locked_ms``: the same 8 sent at once to the same server with a lock around each ``/v1`` request, so
  the server serves one at a time (as saklas serves per-request steering), and ``openai_speedup_over_locked``:
  that ÷ the 8 at once here.
* ``openai_exact``: of the 8 concurrent answers, how many equal their one-after-another answers (greedy text).

Each side is the median of ``reps``, the three interleaved.  ``python -m steer_ui.tools.openai_bench`` runs this
section alone and prints one JSON object.
"""
from __future__ import annotations

import asyncio
import json
import socket
import tempfile
import threading
import time

from .many_users import PROMPTS
from .timing import at_once, median, ms, ratio

CLIENTS = 8


def _steerings(layer: int) -> list[dict | None]:
    """Client 0 unsteered; the others two random directions at alternating signs and growing relative α."""
    out: list[dict | None] = [None]
    for i in range(1, CLIENTS):
        scale = (0.1 + 0.05 * i) * (1 if i % 2 else -1)
        out.append({"vectors": [{"source": "random", "seed": i % 2, "scale": scale, "layers": [layer],
                                 "normalize": True}]})
    return out


class _OneAtATime:
    """ASGI wrapper: while ``on``, each ``/v1`` request (its whole stream) holds one lock, so requests are served
    one after another in arrival order, as a server that runs one generation at a time serves them."""

    def __init__(self, app):
        self.app, self.on, self._lock = app, False, None

    async def __call__(self, scope, receive, send):
        if not (self.on and scope.get("type") == "http" and scope.get("path", "").startswith("/v1/")):
            return await self.app(scope, receive, send)
        if self._lock is None:
            self._lock = asyncio.Lock()  # made in the server's event loop
        async with self._lock:
            await self.app(scope, receive, send)


class _Server:
    """``/v1`` on 127.0.0.1 in a thread of this process: the app's own router over a door on ``handle``."""

    def __init__(self, handle):
        import uvicorn
        from fastapi import FastAPI

        from ..openai_api.server import router
        from ..service import Service

        self.backend = Service(handle=handle, workdir=tempfile.mkdtemp(prefix="steer_ui-openai-bench-"))
        app = FastAPI()
        app.include_router(router(self.backend))
        self.wrapper = _OneAtATime(app)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # a free port, held from here on: no other process can take it meanwhile
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
        self.server = uvicorn.Server(uvicorn.Config(self.wrapper, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name="openai-bench-server",
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the bench's /v1 server did not start")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.backend.engine().close(wait=30)


def _stream(url: str, prompt: str, steering: dict | None, tokens: int) -> str:
    """One streamed completion, read chunk by chunk as a client does; its text."""
    import httpx

    body = {"model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
    if steering is not None:
        body["steering"] = steering
    text = []
    with httpx.Client(timeout=600) as http, http.stream("POST", url, json=body) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"/v1 refused a bench request: {answer.status_code} {answer.read()[:200]!r}")
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"/v1 failed a bench request: {chunk['error']['message']}")
            text += [c["text"] for c in chunk["choices"]]
    return "".join(text)


def _one_after_another(url, requests) -> tuple[float, list[str]]:
    start = time.perf_counter()
    texts = [_stream(url, *r) for r in requests]
    return time.perf_counter() - start, texts


def _at_once(url, requests) -> tuple[float, list[str]]:
    return at_once([lambda r=r: _stream(url, *r) for r in requests])


def bench_openai(handle, layer: int, n_tokens: int, reps: int, log) -> dict:
    """The section's numbers (see the module docstring)."""
    requests = [(PROMPTS[i % len(PROMPTS)], steering, n_tokens) for i, steering in enumerate(_steerings(layer))]
    log(f"bench: /v1, {CLIENTS} streams of {n_tokens} tokens with {CLIENTS} steerings: one after another, at "
        f"once, and at once behind a lock, {reps} reps")
    server = _Server(handle)
    try:
        _stream(server.url, *requests[0])  # warm-up: the engine's thread, the first pass
        seq, conc, locked, exact = [], [], [], []
        for _ in range(reps):
            t_seq, solo = _one_after_another(server.url, requests)
            t_conc, together = _at_once(server.url, requests)
            server.wrapper.on = True
            try:
                t_locked, one_by_one = _at_once(server.url, requests)
            finally:
                server.wrapper.on = False
            seq.append(t_seq)
            conc.append(t_conc)
            locked.append(t_locked)
            exact.append(min(sum(a == b for a, b in zip(together, solo)),
                             sum(a == b for a, b in zip(one_by_one, solo))))
        engine = server.backend.engine().stats
    finally:
        server.close()
    return {
        "clients": CLIENTS, "new_tokens": n_tokens, "prompts": len(PROMPTS), "reps": reps,
        "steerings": "7 of 2 random directions at relative α ±0.15..0.45, 1 unsteered; greedy; streamed",
        "sequential_ms": ms(median(seq)), "concurrent_ms": ms(median(conc)), "locked_ms": ms(median(locked)),
        "sequential_ms_all": [ms(x) for x in seq], "concurrent_ms_all": [ms(x) for x in conc],
        "locked_ms_all": [ms(x) for x in locked],
        "openai_concurrency_speedup": ratio(median(seq), median(conc)),
        "openai_speedup_over_locked": ratio(median(locked), median(conc)),
        "openai_exact": min(exact), "exact_per_rep": exact,
        # steered-only requests: one row each (issue #49), so 8 clients are 8 rows, not 24
        "engine": {"peak_requests": engine.peak_requests, "mean_rows_per_step": engine.rows_per_step},
    }


def main(argv=None) -> None:
    """``python -m steer_ui.tools.openai_bench [--model M] [--tokens 32] [--reps 3]``: this section alone."""
    import argparse

    from ..model.loading import EMBEDDED, load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--weights", default="auto")
    args = parser.parse_args(argv)
    handle = load_model(args.model, device="cpu", weights=args.weights)
    started = time.perf_counter()
    out = bench_openai(handle, handle.arch.num_layers // 2, args.tokens, args.reps, lambda _m: None)
    print(json.dumps({**out, "model": args.model, "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
