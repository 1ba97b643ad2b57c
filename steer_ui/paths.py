"""Where steer_ui keeps files on disk (one place, so every cache honours ``STEER_UI_CACHE``)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``STEER_UI_CACHE`` or ``~/.cache/steer_ui``: converted models, activations, residual norms."""
    return Path(os.environ.get("STEER_UI_CACHE") or Path.home() / ".cache" / "steer_ui")


def prune(folder: Path, max_bytes: int, max_age_seconds: float | None = None, pattern: str = "*") -> int:
    """Delete the oldest entries of ``folder`` matching ``pattern`` until they total ``max_bytes`` or less,
    and any older than ``max_age_seconds``; returns how many were removed.  A disk budget for caches and exports.
    """
    import shutil
    import time

    if not folder.is_dir():
        return 0

    def size(path: Path) -> int:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())

    entries = []
    for path in folder.glob(pattern):
        try:
            entries.append((path.stat().st_mtime, size(path), path))
        except OSError:  # removed meanwhile
            continue
    entries.sort()
    total = sum(e[1] for e in entries)
    now = time.time()
    removed = 0
    for mtime, nbytes, path in entries:
        too_old = max_age_seconds is not None and now - mtime > max_age_seconds
        if total <= max_bytes and not too_old:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        total -= nbytes
        removed += 1
    return removed
