"""What each page last drew in a panel, so the page is not asked to draw the same numbers twice.

The page asks for the next-token view several times for one setting: the slider's last ``input`` and its
``release`` carry the same α (a drag, a typed value), and *Generate* asks again for the bars it already shows.
On two cores each answer costs a model pass on the server and, in the browser, a redraw of two charts, while
the page draws nothing new.  :class:`Drawn` answers "is this exactly what the page shows, or is already
drawing?" for one page (gradio session) and panel:

* the request *latest started* for the panel has the same key, no older request for the panel is still
  running (answers reach a page in the order they finish: an older one finishing later would overwrite it),
  and it is still running itself (its answer is on its way) or is also the one *last finished* (the page drew
  it last).

A request that fails is forgotten, so the next one for its key runs.  Only the page's own calls are skipped
(see :func:`common.from_page`): an API client asks once and always gets its answer.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Panel:
    started: object = None  # the latest started request's token
    started_key: str | None = None
    running: bool = False
    in_flight: int = 0  # requests started and not yet finished, the latest included
    finished_key: str | None = None  # the key of the answer that reached the page last


class Drawn:
    """Per page and panel: the latest started and the last finished request's key (at most ``pages`` pages)."""

    def __init__(self, pages: int = 1024):
        self._pages = pages
        self._panels: OrderedDict[tuple, _Panel] = OrderedDict()
        self._lock = threading.Lock()

    def _panel(self, page: str, panel: str) -> _Panel:
        key = (page, panel)
        state = self._panels.get(key)
        if state is None:
            state = self._panels[key] = _Panel()
            while len(self._panels) > self._pages:
                self._panels.popitem(last=False)
        self._panels.move_to_end(key)
        return state

    def shown(self, page: str | None, panel: str, key: str) -> bool:
        """Whether the page shows (or is about to show) ``key`` in ``panel``."""
        if not page:
            return False
        with self._lock:
            state = self._panel(page, panel)
            if state.started_key != key:
                return False
            if state.running:
                return state.in_flight == 1
            return state.in_flight == 0 and state.finished_key == key

    def start(self, page: str | None, panel: str, key: str) -> object:
        """A request for ``key`` starts; returns its token for :meth:`finish`."""
        token = object()
        if page:
            with self._lock:
                state = self._panel(page, panel)
                state.started, state.started_key, state.running = token, key, True
                state.in_flight += 1
        return token

    def finish(self, page: str | None, panel: str, key: str, token: object, ok: bool) -> None:
        """The request ``token`` for ``key`` ended: its answer reaches the page (``ok``) or it failed."""
        if not page:
            return
        with self._lock:
            state = self._panel(page, panel)
            state.in_flight = max(0, state.in_flight - 1)
            if ok:
                state.finished_key = key
            if state.started is token:
                state.running = False
                if not ok:
                    state.started_key = None
