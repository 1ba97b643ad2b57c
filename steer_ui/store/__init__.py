"""The library of what visitors make (vectors, datasets, saved results), on SQLite or PostgreSQL.

``open_library(spec, policy)``: ``spec`` is a file path (SQLite; default ``<cache>/library.db``), a
``postgresql://`` URL (several app processes share one library), or ``"off"`` (nothing is kept: every
session lives only in memory, as before the library existed).
"""
from __future__ import annotations

from pathlib import Path

from ..paths import cache_root
from .database import Database, StoreError
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


__all__ = ["Database", "Library", "OFF", "StoreError", "default_spec", "open_library"]
