"""Where steer_ui keeps files on disk (one place, so every cache honours ``STEER_UI_CACHE``)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``STEER_UI_CACHE`` or ``~/.cache/steer_ui``: converted models, activations, residual norms."""
    return Path(os.environ.get("STEER_UI_CACHE") or Path.home() / ".cache" / "steer_ui")
