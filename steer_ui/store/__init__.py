"""The library of what visitors make (vectors, datasets, saved results), on SQLite or PostgreSQL.

``open_library(spec, policy)``: ``spec`` is a file path (SQLite; default ``<cache>/library.db``), a
``postgresql://`` URL (several app processes share one library), or ``"off"`` (nothing is kept: every
session lives only in memory, as before the library existed).  ``open_for_serving`` also writes once, so an app
process learns at start, in one line (:class:`StoreError`), that its store is missing, read-only, full or locked.
"""
from __future__ import annotations

from pathlib import Path

from ..paths import cache_root
from .database import Database, StoreError, StoreUnwritable, where
from .library import Library

OFF = "off"


def default_spec() -> str:
    return str(cache_root() / "library.db")


def open_library(spec: str | None, policy) -> Library | None:
    spec = (spec or default_spec()).strip()
    if spec == OFF:
        return None
    if not spec.startswith(("postgresql://", "postgres://")):
        spec = str(Path(spec).expanduser())
    return Library(Database(spec), policy)


def open_for_serving(spec: str | None, policy) -> Library | None:
    """:func:`open_library`, then one write and the page's browser secret: an app process serves only on a
    store it can write (the caller decides whether one that cannot be is an error or keeping off)."""
    library = open_library(spec, policy)
    if library is not None:
        try:
            library.db.check_writable()
            library.browser_secret  # noqa: B018 - made now, so the page never writes it while being built
        except StoreError:
            library.db.close()
            raise
    return library


__all__ = ["Database", "Library", "OFF", "StoreError", "StoreUnwritable", "default_spec", "open_for_serving",
           "open_library", "where"]
