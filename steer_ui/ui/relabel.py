"""Language all the way (issue #52): a switch of language on a filled page re-labels every panel it shows, from
the numbers it already shows, without running the model.

A handler that draws translated text (a chart's titles, a readout, a status line, a banner) draws it through
:func:`keep`, which remembers, in the session, the drawing function and the data it drew from (per component:
the last drawing of a component wins), and draws it in the session's language.  :func:`redraw` draws every
remembered component again in the language just chosen; :func:`wire` runs it after the header's switch.  The
drawing functions are pure functions of their data (figures from frames, text from numbers), so a redraw shows
exactly the numbers the page showed, in the other language.
"""
from __future__ import annotations

import itertools
from typing import Callable

import gradio as gr

from . import i18n

RECIPES = "relabel"  # Session.cache key: {component id: (order, components, draw, args)}
_order = itertools.count()  # later drawings win where two drew the same component (a refusal after a result)


def keep(backend, session_id: str | None, components: list, draw: Callable, *args):
    """Draw ``components`` with ``draw(lang, *args)`` in the session's language (read now, not when the request
    started: a switch during a long job is then honoured) and remember how, for :func:`redraw`.  Returns what
    ``draw`` returned (one value for one component, else a tuple)."""
    session = backend.peek_session(session_id)
    if session is not None:
        recipe = (next(_order), tuple(components), draw, args)
        recipes = session.cache.setdefault(RECIPES, {})
        for component in components:
            recipes[component._id] = recipe
    return draw(backend.language(session_id), *args)


def redraw(backend, session_id: str | None, outputs: list) -> tuple:
    """Every component of ``outputs`` that this session drew, drawn again in its language; the others skipped."""
    session = backend.peek_session(session_id)
    recipes = {r[0]: r for r in (session.cache.get(RECIPES, {}) if session is not None else {}).values()}
    lang = backend.language(session_id)
    values: dict[int, object] = {}
    for _order_, components, draw, args in (recipes[n] for n in sorted(recipes)):
        drawn = draw(lang, *args)
        drawn = drawn if len(components) > 1 else (drawn,)
        values.update({c._id: v for c, v in zip(components, drawn)})
    return tuple(values.get(c._id, gr.skip()) for c in outputs)


def text(key: str, markdown: bool = False, **params) -> tuple:
    """A (draw, args...) for one message: ``keep(backend, session_id, [c], *text("shared"))``."""
    return (_markdown if markdown else _message), key, params


def _message(lang: str, key: str, params: dict) -> str:
    return i18n.message(lang, key, **params)


def _markdown(lang: str, key: str, params: dict) -> str:
    return i18n.markdown(lang, key, **params)
