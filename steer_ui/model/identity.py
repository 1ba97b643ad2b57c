"""Which weights a handle holds, as a short key for on-disk caches (activations, residual norms)."""
from __future__ import annotations

import hashlib
import json


def model_fingerprint(handle) -> str:
    """Identify the weights cheaply: id, config and a few parameter checksums (tiny models share ids)."""
    cached = handle.__dict__.get("_fingerprint")
    if cached:
        return cached
    config = handle.model.config
    try:
        cfg = config.to_json_string(use_diff=False)
    except Exception:
        cfg = str(config)
    params = list(handle.model.parameters())
    probe = [params[0], params[len(params) // 2], params[-1]]
    sums = [float(p.detach().float().reshape(-1)[:4096].sum()) for p in probe]
    blob = json.dumps([handle.model_id, cfg, sums, str(handle.dtype)])
    fp = hashlib.sha256(blob.encode()).hexdigest()[:16]
    handle.__dict__["_fingerprint"] = fp
    return fp
