"""One definition of "the same result" for a session's output alone and beside others (issue #17).

Tokens, texts and every other non-number must be equal; numbers (probabilities, log-probabilities,
KL, Δlogit) equal to float noise: within 1e-5, or 2e-6 of their size for large ones (a Δlogit of −57).  Bit-for-bit equality is not the bar: a matrix product on the CPU
rounds a row differently depending on how many rows share it (a batch of other users' rows, a
slider group), by ~1e-6 relative, while a different token or a leaked vector moves numbers by far more.
"""
from __future__ import annotations

import math

TOL = 1e-5
REL_TOL = 2e-6
# Generated tokens' numbers, decoded in a running batch that others join and leave: the batch's shape changes at
# every step and each step's rounding feeds the next, so they drift further than one next-token pass does.
# Measured on the embedded model: up to 5e-6 in a token's probability with one or two batch mates, 1.02e-5 once
# under the hostile-client load; a changed token or a leaked vector moves them by orders of magnitude more.
DECODE_TOL = 1e-4


def same(a, b, tol: float = TOL, path: str = "") -> str | None:
    """None when ``a`` and ``b`` match; otherwise where and how they differ."""
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None:
        return None if a == b else f"{path}: {a!r} != {b!r}"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return None if a == b else f"{path}: {a} != {b}"
        # absolute for probabilities and small numbers, relative for large logits: float32 rounds a row by ~1e-6
        # relative depending on its batch mates (1.05e-6 seen on a Δlogit of 21.8 beside 20 flooding clients)
        return None if math.isclose(a, b, rel_tol=REL_TOL, abs_tol=tol) else f"{path}: {a} != {b} (tolerance {tol})"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            if (d := same(a[k], b[k], tol, f"{path}.{k}")) is not None:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if (d := same(x, y, tol, f"{path}[{i}]")) is not None:
                return d
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"
