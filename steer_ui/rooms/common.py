"""What every room shares: the request-wide collaborators and the one-line error helpers."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..guards import Guard
from ..keeping import Keeper
from ..messages import UserError, first_line, said_of  # noqa: F401 (first_line: the rooms' one-line helper)
from ..policy import Policy
from ..sessions import Session, Sessions

RANDOM = "random direction"
Progress = Callable[[float, str], None]


def noop(_f: float, _m: str = "") -> None:
    pass


def expected_errors() -> tuple[type[BaseException], ...]:
    """Exception types whose message is already written for a user (core and method modules).

    Every one of them is a ValueError except the loader's, so the tuple stays short.
    """
    from ..model.loading import ModelLoadError

    return (ValueError, ModelLoadError, FileNotFoundError)


def refusal(exc: BaseException, key: str, detail: str | None = None, **params) -> UserError:
    """A file a reader refused, as one line: in the reader's own message (translated) when it named one (a
    DatasetError's or VectorError's key), else ``key`` with ``detail`` (by default the reader's English line)."""
    own = getattr(exc, "key", None)
    if own:
        return UserError(own, **exc.params)
    return UserError(key, **params, detail=said_of(exc) if detail is None else detail)


def dataset_refusal(name: str, exc: BaseException) -> UserError:
    """A dataset the readers refused, as one line (:func:`refusal`; else "could not be used" with the detail).
    A problem the reader said as "<file>: <detail>" is said "<file> could not be used: <detail>", by key."""
    if getattr(exc, "key", None) == "dataset_problem":
        return UserError("dataset_invalid", name=exc.params["name"], detail=exc.params["detail"])
    return refusal(exc, "dataset_invalid", name=name)


@dataclass
class Shared:
    """The server-wide things every room reads: limits, the request guard, the sessions, the library keeper,
    and ``find``, the door's way to a session's store (``find(session_id, client)``)."""

    policy: Policy
    guard: Guard
    sessions: Sessions
    keeper: Keeper
    find: Callable[..., Session]
    max_file_bytes: int
    workdir: Path
