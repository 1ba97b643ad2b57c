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
import logging
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from . import limits
from .messages import KeyedError, Said, first_line, said_of  # noqa: F401 (first_line: re-exported)
from .numbers import TOO_LARGE, TOO_SMALL, NumberError, parse_number, shown

FORMAT_VERSION = 1
SITE = "decoder_block_output"
# Where a vector steers: every position, the prompt's, the generated ones, or "last": the last prompt position
# and every generated one (ITI's choice in honest_llama).
POSITIONS = ("all", "prompt", "generated", "last")
FLOAT_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float64, torch.float16,
                                                             torch.bfloat16)}
# What an extra tensor may hold (and what every export format can write back bit for bit).
EXTRA_DTYPES = {**FLOAT_DTYPES, **{str(d).removeprefix("torch."): d for d in (
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}}
_EXTRA_KEY = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{limits.MAX_EXTRA_KEY - 1}}}")
_IDENTIFIER = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:+\-]{{0,{limits.MAX_IDENTIFIER - 1}}}")


log = logging.getLogger(__name__)


class VectorError(KeyedError):
    """A vector file or record that cannot be used as asked.

    ``key`` and ``params``, when given, name the message in :mod:`steer_ui.messages`, so a front can say it in
    the visitor's language (the English text is the exception's own)."""


def refused(key: str, **params: Any) -> VectorError:
    """A VectorError whose message is ``key`` of :mod:`steer_ui.messages`, in English here."""
    return VectorError.from_key(key, **params)


def file_detail(exc: BaseException) -> str:
    """Why a vector file was refused, as a detail for "<name> could not be imported: <detail>": the readers' own line
    (by key where it has one, so said in the visitor's language); another library's error (safetensors', gguf's,
    numpy's, Python's own parse errors) as one plain line in every language, its own words kept for the log."""
    if isinstance(exc, KeyedError):
        return said_of(exc)
    log.warning("a vector file was refused by a library: %s: %s", type(exc).__name__, first_line(exc))
    return Said("vector_detail_unreadable")


def reason(exc: BaseException) -> Said:
    """A malformed entry's reason in plain words, for a detail's brackets: Python's own ("'dtype'", "invalid
    literal for int() with base 10: 'x'") says nothing to a person and is English on every page."""
    if isinstance(exc, KeyError) and exc.args:
        return Said("vector_reason_missing", field=str(exc.args[0])[:60])
    return Said("vector_reason_bad_value")


def invalid(name: Any, detail: str) -> VectorError:
    """A file (``name``) refused for ``detail``, in English: "<name>: <detail>" (the key ``vector_file_invalid``
    says the file was refused in the visitor's language; the detail, a file's structure, stays as written)."""
    return refused("vector_file_invalid", name=str(name), detail=detail)


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
    # The centred |Δlogit| bound the vector was made to steer within (TSV's max_logit_change). A bound met by
    # scaling on training text is a margin elsewhere, so generation applies it as its Δlogit limit by default,
    # which holds it at every step (model.generation); None: the vector states no bound.
    max_delta_logit: float | None = None
    created: str = field(default_factory=_now)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        # Everything is checked before anything is copied: a direction or extra may be a view whose shape
        # promises far more memory than its storage holds (an expanded tensor from a 1 KB file).
        self.hidden_size = _bounded_int(self.hidden_size, "hidden size", 1, limits.MAX_HIDDEN)
        if not isinstance(self.directions, dict) or not self.directions:
            raise refused("vector_no_layers")
        if len(self.directions) > limits.MAX_LAYERS:
            raise refused("vector_too_many_layers", limit=limits.MAX_LAYERS, count=len(self.directions))
        if not isinstance(self.extras, dict):
            raise refused("vector_extras_not_dict", type=type(self.extras).__name__)
        if len(self.extras) > limits.MAX_EXTRAS:
            raise refused("vector_too_many_extras", limit=limits.MAX_EXTRAS, count=len(self.extras))
        directions: dict[int, torch.Tensor] = {}
        total = 0
        for layer, vec in self.directions.items():
            layer = _bounded_int(layer, "layer", 0, limits.MAX_LAYERS - 1)
            what = Said("vector_tensor_direction", layer=layer)
            vec = _as_tensor(vec, what)
            total += check_tensor(vec, what, FLOAT_DTYPES)
            if vec.ndim != 1:
                raise refused("vector_direction_not_1d", layer=layer, shape=tuple(vec.shape))
            if vec.shape[0] != self.hidden_size:
                raise refused("vector_direction_size", layer=layer, size=vec.shape[0], hidden=self.hidden_size)
            directions[layer] = vec
        extras: dict[str, torch.Tensor] = {}
        for key, tensor in self.extras.items():
            if not isinstance(key, str) or not _EXTRA_KEY.fullmatch(key):
                raise refused("vector_extra_name", value=repr(str(key)[:40]), limit=limits.MAX_EXTRA_KEY)
            what = Said("vector_tensor_extra", tensor=key)
            extras[key] = _as_tensor(tensor, what)
            total += check_tensor(extras[key], what, EXTRA_DTYPES)
        if total > limits.MAX_VECTOR_BYTES:
            raise refused("vector_tensors_over_mb", size=f"{total / 2**20:.1f}",
                          limit=f"{limits.MAX_VECTOR_BYTES / 2**20:.0f}")
        clean: dict[int, torch.Tensor] = {}
        for layer, vec in directions.items():
            vec = vec.detach().to("cpu")
            if not torch.isfinite(vec).all():
                raise refused("vector_direction_not_finite", layer=layer)
            clean[layer] = vec.float().contiguous()
        self.directions = dict(sorted(clean.items()))
        for key, tensor in extras.items():
            tensor = tensor.detach().to("cpu")
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise refused("vector_extra_tensor_not_finite", tensor=key)
            extras[key] = tensor.contiguous()
        self.extras = extras
        self._check_metadata()

    def _check_metadata(self) -> None:
        """Types and sizes of every metadata field (they arrive as JSON from files a visitor uploads)."""
        self.method = _identifier(self.method, "method")
        self.site = _identifier(self.site, "site")
        self.name = _text(self.name, "name", limits.MAX_NAME)
        self.model_id = _text(self.model_id, "model_id", limits.MAX_TEXT)
        self.model_type = _text(self.model_type, "model_type", limits.MAX_TEXT)
        self.created = _text(self.created, "created", limits.MAX_TEXT)
        if self.model_revision is not None:
            self.model_revision = _text(self.model_revision, "model_revision", limits.MAX_TEXT)
        if self.dataset_hash is not None:
            self.dataset_hash = _text(self.dataset_hash, "dataset_hash", limits.MAX_TEXT)
        self.format_version = _bounded_int(self.format_version, "format_version", 1, 10**6)
        if not isinstance(self.positions, str) or self.positions not in POSITIONS:
            raise refused("vector_field_positions", known=POSITIONS, value=repr(str(self.positions)[:40]))
        for field_name in ("hyperparameters", "metrics"):
            _check_json_object(getattr(self, field_name), field_name)
        if self.alpha_range is not None:
            self.alpha_range = _alpha_range(self.alpha_range)
        if self.max_delta_logit is not None:
            self.max_delta_logit = _delta_limit(self.max_delta_logit)

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
        # Not dataclasses.asdict: it would deep-copy every tensor only to drop them.
        meta = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("directions", "extras")}
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
        meta = parse_json(meta_json, f"{source} (steer_ui header)") if meta_json else {}
        if not isinstance(meta, dict):
            raise invalid(str(source), Said("vector_detail_header_not_object"))
        directions = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("direction.")}
        extras = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("extra.")}
        if not directions:
            raise refused("vector_no_directions", name=source, found=sorted(tensors)[:8])
        hidden = meta.get("hidden_size") or next(iter(directions.values())).shape[0]
        known = {f for f in cls.__dataclass_fields__} - {"directions", "extras", "hidden_size"}
        kwargs = {k: meta[k] for k in known if k in meta}
        try:
            return cls(directions=directions, extras=extras, hidden_size=hidden, **kwargs)
        except (TypeError, ValueError) as exc:
            raise invalid(str(source), said_of(exc)) from None


# ====================================================================== checks before use
def check_tensor(tensor: torch.Tensor, what: str, dtypes: dict[str, torch.dtype] = EXTRA_DTYPES) -> int:
    """Refuse a tensor that is too big or that is not plainly laid out over its own storage; returns its bytes.

    Reads only shape, strides, dtype and the storage size, so it is safe on a
    view that promises terabytes (``torch.zeros(1).expand(1 << 40)``): such a
    tensor is refused here, before ``.contiguous()`` or any arithmetic would
    materialise it.  Zero strides (expanded), strides that make elements
    overlap and views reaching past their storage are all refused.  ``what`` names the tensor in the refusal
    (a :class:`~steer_ui.messages.Said`, such as "direction for layer 2", so the page names it in its language).
    """
    if not isinstance(tensor, torch.Tensor):
        raise refused("vector_tensor_not_tensor", tensor=what, type=type(tensor).__name__)
    if tensor.layout != torch.strided or tensor.is_quantized or getattr(tensor, "is_nested", False):
        raise refused("vector_tensor_layout", tensor=what, layout=str(tensor.layout))
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in dtypes:
        raise refused("vector_tensor_dtype", tensor=what, dtype=dtype, accepted=", ".join(dtypes))
    shape, strides = [int(d) for d in tensor.shape], [int(s) for s in tensor.stride()]
    if len(shape) > limits.MAX_DIMS:
        raise refused("vector_tensor_dims", tensor=what, dims=len(shape), limit=limits.MAX_DIMS)
    numel = math.prod(shape)  # Python ints: no overflow, whatever the file claims
    if numel > limits.MAX_ELEMENTS:
        raise refused("vector_tensor_elements", tensor=what, shape=tuple(shape), elements=numel,
                      limit=limits.MAX_ELEMENTS)
    if numel == 0:
        return 0
    # Walking the dimensions from the smallest stride up, each must step past everything the smaller ones
    # cover; otherwise two indices share one element (stride 0 is the expanded case).
    span = 1
    for stride, size in sorted((s, n) for n, s in zip(shape, strides) if n > 1):
        if stride < span:
            raise refused("vector_tensor_overlap", tensor=what, strides=tuple(strides), shape=tuple(shape))
        span = stride * size
    itemsize = tensor.element_size()
    reach = (tensor.storage_offset() + sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * itemsize
    if tensor.storage_offset() < 0 or reach > tensor.untyped_storage().nbytes():
        raise refused("vector_tensor_storage", tensor=what, shape=tuple(shape),
                      bytes=tensor.untyped_storage().nbytes())
    return numel * itemsize


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON from an untrusted file: bounded in the objects it can make and in nesting; one-line errors."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = text[:exc.start].count(b"\n") + 1
            raise refused("vector_not_utf8", name=where, line=line) from None
    tokens = sum(text.count(c) for c in ",:[{")
    if tokens > limits.MAX_JSON_TOKENS:
        raise invalid(where, Said("vector_detail_json_too_many", tokens=tokens, limit=limits.MAX_JSON_TOKENS))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:  # its own words ("Expecting value: line 1 column 1 (char 0)") say less
        raise refused("vector_invalid_json", name=where, line=exc.lineno, column=exc.colno) from None
    except RecursionError:
        raise invalid(where, Said("vector_detail_json_too_deep")) from None


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)  # keeps the array's strides, so check_tensor sees them
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    if isinstance(value, (list, tuple)):
        if len(value) > limits.MAX_HIDDEN:
            raise refused("vector_tensor_values", tensor=what, count=len(value), limit=limits.MAX_HIDDEN)
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:  # torch's words name its internals: to the log
            log.warning("a list refused as a tensor: %s: %s", type(exc).__name__, first_line(exc))
            raise refused("vector_tensor_not_numbers", tensor=what) from None
    raise refused("vector_tensor_not_tensor", tensor=what, type=type(value).__name__)


def _bounded_int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, float) or (isinstance(value, str) and not value.isdigit()):  # files write 6, never 6.0
        raise refused("vector_field_whole", field=what, value=shown(value))
    try:
        return int(parse_number(value, what, integer=True, low=low, high=high))
    except NumberError as exc:
        if exc.problem in (TOO_SMALL, TOO_LARGE):
            raise refused("vector_field_range", field=what, low=low, high=high, value=exc.value) from None
        raise VectorError(str(exc)) from None


def _text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise refused("vector_field_text", field=what, type=type(value).__name__)
    if len(value) > limit or "\x00" in value:
        raise refused("vector_field_long", field=what, length=len(value), limit=limit)
    return value


def _identifier(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise refused("vector_field_identifier", field=what, limit=limits.MAX_IDENTIFIER,
                      value=repr(str(value)[:40]))
    return value


def _check_json_object(value: Any, what: str) -> None:
    if not isinstance(value, dict):
        raise refused("vector_field_object", field=what, type=type(value).__name__)
    try:
        size = len(json.dumps(_jsonable(value), default=str))
    except (TypeError, ValueError, RecursionError) as exc:
        raise refused("vector_field_not_json", field=what, reason=reason(exc)) from None
    if size > limits.MAX_JSON_BYTES:
        raise refused("vector_field_json_size", field=what, size=size, limit=limits.MAX_JSON_BYTES)


def _delta_limit(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= limits.MAX_DELTA_LOGIT_LIMIT:
        raise refused("vector_field_delta_limit", limit=f"{limits.MAX_DELTA_LOGIT_LIMIT:g}", value=str(value)[:40])
    return float(value)


def _alpha_range(value: Any) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 \
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise refused("vector_field_alpha_range", value=str(value)[:60])
    low, high = float(value[0]), float(value[1])
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise refused("vector_field_alpha_order", low=low, high=high)
    return low, high


# ====================================================================== safetensors
_SAFETENSORS_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                         "BOOL": 1}


def check_safetensors_header(path: Path) -> None:
    """Refuse a safetensors file whose header declares too much, or tensors sharing bytes, before any data is read."""
    name = path.name
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(size - 8, limits.MAX_HEADER_BYTES):
            raise invalid(name, Said("vector_detail_safetensors_header_length", length=length, size=size,
                                     limit=limits.MAX_HEADER_BYTES))
        header = parse_json(f.read(length), f"{name} (safetensors header)")
    if not isinstance(header, dict):
        raise invalid(name, Said("vector_detail_safetensors_header_not_object"))
    data_size = size - 8 - length
    spans, total = [], 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if len(spans) >= limits.MAX_LAYERS + limits.MAX_EXTRAS:
            raise invalid(name, Said("vector_detail_too_many_tensors", limit=limits.MAX_LAYERS + limits.MAX_EXTRAS))
        try:
            itemsize = _SAFETENSORS_ITEMSIZE[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise invalid(name, Said("vector_detail_tensor_header_entry", tensor=repr(str(key)[:60]),
                                     error=reason(exc))) from None
        numel = math.prod(shape)
        if len(shape) > limits.MAX_DIMS or min(shape, default=0) < 0 or numel > limits.MAX_ELEMENTS:
            raise invalid(name, Said("vector_detail_tensor_shape", tensor=repr(str(key)[:60]),
                                     shape=tuple(shape)[:8], dims=limits.MAX_DIMS, elements=limits.MAX_ELEMENTS))
        if not 0 <= begin <= end <= data_size or end - begin != numel * itemsize:
            raise invalid(name, Said("vector_detail_tensor_bytes", tensor=repr(str(key)[:60]), begin=begin, end=end,
                                     data_size=data_size))
        total += end - begin
        if total > limits.MAX_VECTOR_BYTES:
            raise invalid(name, Said("vector_detail_tensors_over_mb", limit=f"{limits.MAX_VECTOR_BYTES / 2**20:.0f}"))
        spans.append((begin, end, str(key)))
    spans.sort()
    reach, owner = 0, ""
    for begin, end, key in spans:
        if begin < reach:
            raise invalid(name, Said("vector_detail_tensors_overlap", first=repr(owner[:60]), second=repr(key[:60])))
        if end > reach:
            reach, owner = end, key


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, header metadata) of a safetensors file; junk becomes a one-line VectorError.

    The header is checked first (:func:`check_safetensors_header`), so no data is read for a file
    that declares more than the limits or aliases one tensor's bytes as another's.
    """
    from safetensors import safe_open

    check_safetensors_header(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception:  # safetensors raises several types for junk, in its own words
        raise refused("vector_unreadable_safetensors", name=path.name) from None
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
