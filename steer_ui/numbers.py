"""The one number parser: every number that a visitor, a link, a file or a command line sends passes here.

It refuses what ``float()`` and ``int()`` accept with surprises: booleans, text with thousands of digits
(``int("9" * 5000)`` raises with advice about an interpreter limit, ``10**400`` overflows a float), NaN and
the infinities, and a fraction where a whole number is meant (6.7 is not a layer, and is not read as 6).
Its messages name the field and the problem in one line and never quote more than a few characters of
what was sent.

This module holds no imports from the package, so any module may use it.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

MAX_DIGITS = 40  # characters of a number written as text: 1e300 fits, a 5,000-digit integer does not
SHOWN = 24  # characters of a refused value quoted back in a message

# the problems a refusal names (also the message keys the UI translates: "number_" + problem)
NOT_A_NUMBER, NOT_FINITE, NOT_WHOLE, TOO_SMALL, TOO_LARGE = (
    "not_a_number", "not_finite", "not_whole", "too_small", "too_large")


def shown(value: Any) -> str:
    """A short, safe rendering of a refused value (no str() of huge ints, which itself raises)."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        digits = int(value).bit_length() * 0.30103
        if digits > SHOWN:
            return f"an integer of about {int(digits) + 1} digits"
    try:
        text = repr(value) if isinstance(value, str) else str(value)
    except (ValueError, TypeError, RecursionError):
        return type(value).__name__
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def show_bound(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"


class NumberError(ValueError):
    """A refused number: ``what`` (the field), ``problem`` (one of the constants above), and the bounds."""

    def __init__(self, what: str, problem: str, value: Any, low: float | None = None, high: float | None = None):
        self.what, self.problem, self.value, self.low, self.high = what, problem, shown(value), low, high
        super().__init__(self.english())

    def english(self) -> str:
        text = {
            NOT_A_NUMBER: "must be a number",
            NOT_FINITE: "must be a finite number",
            NOT_WHOLE: "must be a whole number",
            TOO_SMALL: f"must be at least {show_bound(self.low)}" if self.low is not None else "is too small",
            TOO_LARGE: f"must be at most {show_bound(self.high)}" if self.high is not None else "is too large",
        }[self.problem]
        return f"{self.what} {text}, got {self.value}"

    @property
    def params(self) -> dict:
        """What a translated message fills in."""
        return {"what": self.what, "value": self.value,
                "low": show_bound(self.low) if self.low is not None else "",
                "high": show_bound(self.high) if self.high is not None else ""}


def parse_number(value: Any, what: str = "value", *, integer: bool = False, low: float | None = None,
                 high: float | None = None) -> int | float:
    """``value`` as a finite float (or an int with ``integer``) within [low, high], or :class:`NumberError`.

    Accepts ints, floats (and numpy / torch scalars, which are ``Real``) and text such as ``" 0.5 "`` or
    ``"1e-3"``.  Refuses booleans, containers, None, text longer than :data:`MAX_DIGITS`, NaN and ±inf, and
    with ``integer`` any fraction.
    """
    if isinstance(value, bool) or value is None:
        raise NumberError(what, NOT_A_NUMBER, value, low, high)
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > MAX_DIGITS:
            raise NumberError(what, NOT_A_NUMBER, value, low, high)
        try:
            value = int(text) if integer and text.lstrip("+-").isdigit() else float(text)
        except ValueError:
            raise NumberError(what, NOT_A_NUMBER, text, low, high) from None
    if isinstance(value, Integral):
        number: int | float = int(value)
        if abs(number) > 2**63:  # compared as ints: no float overflow, no huge str()
            raise NumberError(what, TOO_LARGE if number > 0 else TOO_SMALL, number,
                              -(2**63) if low is None else low, 2**63 if high is None else high)
    elif isinstance(value, Real):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise NumberError(what, NOT_A_NUMBER, value, low, high) from None
        if not math.isfinite(number):
            raise NumberError(what, NOT_FINITE, value, low, high)
    else:
        try:  # a 0-d tensor or array that is not registered as Real
            number = float(value)
        except (TypeError, ValueError, OverflowError, RuntimeError):
            raise NumberError(what, NOT_A_NUMBER, value, low, high) from None
        if not math.isfinite(number):
            raise NumberError(what, NOT_FINITE, value, low, high)
    if integer and not isinstance(number, int):
        if number != int(number):
            raise NumberError(what, NOT_WHOLE, value, low, high)
        number = int(number)
    elif not integer:
        number = float(number)
    if low is not None and number < low:
        raise NumberError(what, TOO_SMALL, value, low, high)
    if high is not None and number > high:
        raise NumberError(what, TOO_LARGE, value, low, high)
    return number
