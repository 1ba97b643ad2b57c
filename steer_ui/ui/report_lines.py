"""The sentences a training report adds under the Train tab's status line, in the page's language.

A method says these by key (:class:`~steer_ui.messages.Said`: English in the report's JSON for a client or the
CLI, the key beside it), so the page says them in its language: a 简体中文 page showed three English sentences under
its status line (a browser review: L2S's verdict, TSV's labels and its |Δlogit| bound).  A sentence that lost its
key (a report read back from JSON) is shown as the English it is.
"""
from __future__ import annotations

from typing import Any

from ..messages import Said
from . import i18n

# parameters that quote a dataset's own text: shown as text, never as Markdown
QUOTED = {"answer"}


def status_lines(lang: str, report: dict) -> list[str]:
    """Markdown lines for ``report``: L2S's verdict, TSV's generated labels, TSV's held-out |Δlogit| bound."""
    check = ((report.get("runs") or {}).get("constrained") or {}).get("bound_check")
    notes = [report.get("recommendation"), (report.get("labelling") or {}).get("note"),
             check.get("note") if isinstance(check, dict) else None]
    return [_words(lang, note) for note in notes if isinstance(note, str)]


def _words(lang: str, note: Any) -> str:
    if not isinstance(note, Said):
        return i18n.plain(note)
    params = {k: _words(lang, v) if isinstance(v, Said) else i18n.plain(v) if k in QUOTED else v
              for k, v in note.params.items()}
    return i18n.message(lang, note.key, **params)
