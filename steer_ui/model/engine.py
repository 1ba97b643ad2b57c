"""The request batcher: every session's generations as rows of one decode batch.

Serving engines batch concurrent requests (continuous batching in vLLM and
TGI); this module does the same for side-by-side steered generation.  One
scheduler thread owns a :class:`~.generation.DecodeBatch` and loops:

1. admit waiting requests (up to ``max_requests`` in the batch; the first
   ones wait ``gather_seconds`` for company so that a burst shares prompt
   passes, one per prompt length on the CPU: ``generation.prefill_groups``);
2. sample every request's next tokens and hand each request its event;
3. drop the requests that are done, cancelled or past their deadline, and run
   one decode step for the rest.

A decode step for many rows costs far less than a step per row: the weights
are read once per step whatever the number of rows.

The interface is deliberately small, so that a serving engine with
per-request steering (EasySteer on vLLM keeps a steering vector per request
in a slot, as LoRA adapters are kept) could replace this loop by swapping
this one module:

* :meth:`Engine.submit` (a validated :class:`~.generation.Request`) → a
  :class:`Ticket`, or :class:`EngineBusy` when too many are waiting;
* iterating a ticket gives the request's :class:`~.generation.StepEvent` s as
  they come (each with a snapshot of the result so far); an error the
  engine met for this request is raised there;
* :meth:`Ticket.cancel`: the request's rows leave at the next step;
* :meth:`Engine.run_move`: a short interactive pass (a slider move) computed in turn with the decode.
"""
from __future__ import annotations

import atexit
import logging
import queue
import statistics
import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch

from .cpu_threads import prepare_helpers, release_helpers
from .generation import DecodeBatch, Request, StepEvent, prefill_groups

log = logging.getLogger(__name__)
T = TypeVar("T")

_DONE = object()
_GRACE_SECONDS = 30.0  # past its deadline a ticket waits this much longer for the engine's own answer
# weight of the newest move in the running mean of a move's duration: the mean follows the last few moves (a new
# prompt or model changes their cost), and one slow move shifts it by a fifth of the difference, not all of it
_MOVE_MEAN_WEIGHT = 0.2
# At interpreter exit a daemon thread still inside torch when finalization starts is ended by pthread_exit, whose
# unwinding through torch's C++ frames calls std::terminate: "terminate called without an active exception" and
# exit status 134, seen in 2 of 6 runs of a test that left a generation running.  So every engine with a thread
# is stopped before finalization (atexit runs while daemon threads still run), waiting this long for its step.
_EXIT_WAIT_SECONDS = 10.0
_LIVE: "weakref.WeakSet[Engine]" = weakref.WeakSet()


class EngineBusy(RuntimeError):
    """Too many requests are waiting already: try again in a moment."""


class EngineTimeout(RuntimeError):
    """A request ran past its deadline (waiting included) and was stopped."""


_GATHER_AT_MOST = 4  # an idle engine gathers a burst for at most this many gather times


class Ticket:
    """One submitted request: iterate it for its events; :meth:`cancel` gives up on it."""

    def __init__(self, engine: "Engine", request: Request, deadline: float):
        self.request = request
        self.deadline = deadline
        self.arrived = time.monotonic()
        self.superseded = False  # cancelled because a newer generation of the same page took its place
        self._engine = engine
        self._events: "queue.Queue" = queue.Queue()

    def cancel(self) -> None:
        """Drop the request's rows at the next step (safe to call at any time, from any thread, twice)."""
        if not self.request.done:
            self.request.cancelled = True
            self._engine._wake()

    def _next(self):
        """The next item; a server that stays silent past the deadline (plus a grace) ends the wait."""
        try:
            return self._events.get(timeout=max(0.0, self.deadline - time.monotonic()) + _GRACE_SECONDS)
        except queue.Empty:
            return EngineTimeout("the server did not answer in time")

    def __iter__(self):
        try:
            while True:
                item = self._next()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # a consumer that stops reading (a closed browser tab) frees the rows
            self.cancel()

    def newest(self):
        """Like iterating, but when the consumer is slower than the decode, skip to the newest event.

        Every event carries the whole result so far, so only the last one waiting matters.
        """
        try:
            item = self._next()
            while True:
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                try:
                    later = self._events.get_nowait()
                except queue.Empty:
                    yield item
                    item = self._next()
                    continue
                if later is _DONE or isinstance(later, BaseException):
                    yield item
                item = later
        finally:
            self.cancel()

    # engine side
    def _put(self, item) -> None:
        self._events.put(item)


# the engine's speed is the median of its last this many measurements: a first pass (lazy set-up, a cold cache)
# or one slowed by a burst of slider moves moves it little, and a lasting change shows within seconds
_SPEED_SAMPLES = 32
# prefills shorter than this many token rows (3 rows × tokens) say more about a pass's fixed cost than about the
# cost per token, so they are not used for the per-token rate; one pass of this size measures it when none did
_LONG_PREFILL_ROWS = 192


@dataclass
class EngineStats:
    steps: int = 0
    rows_per_step: float = 0.0  # running mean
    rows: int = 0  # the rows the batch decodes now (each request's kinds: three, or fewer over the API)
    admitted: int = 0
    prefills: int = 0  # admissions, each one prefill pass (or one per group of similar lengths on the CPU)
    peak_requests: int = 0
    # The engine's measured speed: seconds a prefill takes per token row (prompt tokens × 3 rows, from prefills of
    # at least _LONG_PREFILL_ROWS) and a decode step per row, each the median of the last _SPEED_SAMPLES.
    # Admission estimates a job's time from them (:meth:`estimate_seconds`).  A step's time includes the turns it
    # gives slider moves, so under load the speed reads slower, and estimates err on the long side.
    prefill_rates: deque = field(default_factory=lambda: deque(maxlen=_SPEED_SAMPLES))
    decode_rates: deque = field(default_factory=lambda: deque(maxlen=_SPEED_SAMPLES))

    def observe_prefill(self, seconds: float, token_rows: int) -> None:
        if token_rows >= _LONG_PREFILL_ROWS:
            self.prefill_rates.append(seconds / token_rows)

    def observe_step(self, seconds: float, rows: int) -> None:
        if rows > 0:
            self.decode_rates.append(seconds / rows)

    @property
    def prefill_seconds_per_token_row(self) -> float | None:
        return statistics.median(self.prefill_rates) if self.prefill_rates else None

    @property
    def decode_seconds_per_row(self) -> float | None:
        return statistics.median(self.decode_rates) if self.decode_rates else None

    def estimate_seconds(self, token_rows: int, decode_rows: int) -> float | None:
        """Seconds to prefill ``token_rows`` and decode ``decode_rows`` row-steps at the measured speed; None
        until both have been measured.  Per row, as measured: a batch of more rows than the engine has run
        costs less per row than this says (the estimate is an upper bound there)."""
        prefill, decode = self.prefill_seconds_per_token_row, self.decode_seconds_per_row
        if prefill is None or decode is None:
            return None
        return token_rows * prefill + decode_rows * decode


class Engine:
    """Continuous batching of side-by-side generations on one model (see the module docstring)."""

    def __init__(self, handle, max_requests: int = 8, max_waiting: int = 32, gather_seconds: float = 0.005,
                 timeout_seconds: float = 300.0, pause_seconds: float = 0.25, turn_seconds: float = 0.005,
                 turn_share: float = 1 / 3):
        self.handle = handle
        self.max_requests = max(1, int(max_requests))
        self.max_waiting = max(0, int(max_waiting))
        self.gather_seconds = max(0.0, float(gather_seconds))
        self.timeout_seconds = float(timeout_seconds)
        self.pause_seconds = max(0.0, float(pause_seconds))
        self.turn_seconds = max(0.0, float(turn_seconds))
        self.turn_share = max(0.0, float(turn_share))
        self._move_seconds = 0.0  # running mean of an interactive pass's duration
        # Turn-taking between the decode and interactive passes (slider moves); see `interactive`.
        self._moves = 0  # interactive passes running
        self._moves_waiting = 0  # interactive passes waiting for the decode's turn to end
        self._decoding = False  # the engine thread holds the turn (it is computing)
        self._decode_wants = False  # the engine waits for the passes in flight; new ones wait for it
        self._turn_started = 0.0
        self.stats = EngineStats()
        self._waiting: deque[Ticket] = deque()
        self._running: dict[int, Ticket] = {}  # id(request) -> ticket
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._batch: DecodeBatch | None = None  # the scheduler's batch, for its decode path (see `load`)
        # moves the engine thread runs itself, at its fused step's pause points (see `run_move`)
        self._moves_queued: deque[_Move] = deque()
        self._inline = False  # the engine thread is in a fused step's sampling or decode: it takes queued moves
        self._inline_seconds = 0.0  # what the queued moves took during the step under way (not the step's own)

    # ------------------------------------------------------------ clients
    def submit(self, request: Request, timeout_seconds: float | None = None) -> Ticket:
        """Queue ``request``; refused with :class:`EngineBusy` when the batch is full and ``max_waiting`` wait."""
        timeout = self.timeout_seconds if timeout_seconds is None else float(timeout_seconds)
        release_helpers()  # the caller waits while the engine computes: its idle helpers would slow the engine's
        ticket = Ticket(self, request, time.monotonic() + timeout)
        with self._cv:
            if self._closed:
                raise EngineBusy("the model is being replaced")
            # a request that will find a place at the next step is not "waiting for a place"
            running = len(self._running)
            if running + len(self._waiting) >= self.max_requests + self.max_waiting:
                raise EngineBusy(f"{running} generations running and {len(self._waiting)} waiting")
            self._waiting.append(ticket)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="steer_ui-engine", daemon=True)
                self._thread.start()
                _LIVE.add(self)
            self._cv.notify()
        return ticket

    def close(self, wait: float = 0.0, cancel: bool = False) -> None:
        """Stop taking requests; the running ones finish (or, with ``cancel``, leave at the next step), waiting
        ones are told to retry.

        ``wait``: seconds to wait for the engine thread to end (the running requests to finish).
        """
        with self._cv:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            thread = self._thread
            if cancel:
                for ticket in self._running.values():
                    ticket.request.cancelled = True
            self._cv.notify_all()  # a decode waiting in its turn-taking re-checks too
        for ticket in waiting:
            ticket._put(EngineBusy("the model is being replaced"))
        if wait and thread is not None:
            thread.join(wait)

    def measured(self) -> EngineStats:
        """The stats, the per-token prefill rate measured first when no prefill long enough has run yet: one pass
        of _LONG_PREFILL_ROWS token rows (a fraction of a second on a CPU), taken in turn with the decode as a
        slider move is."""
        if not self.stats.prefill_rates:
            tokens = _LONG_PREFILL_ROWS // 3
            ids = self.handle.tokenizer(" the" * tokens, add_special_tokens=False).input_ids[:tokens]
            ids = torch.tensor([ids] * 3, device=self.handle.input_device)
            with self.interactive(), torch.inference_mode():
                started = time.monotonic()
                self.handle.model(input_ids=ids, use_cache=False, logits_to_keep=1)
                self.stats.observe_prefill(time.monotonic() - started, ids.numel())
        return self.stats

    @property
    def load(self) -> dict:
        """Generations running and waiting, and the decode path the batch took (once it has run)."""
        with self._cv:
            out = {"running": len(self._running), "waiting": len(self._waiting), "rows": self.stats.rows}
        batch = self._batch
        if batch is not None:
            out["decode"] = batch.decode_path
        return out

    @contextmanager
    def interactive(self):
        """Run a short interactive pass (a slider move) in turn with the decode.

        On a few CPU cores a slider move and a decode step running at once
        each take about twice as long, and the move is what a user watches.
        So the two take turns at decoder-block granularity:

        * a move waits for the decode's turn to end, then runs with the
          machine to itself;
        * the decode, at its next block boundary, waits for the moves in
          flight to end (at most ``pause_seconds``, after which it runs beside
          them), then holds a turn during which new moves wait.  The turn lasts
          ``turn_share`` of a move's mean duration, at least ``turn_seconds``,
          plus the block (or slice of the unembedding) under way.

        With a share of a third a move waits at most about a third of a move
        and one block, and a user dragging a slider non-stop leaves the decode
        about a quarter of the machine: generation slows but never stops.  (At
        a half, the slider's p95 under load was 2.2-2.5x its idle p50 in six
        runs, at a third 1.7-2.5x; issue #50's bound is 2: docs/bench.md,
        "Many users at once", ``many_users --slider-only --turn-share``.)
        """
        prepare_helpers()  # while the decode's turn ends, not when this move's first parallel loop needs them
        with self._cv:
            self._moves_waiting += 1
            try:
                self._cv.wait_for(lambda: self._closed or not (self._decoding or self._decode_wants))
            finally:
                self._moves_waiting -= 1
            self._moves += 1
        start = time.monotonic()
        try:
            yield
        finally:
            release_helpers()  # the decode computes next: this thread's idle helpers would slow it
            with self._cv:
                self._moves -= 1
                self._observe_move(time.monotonic() - start)
                self._cv.notify_all()

    def run_move(self, fn: Callable[[], T]) -> T:
        """Run ``fn``, a short interactive pass (a slider move), in turn with the decode; its result, or its error.

        While the engine decodes on the fused CPU step, the engine thread runs
        ``fn`` itself, at the step's next pause point once its turn is over (as
        :meth:`interactive` times the turns), and the caller waits.  One thread
        then computes at a time with one OpenMP team: a move run in its own
        thread makes a second team beside the decode's idle one, which puts both
        in libgomp's throttled wait (``cpu_threads``), and its own pass ran about
        1.4x as long as idle (docs/bench.md, "A move on the engine's thread").
        Elsewhere (the engine idle, admitting prompts under its hooks, or on
        another decode path, whose hooks a move would see) the caller runs
        ``fn`` inside :meth:`interactive`.  ``fn`` runs with grad mode on and
        inference mode off wherever it runs, as in a fresh thread.
        """
        if threading.current_thread() is self._thread:  # a move that makes a move: it is already its turn
            return fn()
        move = _Move(fn)
        with self._cv:
            queued = self._inline and not self._closed
            if queued:
                self._moves_queued.append(move)
        if not queued:
            with self.interactive():
                return fn()
        return move.answer()

    def _run_queued_moves(self) -> None:
        """On the engine thread: the moves queued now, in order of arrival (those that come meanwhile wait for the
        decode's next turn, so that moves arriving non-stop cannot starve it)."""
        with self._cv:
            moves = list(self._moves_queued)
            self._moves_queued.clear()
        for move in moves:
            started = time.monotonic()
            move.run()
            took = time.monotonic() - started
            self._inline_seconds += took
            self._observe_move(took)

    def _observe_move(self, seconds: float) -> None:
        """A move's duration into the running mean the decode's turn is sized by (both kinds of move)."""
        self._move_seconds += _MOVE_MEAN_WEIGHT * (seconds - self._move_seconds)

    def _give_way(self) -> None:
        """Called by the engine thread before each decoder block, the final norm, and each step.

        Keeps the turn while no move wants it, or until the turn has lasted
        ``turn_share`` of a move's mean duration (at least ``turn_seconds``);
        otherwise hands it to the moves (see :meth:`interactive`) and takes it
        back when they end.
        """
        if self._moves_queued and self._inline:
            turn = max(self.turn_seconds, self.turn_share * self._move_seconds)
            if time.monotonic() - self._turn_started >= turn:
                self._run_queued_moves()
                self._turn_started = time.monotonic()
        if self._decoding and not (self._moves or self._moves_waiting):
            return  # the usual case: no lock taken (a move arriving now waits for the next boundary)
        with self._cv:
            turn = max(self.turn_seconds, self.turn_share * self._move_seconds)
            if self._decoding and (not (self._moves or self._moves_waiting)
                                   or time.monotonic() - self._turn_started < turn):
                return
            self._decoding = False
            self._cv.notify_all()
            deadline = time.monotonic() + self.pause_seconds
            # the moves waiting now start; those that come later wait for the decode's next turn
            self._cv.wait_for(lambda: not self._moves_waiting or self._closed, timeout=self.pause_seconds)
            self._decode_wants = True
            self._cv.wait_for(lambda: not self._moves or self._closed,
                              timeout=max(0.0, deadline - time.monotonic()))
            self._decode_wants = False
            self._decoding = True
            self._turn_started = time.monotonic()
            self._cv.notify_all()  # moves that arrived meanwhile re-check: they wait for this turn

    def _release_turn(self) -> None:
        """The engine thread stops computing (idle or sleeping): moves need not wait for it.

        Callable with ``_cv`` held (a Condition's lock is re-entrant).
        """
        with self._cv:
            self._decoding = False
            self._cv.notify_all()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    # ---------------------------------------------------------- scheduler
    def _take(self, batch: DecodeBatch) -> list[Ticket]:
        """Waiting tickets to admit now (cancelled and expired ones are answered and skipped)."""
        taken = []
        now = time.monotonic()
        with self._cv:
            while self._waiting and len(batch) + len(taken) < self.max_requests and batch.can_join:
                ticket = self._waiting.popleft()
                if ticket.request.cancelled:
                    ticket._put(_DONE)
                elif now > ticket.deadline:
                    ticket._put(EngineTimeout("the request waited past its time limit: try again"))
                else:
                    taken.append(ticket)
        return taken

    def _new_batch(self) -> DecodeBatch:
        self._batch = DecodeBatch(self.handle, pause=self._give_way)
        return self._batch

    def _loop(self) -> None:
        batch = self._new_batch()
        while True:
            with self._cv:
                if not self._waiting and not len(batch) and not self._closed:
                    self._release_turn()  # idle: slider moves need not wait for a turn
                    release_helpers()  # nor share the machine with this thread's idle OpenMP helpers
                while not self._waiting and not len(batch) and not self._closed:
                    self._cv.wait()
                if self._closed and not self._waiting and not len(batch):
                    self._thread = None
                    self._release_turn()
                    return
            try:
                self._iteration(batch)
            except BaseException as exc:  # noqa: BLE001 - the thread must not die: everyone running is told
                self._fail(exc)
                batch = self._new_batch()

    def _iteration(self, batch: DecodeBatch) -> None:
        """Admit, sample, hand out events, retire, and run one decode step."""
        if not len(batch) and self.gather_seconds:
            self._release_turn()
            time.sleep(self.gather_seconds)  # an idle engine waits a moment, so a burst shares one prefill
            self._gather_burst()
        self._give_way()  # take the turn (moves in flight finish first, bounded)
        new = self._take(batch)
        if new:
            # one pass per prompt length on the CPU: a padded row's numbers would part from its solo run
            tickets = {id(t.request): t for t in new}
            for group in prefill_groups([t.request for t in new], self.handle.input_device):
                self._admit(batch, [tickets[id(r)] for r in group])
        if not len(batch):
            return
        started, rows = time.monotonic(), batch.rows
        self._inline_seconds = 0.0
        with self._cv:  # no hooks of the engine's in the fused step's sampling and blocks: moves may run there
            self._inline = batch.decode_path.get("path") == "fused"
        try:
            self._sample_and_step(batch)
        finally:
            with self._cv:
                self._inline = False
            self._run_queued_moves()  # those that came after the step's last pause point
        self.stats.observe_step(time.monotonic() - started - self._inline_seconds, rows)
        # every ticket whose request left the batch (done, cancelled, timed out) gets its end, exactly once
        live = {id(r) for r in batch.requests}
        for key in [k for k in self._running if k not in live]:
            self._running.pop(key)._put(_DONE)
        self.stats.steps += 1
        rows = self.stats.rows = batch.rows  # the rows the next step decodes: requests leave (done, cancelled)
        self.stats.rows_per_step += (rows - self.stats.rows_per_step) / self.stats.steps

    def _sample_and_step(self, batch: DecodeBatch) -> None:
        """Sample, hand out the events (ending requests past their deadline), and run one decode step."""
        events = batch.sample()
        now = time.monotonic()
        for request, event in events:
            ticket = self._running.get(id(request))
            if ticket is None:  # no one is waiting for it any more
                request.cancelled = True
                continue
            ticket._put(_snapshot(event))
            if not request.done and now > ticket.deadline:
                request.cancelled = True
                self._running.pop(id(request))._put(EngineTimeout(
                    "the generation ran past its time limit and was stopped"))
        batch.advance()

    def _gather_burst(self) -> None:
        """While a burst is still arriving, wait on: until ``gather_seconds`` have passed since the newest waiting
        request, or ``_GATHER_AT_MOST`` times that since the oldest.

        Each admission is a prefill pass.  On the H200, eight requests whose
        clients took turns preparing them (tokenising, rendering a chat) arrived
        over more than the first wait and made two eager passes of the 8B shape,
        85 ms each (docs/profile-cuda-llama-8b-engine.txt).
        """
        while True:
            with self._cv:
                if not self._waiting or self._closed:
                    return
                now = time.monotonic()
                quiet = now - max(t.arrived for t in self._waiting)
                waited = now - min(t.arrived for t in self._waiting)
            if quiet >= self.gather_seconds or waited >= _GATHER_AT_MOST * self.gather_seconds:
                return
            time.sleep(min(self.gather_seconds - quiet, _GATHER_AT_MOST * self.gather_seconds - waited))

    def _admit(self, batch: DecodeBatch, tickets: list[Ticket]) -> None:
        self.stats.prefills += 1
        started = time.monotonic()
        try:
            batch.admit([t.request for t in tickets])
            self.stats.observe_prefill(time.monotonic() - started,
                                       sum(len(t.request.ids) * len(t.request.kinds) for t in tickets))
        except Exception as exc:  # noqa: BLE001 - the new requests are told; the running batch is untouched
            if len(tickets) > 1:  # one bad request must not fail the others that came with it
                for ticket in tickets:
                    self._admit(batch, [ticket])
                return
            log.info("request refused at prefill: %s", exc)
            tickets[0]._put(exc)
            return
        admitted = {id(r) for r in batch.requests}
        for ticket in tickets:
            if id(ticket.request) in admitted:
                self._running[id(ticket.request)] = ticket
            else:  # cancelled while its prompt ran
                ticket._put(_DONE)
        self.stats.admitted += len(tickets)
        self.stats.peak_requests = max(self.stats.peak_requests, len(batch))

    def _fail(self, exc: BaseException) -> None:
        log.error("decode step failed; every running request is told: %s", exc, exc_info=exc)
        running, self._running = self._running, {}
        for ticket in running.values():
            ticket.request.cancelled = True
            ticket._put(exc)


class _Move:
    """A move handed to the engine thread (:meth:`Engine.run_move`): its function, then its result or error."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.result = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        try:
            # the engine thread decodes in inference mode; the move runs as in a fresh thread (grad mode on)
            with torch.inference_mode(False), torch.enable_grad():
                self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - the caller gets it; the engine thread goes on
            self.error = exc
        finally:
            self._done.set()

    def answer(self):
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.result


def _snapshot(event: StepEvent) -> StepEvent:
    """The event with a copy of the result as it is now (the engine goes on appending to the original)."""
    return StepEvent(step=event.step, unsteered=event.unsteered, steered=event.steered,
                     result=event.result.snapshot())


@atexit.register
def _stop_engines_at_exit() -> None:
    """Stop every engine's thread before the interpreter finalizes (see ``_EXIT_WAIT_SECONDS``)."""
    for engine in list(_LIVE):
        engine.close(wait=_EXIT_WAIT_SECONDS, cancel=True)
