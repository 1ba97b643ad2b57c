"""Names a visitor reads (vectors, datasets) show exactly what they are, on one line.

A right-to-left override (U+202E) makes 'a', U+202E, 'live' list as 'aevil'; a zero-width space (U+200B) makes
two different names look the same; the isolates (U+2066..U+2069), the Arabic letter mark (U+061C) and every
other invisible format character (Unicode category Cf), control characters, line and paragraph separators
and lone surrogates do the like.  A name holding one is refused, with the character written out
(``[U+202E]``), rather than shown in a way that hides it.
"""
from __future__ import annotations

import unicodedata
from typing import Any

from .messages import UserError

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# letters and marks that draw nothing: the combining grapheme joiner, the Hangul fillers, the Braille blank
HIDDEN_CHARACTERS = frozenset("\u034f\u115f\u1160\u3164\uffa0\u2800")
SHOWN_CHARS = 80  # of a refused name, in its message


def hidden(ch: str) -> bool:
    """Whether ``ch`` shows as nothing (or as something other than itself) where a name is listed."""
    return ch in HIDDEN_CHARACTERS or unicodedata.category(ch) in HIDDEN_CATEGORIES


def first_hidden(name: str) -> str | None:
    """The first character of ``name`` that :func:`hidden` finds, or None."""
    return next((ch for ch in name if hidden(ch)), None)


def escaped(name: str) -> str:
    """``name`` with every hidden character written as ``[U+XXXX]``, at most :data:`SHOWN_CHARS` characters."""
    shown = "".join(f"[U+{ord(ch):04X}]" if hidden(ch) else ch for ch in name)
    return shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + "…"


def checked(name: Any) -> Any:
    """``name`` as given, or a one-line :class:`UserError` naming its first hidden character."""
    ch = first_hidden(name) if isinstance(name, str) else None
    if ch is not None:
        raise UserError("name_hidden_character", name=escaped(name), code=f"U+{ord(ch):04X}")
    return name
