"""Reading and writing steering vectors in the formats other tools use.

Only the native format is wired so far; see ``read_vector``.
"""
from __future__ import annotations

from pathlib import Path

from .vector import SteeringVector, VectorError

MAX_VECTOR_FILE_BYTES = 512 * 1024 * 1024


def read_vector(path: str | Path, handle=None) -> tuple[SteeringVector, list[str]]:
    """Load a vector file, detecting its format from content; returns (vector, warnings)."""
    path = Path(path)
    if not path.is_file():
        raise VectorError(f"vector file not found: {path}")
    if path.stat().st_size > MAX_VECTOR_FILE_BYTES:
        raise VectorError(f"{path.name} is larger than {MAX_VECTOR_FILE_BYTES >> 20} MB")
    return SteeringVector.load(path), []
