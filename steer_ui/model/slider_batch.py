"""Several users' slider moves on the same prompt and block, in one pass of the blocks above it.

A room that opens the shared link starts on the same view (prompt, block)
and drags α at once.  Each move is one re-run of the blocks above the
steered one on the prompt's frozen prefix (:mod:`.prefix`); moves that
arrive within ``gather_seconds`` of each other for the same prompt, block and
positions become rows of one such pass, each row with its own vector and α
(a (rows, hidden) steering matrix).  The first caller of a group runs the
pass for everyone in it; the others wait for their row.

The computing goes through ``run`` (``Engine.run_move`` in the app: on the
decode engine's own thread while it decodes); the gathering stays in the
callers' threads, so that moves can join a group while its leader waits.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .analysis import NextTokenView, compare_logits, next_token, prefix_state, unsteered_reference
from .hooks import Steer, SteeringError


def _here(fn):
    return fn()


@dataclass(eq=False)
class _Group:
    rows: list[torch.Tensor] = field(default_factory=list)  # α·v per row, float32
    top_k: list[int] = field(default_factory=list)  # each row's
    done: threading.Event = field(default_factory=threading.Event)
    views: list[NextTokenView] | None = None
    error: BaseException | None = None


class SliderBatcher:
    """Batches next-token views of one fixed-direction steer per request (the slider's case)."""

    def __init__(self, handle, gather_seconds: float = 0.002, max_rows: int = 32):
        self.handle = handle
        self.gather_seconds = float(gather_seconds)
        self.max_rows = int(max_rows)
        self.passes = 0  # forward passes run
        self.largest = 0  # most rows in one pass
        self._lock = threading.Lock()
        self._open: dict[tuple, _Group] = {}

    def next_token(self, prompt: str, steers, top_k: int = 10, run: Callable = _here) -> NextTokenView:
        """:func:`~.analysis.next_token`, sharing the pass with concurrent moves where it can; ``run(fn)`` computes
        (by default here)."""
        if len(steers) != 1 or not isinstance(steers[0], Steer) or steers[0].fn is not None \
                or steers[0].vector.ndim != 1:
            return run(lambda: next_token(self.handle, prompt, steers, top_k=top_k))
        steer = steers[0]
        push = float(steer.scalar_alpha) * steer.vector.float()
        if not torch.isfinite(push).all():  # checked alone, so one user's overflow never fails a group
            raise SteeringError.from_key("steering_overflow")
        key = (prompt, steer.layer, steer.positions, steer.special_tokens)
        with self._lock:
            group = self._open.get(key)
            leader = group is None or len(group.rows) >= self.max_rows
            if leader:
                group = self._open[key] = _Group()
            row = len(group.rows)
            group.rows.append(push)
            group.top_k.append(top_k)
        if not leader:
            group.done.wait()
        else:
            time.sleep(self.gather_seconds)  # let the moves made at the same moment join
            with self._lock:  # closed from here on: later moves start a group of their own
                if self._open.get(key) is group:
                    del self._open[key]
            try:
                group.views = run(lambda: self._views(prompt, steer, group))
            except BaseException as exc:  # every member of the group gets the error
                group.error = exc
            finally:
                group.done.set()
        if group.error is None:
            return group.views[row]
        if len(group.rows) == 1:
            raise group.error
        # whatever failed the shared pass, each member finds out alone whether it was theirs
        alone = Steer(layer=steer.layer, vector=push, positions=steer.positions, special_tokens=steer.special_tokens)
        return run(lambda: next_token(self.handle, prompt, [alone], top_k=top_k))

    def _views(self, prompt: str, steer: Steer, group: _Group) -> list[NextTokenView]:
        """Every member's view from one pass of the group's rows."""
        st = prefix_state(self.handle, prompt, steer.layer)
        combined = Steer(layer=steer.layer, vector=torch.stack(group.rows), positions=steer.positions,
                         special_tokens=steer.special_tokens)
        logits = st.logits([combined], rows=len(group.rows))
        self.passes += 1
        self.largest = max(self.largest, len(group.rows))
        unsteered = unsteered_reference(st)
        return [compare_logits(self.handle, unsteered, logits[i], k) for i, k in enumerate(group.top_k)]
