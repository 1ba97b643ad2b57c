"""The one record every method produces and every consumer reads.

A :class:`SteeringVector` is a direction (or one per layer) to add to the
output of decoder block ``L`` — the residual stream after block ``L``, which is
HF ``hidden_states[L + 1]``, repeng / llama.cpp ``direction.L``,
steering-vectors ``layer_type="decoder_block"`` layer ``L`` and TransformerLens
``blocks.L.hook_resid_post``.  Methods that need more than a direction (TSV
prototypes, the L2S MLP, ITI per-head directions) keep those tensors in
``extras``; they travel with the vector through save/load and export.

The native file is a safetensors file: tensors ``direction.{L}`` and
``extra.{name}``, and the metadata under the single header key ``steer_ui``
as JSON.  Loading never unpickles anything.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 1
SITE = "decoder_block_output"
POSITIONS = ("all", "prompt", "generated")


class VectorError(ValueError):
    """A vector file or record that cannot be used as asked."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass
class SteeringVector:
    directions: dict[int, torch.Tensor]
    hidden_size: int
    method: str = "unknown"
    model_id: str = ""
    model_type: str = ""
    model_revision: str | None = None
    site: str = SITE
    positions: str = "all"
    name: str = ""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    dataset_hash: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # Recommended α range in *relative* units (fraction of the layer's mean residual norm).
    alpha_range: tuple[float, float] | None = None
    created: str = field(default_factory=_now)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if not self.directions:
            raise VectorError("a steering vector needs at least one layer direction")
        clean: dict[int, torch.Tensor] = {}
        for layer, vec in self.directions.items():
            vec = torch.as_tensor(vec).detach().to("cpu")
            if vec.ndim != 1:
                raise VectorError(f"direction for layer {layer} must be 1-D, got shape {tuple(vec.shape)}")
            if vec.shape[0] != self.hidden_size:
                raise VectorError(
                    f"direction for layer {layer} has {vec.shape[0]} values but hidden size is {self.hidden_size}"
                )
            if not torch.isfinite(vec).all():
                raise VectorError(f"direction for layer {layer} contains NaN or inf values")
            clean[int(layer)] = vec.float().contiguous()
        self.directions = dict(sorted(clean.items()))
        if self.positions not in POSITIONS:
            raise VectorError(f"positions must be one of {POSITIONS}, got '{self.positions}'")
        if self.alpha_range is not None:
            self.alpha_range = (float(self.alpha_range[0]), float(self.alpha_range[1]))
        self.extras = {k: torch.as_tensor(v).detach().to("cpu").contiguous() for k, v in self.extras.items()}

    # ------------------------------------------------------------------ views
    @property
    def layers(self) -> list[int]:
        return list(self.directions)

    @property
    def layer(self) -> int:
        """The first (usually only) layer."""
        return self.layers[0]

    def direction(self, layer: int | None = None) -> torch.Tensor:
        return self.directions[self.layer if layer is None else layer]

    def metadata(self) -> dict[str, Any]:
        """Everything but the tensors, JSON-serialisable."""
        meta = asdict(self)
        meta.pop("directions")
        meta.pop("extras")
        meta["layers"] = self.layers
        meta["extra_tensors"] = {k: list(v.shape) for k, v in self.extras.items()}
        meta["alpha_range"] = list(self.alpha_range) if self.alpha_range else None
        return _jsonable(meta)

    def with_direction(self, layer: int, vec: torch.Tensor, **changes: Any) -> "SteeringVector":
        """A copy steering at ``layer`` with ``vec`` (other metadata kept)."""
        data = {**self.__dict__, **changes}
        data["directions"] = {layer: vec}
        return SteeringVector(**data)

    # ------------------------------------------------------------- native I/O
    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {f"direction.{layer}": vec for layer, vec in self.directions.items()}
        tensors.update({f"extra.{k}": v for k, v in self.extras.items()})
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata={"steer_ui": json.dumps(self.metadata())})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "SteeringVector":
        path = Path(path)
        tensors, header = read_safetensors(path)
        return cls.from_tensors(tensors, header.get("steer_ui"), source=path.name)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta_json: str | None, source: str = "") -> "SteeringVector":
        meta = json.loads(meta_json) if meta_json else {}
        directions = {int(k.split(".", 1)[1]): v for k, v in tensors.items() if k.startswith("direction.")}
        extras = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("extra.")}
        if not directions:
            raise VectorError(f"{source}: no 'direction.<layer>' tensors found (found: {sorted(tensors)[:8]})")
        hidden = meta.get("hidden_size") or next(iter(directions.values())).shape[0]
        known = {f for f in cls.__dataclass_fields__} - {"directions", "extras", "hidden_size"}
        kwargs = {k: meta[k] for k in known if k in meta}
        if kwargs.get("alpha_range") is not None:
            kwargs["alpha_range"] = tuple(kwargs["alpha_range"])
        return cls(directions=directions, extras=extras, hidden_size=int(hidden), **kwargs)


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, header metadata) of a safetensors file; junk becomes a one-line VectorError."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises several types for junk
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise VectorError(f"{path.name}: not a valid safetensors file ({first})") from None
    return tensors, header


def random_vector(hidden_size: int, layer: int, seed: int = 0, **meta: Any) -> SteeringVector:
    """A seeded unit-norm random direction, for trying things."""
    gen = torch.Generator().manual_seed(int(seed))
    vec = torch.randn(hidden_size, generator=gen)
    vec = vec / vec.norm()
    return SteeringVector(
        directions={layer: vec}, hidden_size=hidden_size, method="random", name=f"random(seed={seed})",
        hyperparameters={"seed": int(seed)}, **meta,
    )


def dataset_hash(rows: Any) -> str:
    """A short stable content hash for provenance and cache keys."""
    blob = json.dumps(rows, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return obj.item()
        except Exception:
            return str(obj)
    return obj
