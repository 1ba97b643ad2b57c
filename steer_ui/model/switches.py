"""A process-wide setting that A/B runs and tests change for a while (``with SETTING.held(value): ...``).

The fast paths (the twins' shared blocks, a mirrored request, the fused pass, the vocabulary pass, the C
generator's uniforms) each have a way to be turned off around a block of code, so a tool can time them against the
path they replace and a test can hold the two paths' outputs side by side.  One class for all of them, so each
module says only what its setting means.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


class Setting:
    """A value read where a path is chosen, and held at another value inside :meth:`held`."""

    def __init__(self, value: Any):
        self.value = value

    @contextmanager
    def held(self, value: Any) -> Iterator[None]:
        """Inside, the setting is ``value``; then what it was (not thread-local: A/B runs and tests only)."""
        kept, self.value = self.value, value
        try:
            yield
        finally:
            self.value = kept
