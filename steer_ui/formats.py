"""Reading and writing steering vectors in the formats other tools use.

Every format here stores the same thing: a direction to add to the output of
decoder block ``L`` (the residual stream after block L; see
:mod:`steer_ui.vector`).  The formats differ only in what else they can carry:

=================  ==========================================  ======================================
format             files                                       our metadata and extra tensors
=================  ==========================================  ======================================
native             ``x.safetensors`` (tensors + JSON header)   in the file
gguf               ``x.gguf``: arch ``controlvector``,          ``steer_ui.*`` keys (readers skip them)
                   ``direction.{L}`` float32 tensors
steering-vectors   ``x.pt``: ``torch.save({"layer_activations":  ``x.steer_ui.json`` beside it
                   {L: t}, "layer_type": "decoder_block"})``
neuronpedia        ``x.json``: ``vector`` number array,         a ``steer_ui`` key in the same JSON
                   ``layer``, ``hookType: hook_resid_post``
caa                a directory of ``vec_layer_{L}.pt``          ``steer_ui.json`` in the directory
=================  ==========================================  ======================================

With the metadata carried, export → import gives back the same tensors bit for
bit and the same metadata.  Files made by the other tools (no metadata) import
with provenance recorded in ``hyperparameters``.

Reading never executes a pickle: ``.pt`` files go through
``torch.load(..., weights_only=True)`` and must then hold only tensors, dicts
and plain values.  The format is found from the content, not the extension.

Every file is treated as hostile: the sizes a file declares (safetensors and
GGUF headers, zip entries, pickle length, base64 extras) are checked against
:mod:`steer_ui.limits` before the data they describe is read or decoded, and
every tensor is checked (:func:`steer_ui.vector.check_tensor`) before anything
copies it, so an expanded view or aliased tensors cannot multiply memory.
Names that become paths go through :func:`safe_name`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import io
import mmap
import os
import pickletools
import re
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from . import limits
from .messages import Said
from .vector import (EXTRA_DTYPES, SteeringVector, check_tensor, invalid, parse_json, read_safetensors, reason,
                     refused, said_of)

FORMATS = ("native", "gguf", "steering-vectors", "neuronpedia", "caa")
SUFFIXES = {"native": ".safetensors", "gguf": ".gguf", "steering-vectors": ".pt", "neuronpedia": ".json", "caa": ""}
MAX_VECTOR_FILE_BYTES = limits.MAX_FILE_BYTES
MAX_PICKLE_BYTES = limits.MAX_PICKLE_BYTES

GGUF_ARCH = "controlvector"
SIDECAR_SUFFIX = ".steer_ui.json"  # steering-vectors: metadata beside x.pt as x.steer_ui.json
CAA_SIDECAR = "steer_ui.json"      # caa: metadata inside the directory
CAA_NAME = re.compile(r"^vec_layer_(\d+)(?:_(.+))?\.pt$")  # CAA's own files add _{model name}
NEURONPEDIA_HOOK = "hook_resid_post"



# ======================================================================== public API
def write_vector(vector: SteeringVector, fmt: str, out: str | Path) -> list[Path]:
    """Write ``vector`` as ``fmt`` (one of :data:`FORMATS`) at ``out``; returns every file written.

    ``caa`` writes a directory (``out``); ``steering-vectors`` writes ``out`` and
    a metadata sidecar beside it.  Raises :class:`VectorError` when the format
    cannot hold this vector (GGUF and layer 0, Neuronpedia and several layers).
    """
    writers: dict[str, Callable[[SteeringVector, Path], list[Path]]] = {
        "native": _write_native, "gguf": _write_gguf, "steering-vectors": _write_steering_vectors,
        "neuronpedia": _write_neuronpedia, "caa": _write_caa,
    }
    if fmt not in writers:
        raise refused("export_unknown_format", fmt=fmt, known=", ".join(FORMATS))
    _check_finite(vector, "vector")
    return writers[fmt](vector, Path(out))


def export_notes(vector: SteeringVector, fmt: str) -> list[str]:
    """What a user should know about ``fmt``'s copy of ``vector``: its method's note (e.g. ITI's per-head
    steering becomes an approximate residual-stream vector, with the measured error) for every format but
    native, which keeps everything."""
    from .methods.base import method_of

    if fmt == "native":
        return []
    note = getattr(method_of(vector), "export_note", None)
    notes = [note(vector)] if note is not None else []
    if vector.max_delta_logit is not None:
        # by key, so the Export tab says it in the visitor's language (its str() is the English the CLI prints)
        notes.append(Said("export_note_bound", bound=f"{vector.max_delta_logit:g}", fmt=fmt))
    return [n for n in notes if n]


def read_vector(path: str | Path, handle=None,
                max_bytes: int = MAX_VECTOR_FILE_BYTES) -> tuple[SteeringVector, list[str]]:
    """Load a vector in any supported format; returns ``(vector, warnings)`` (each warning said by key, a
    :class:`~steer_ui.messages.Said`: the English here, the visitor's language on the page).

    The format is detected from the content (a directory of ``vec_layer_{L}.pt``
    files is CAA).  With ``handle`` the vector is also checked against that
    model (:func:`validate_for_model`): a wrong hidden size or a missing layer
    raises, a different model type is a warning.
    """
    path = Path(path)
    fmt = detect_format(path, max_bytes=max_bytes)
    readers: dict[str, Callable[[Path], tuple[SteeringVector, list[str]]]] = {
        "native": _read_native, "gguf": _read_gguf, "torch": _read_torch, "neuronpedia": _read_neuronpedia,
        "caa": _read_caa_dir,
    }
    vector, warnings = readers[fmt](path)
    if handle is not None:
        warnings += validate_for_model(vector, handle)
        _method_check(vector, handle, path)
    return vector, warnings


def _method_check(vector: SteeringVector, handle, path: Path) -> None:
    """The vector's own method checks what only it understands (ITI's per-head data) against the model."""
    from .methods.base import method_of

    check = getattr(method_of(vector), "check", None)
    if check is None:
        return
    try:
        check(handle, vector)
    except ValueError as exc:  # VectorError, SteeringError, …: all one-line messages
        raise invalid(path.name, said_of(exc)) from None


def safe_name(name: Any, fallback: str = "vector") -> str:
    """A file or folder name made from a vector's name: it can never leave the folder it is put in.

    Only letters, digits, ``_``, ``-`` and single dots survive (``/``, ``\\``,
    NUL, spaces and other characters become ``_``; ``..`` runs too); no leading
    or trailing dot; at most :data:`steer_ui.limits.MAX_FILE_NAME` characters.
    """
    text = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name))
    text = re.sub(r"\.{2,}", "_", text)
    text = text.strip("._-")[:limits.MAX_FILE_NAME].strip("._-")
    return text or fallback


def export_path(folder: str | Path, name: Any, fmt: str) -> Path:
    """Where ``write_vector(vector, fmt, …)`` should write inside ``folder``: the safe name plus the format's suffix."""
    if fmt not in SUFFIXES:
        raise refused("export_unknown_format", fmt=fmt, known=", ".join(FORMATS))
    folder = Path(folder)
    out = folder / (safe_name(name) + SUFFIXES[fmt])
    if out.resolve().parent != folder.resolve():  # cannot happen with safe_name; kept as the last guard
        raise refused("export_name_leaves_folder", name=repr(str(name)[:60]))
    return out


def detect_format(path: str | Path, max_bytes: int = MAX_VECTOR_FILE_BYTES) -> str:
    """``native``, ``gguf``, ``torch`` (steering-vectors dict or CAA tensor), ``neuronpedia`` or ``caa`` (directory).

    Looks at the first bytes, never at the extension alone; refuses missing,
    empty and oversized files with a message naming the file.
    """
    path = Path(path)
    if path.is_dir():
        files = _caa_files(path)
        if not files:
            found = sorted(p.name for p in path.iterdir())[:8]
            raise refused("vector_dir_without_caa", name=str(path), found=found)
        _check_size(path, sum(p.stat().st_size for p in files.values()), max_bytes)
        return "caa"
    if not path.is_file():
        raise refused("vector_file_not_found", name=str(path))
    size = path.stat().st_size
    if size == 0:
        raise refused("vector_file_empty", name=path.name)
    _check_size(path, size, max_bytes)
    with open(path, "rb") as f:
        head = f.read(64)
    if head.startswith(b"GGUF"):
        return "gguf"
    if len(head) > 8:
        header_len = int.from_bytes(head[:8], "little")
        if 0 < header_len <= size - 8 and head[8:9] == b"{":
            return "native"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return "torch"  # torch.save zip, or the legacy pickle layout: both read with weights_only=True
    text = head.lstrip()
    if text[:1] in (b"{", b"["):
        return "neuronpedia"
    # the file's own first bytes are not shown: as Python writes them (b'this is ') they say nothing to a person
    if path.suffix in (".pt", ".pth", ".bin"):
        raise refused("vector_misnamed_torch", name=path.name, suffix=path.suffix)
    raise refused("vector_unknown_format", name=path.name)


def validate_for_model(vector: SteeringVector, handle) -> list[str]:
    """Check ``vector`` against the loaded model: raises on what cannot work, returns warnings for the rest."""
    arch = handle.arch
    label = vector.name or vector.method
    if vector.hidden_size != arch.hidden_size:
        raise refused("vector_hidden_size_mismatch", label=label, size=vector.hidden_size, model=handle.model_id,
                      model_size=arch.hidden_size)
    missing = [layer for layer in vector.layers if not 0 <= layer < arch.num_layers]
    if missing:
        raise refused("vector_layer_out_of_range", label=label, layer=missing[0], model=handle.model_id,
                      last=arch.num_layers - 1)
    warnings = []
    model_type = _model_type(handle)
    if not vector.model_type:
        warnings.append(Said("import_warning_no_model", label=label, size=arch.hidden_size, model=handle.model_id))
    elif model_type and _family(vector.model_type) != _family(model_type):
        made_for = f"{vector.model_type} ({vector.model_id})" if vector.model_id else vector.model_type
        warnings.append(Said("import_warning_other_model", label=label, made_for=made_for, model_type=model_type,
                             model=handle.model_id))
    return warnings


# ======================================================================== native
def _write_native(vector: SteeringVector, out: Path) -> list[Path]:
    return [_atomic(out, vector.save)]


def _read_native(path: Path) -> tuple[SteeringVector, list[str]]:
    tensors, header = read_safetensors(path)
    directions, extras, other = {}, {}, []
    for key, tensor in tensors.items():
        if key.startswith("direction."):
            directions[_layer_from(key.split(".", 1)[1], path.name, key)] = tensor
        elif key.startswith("extra."):
            extras[key.split(".", 1)[1]] = tensor
        else:
            other.append(key)
    if not directions:
        raise refused("vector_no_directions", name=path.name, found=sorted(tensors)[:8])
    meta = parse_json(header["steer_ui"], f"{path.name} (steer_ui header)") if "steer_ui" in header else None
    warnings = [Said("import_warning_ignored_tensors", name=path.name, tensors=other[:8])] if other else []
    return _assemble(directions, extras, meta, path, "native", warnings=warnings)


# ======================================================================== GGUF control vector
def _write_gguf(vector: SteeringVector, out: Path) -> list[Path]:
    import gguf
    import numpy as np

    if 0 in vector.layers:
        raise refused("export_gguf_layer_0")

    def write(tmp: Path) -> None:
        writer = gguf.GGUFWriter(str(tmp), GGUF_ARCH)
        writer.add_string(f"{GGUF_ARCH}.model_hint", vector.model_type)
        writer.add_uint32(f"{GGUF_ARCH}.layer_count", len(vector.layers))
        # Provenance: readers (llama.cpp, repeng) ignore keys they do not know.
        writer.add_uint32("steer_ui.format_version", int(vector.format_version))
        writer.add_string("steer_ui.method", vector.method)
        writer.add_string("steer_ui.model_id", vector.model_id)
        writer.add_string("steer_ui.site", vector.site)
        writer.add_string("steer_ui.created", vector.created)
        writer.add_string("steer_ui.metadata", json.dumps(vector.metadata()))
        if vector.extras:
            writer.add_string("steer_ui.extras", json.dumps(_encode_extras(vector.extras)))
        for layer, direction in vector.directions.items():
            writer.add_tensor(f"direction.{layer}", direction.numpy().astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    return [_atomic(out, write)]


def _read_gguf(path: Path) -> tuple[SteeringVector, list[str]]:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader

    _check_gguf_header(path)
    try:
        reader = GGUFReader(str(path))
    except Exception:  # the reader's own words name its internals
        raise refused("vector_unreadable_gguf", name=path.name) from None
    arch = _gguf_value(reader, "general.architecture")
    if arch != GGUF_ARCH:
        raise refused("vector_gguf_model_file", name=path.name, arch=arch, expected=GGUF_ARCH)
    warnings = []
    directions = {}
    for tensor in reader.tensors:
        if not tensor.name.startswith("direction."):
            warnings.append(Said("import_warning_ignored_gguf_tensor", name=path.name, tensor=tensor.name))
            continue
        layer = _layer_from(tensor.name.split(".", 1)[1], path.name, tensor.name)
        if tensor.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raise refused("vector_gguf_tensor_type", name=path.name, tensor=tensor.name, type=tensor.tensor_type.name)
        shape = tuple(int(d) for d in tensor.data.shape)
        if sum(1 for d in shape if d != 1) > 1:
            raise refused("vector_gguf_tensor_shape", name=path.name, tensor=tensor.name, shape=shape)
        # One copy out of the memory map (sizes and overlaps were checked by _check_gguf_header).
        directions[layer] = torch.from_numpy(np.asarray(tensor.data, dtype=np.float32).reshape(-1).copy())
    if not directions:
        raise refused("vector_gguf_no_directions", name=path.name)
    layer_count = _gguf_value(reader, f"{GGUF_ARCH}.layer_count")
    if layer_count is not None and int(layer_count) != len(directions):
        warnings.append(Said("import_warning_gguf_layer_count", name=path.name, field=f"{GGUF_ARCH}.layer_count",
                             count=layer_count, tensors=len(directions)))
    hint = _gguf_value(reader, f"{GGUF_ARCH}.model_hint")
    if hint is None:
        warnings.append(Said("import_warning_gguf_no_hint", name=path.name, field=f"{GGUF_ARCH}.model_hint"))
    meta_json = _gguf_value(reader, "steer_ui.metadata")
    meta = parse_json(meta_json, f"{path.name} (steer_ui.metadata)") if meta_json else None
    extras_json = _gguf_value(reader, "steer_ui.extras")
    extras = _decode_extras(parse_json(extras_json, f"{path.name} (steer_ui.extras)"), path.name) \
        if extras_json else {}
    return _assemble(directions, extras, meta, path, "gguf", foreign={"model_type": hint or ""}, warnings=warnings)


_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _check_gguf_header(path: Path) -> None:
    """Walk a GGUF header without building anything: refuse what gguf's reader would blow up in memory.

    The reader makes Python objects per array element and a view per tensor
    info, so counts and array lengths are bounded here first; tensor sizes and
    offsets are checked so that tensors sharing bytes (aliases) or declaring
    more than :data:`steer_ui.limits.MAX_VECTOR_BYTES` are refused before any
    data is copied.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    name = path.name
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def take(fmt: str):
            nonlocal pos
            try:
                values = struct.unpack_from("<" + fmt, buf, pos)
            except struct.error:
                raise invalid(name, Said("vector_detail_gguf_header_ends", pos=pos)) from None
            pos += struct.calcsize("<" + fmt)
            return values[0] if len(values) == 1 else values

        def skip_string() -> str:
            nonlocal pos
            length = take("Q")
            if length > len(buf) - pos:
                raise invalid(name, Said("vector_detail_gguf_string_past_end", length=length))
            text = bytes(buf[pos:pos + min(length, 200)]).decode("utf-8", errors="replace")
            pos += length
            return text

        def skip_value(vtype: int, key: str) -> Any:
            nonlocal pos
            if vtype in _GGUF_SCALARS:
                size = _GGUF_SCALARS[vtype]
                value = int.from_bytes(buf[pos:pos + size], "little") if vtype in (4, 10) else None
                pos += size
                return value
            if vtype == _GGUF_STRING:
                return skip_string()
            if vtype == _GGUF_ARRAY:
                itype, count = take("IQ")
                if count > limits.MAX_GGUF_ARRAY:
                    raise invalid(name, Said("vector_detail_gguf_array", field=key, count=count,
                                             limit=limits.MAX_GGUF_ARRAY))
                for _ in range(count):
                    skip_value(itype, key)
                return None
            raise invalid(name, Said("vector_detail_gguf_value_type", field=key, type=vtype))

        magic, version, n_tensors, n_kv = take("4sIQQ")
        if magic != b"GGUF" or version not in (2, 3):
            raise invalid(name, Said("vector_detail_gguf_version", version=version))
        if n_kv > limits.MAX_GGUF_KV or n_tensors > limits.MAX_LAYERS + limits.MAX_EXTRAS:
            raise invalid(name, Said("vector_detail_gguf_counts", tensors=n_tensors, keys=n_kv,
                                     tensor_limit=limits.MAX_LAYERS + limits.MAX_EXTRAS, key_limit=limits.MAX_GGUF_KV))
        alignment = 32
        for _ in range(n_kv):
            key = skip_string()
            value = skip_value(take("I"), key)
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        spans = []
        for _ in range(n_tensors):
            tname = skip_string()
            n_dims = take("I")
            if n_dims > limits.MAX_DIMS:
                raise invalid(name, Said("vector_detail_gguf_dims", tensor=tname, dims=n_dims, limit=limits.MAX_DIMS))
            dims = [take("Q") for _ in range(n_dims)]
            ttype, offset = take("IQ")
            numel = math.prod(dims)
            if numel > limits.MAX_ELEMENTS:
                raise invalid(name, Said("vector_detail_gguf_elements", tensor=tname, elements=numel,
                                         limit=limits.MAX_ELEMENTS))
            try:
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                raise invalid(name, Said("vector_detail_gguf_tensor_type", tensor=tname, type=ttype)) from None
            spans.append((offset, offset + -(-numel // block) * block_bytes, tname))
        data_start = -(-pos // alignment) * alignment
    total = sum(end - begin for begin, end, _ in spans)
    if total > limits.MAX_VECTOR_BYTES:
        raise invalid(name, Said("vector_detail_gguf_over_mb", size=f"{total / 2**20:.1f}",
                                 limit=f"{limits.MAX_VECTOR_BYTES / 2**20:.0f}"))
    reach, owner = 0, ""
    for begin, end, tname in sorted(spans):
        if data_start + end > path.stat().st_size:
            raise invalid(name, Said("vector_detail_gguf_past_end", tensor=tname))
        if begin < reach:
            raise invalid(name, Said("vector_detail_gguf_overlap", first=owner, second=tname))
        if end > reach:
            reach, owner = end, tname


def _gguf_value(reader, key: str):
    from gguf import GGUFValueType

    field = reader.get_field(key)
    if field is None or not field.types:
        return None
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    if field.types[0] == GGUFValueType.ARRAY:
        return None
    return field.parts[field.data[0]].tolist()[0]


# ======================================================================== steering-vectors
def _write_steering_vectors(vector: SteeringVector, out: Path) -> list[Path]:
    payload = {
        # Plain int keys and standalone tensors: `SteeringVector(**torch.load(path, weights_only=True))` works.
        "layer_activations": {int(layer): direction.clone() for layer, direction in vector.directions.items()},
        "layer_type": "decoder_block",
    }
    written = _atomic(out, lambda tmp: torch.save(payload, tmp))
    return [written, _write_sidecar(vector, _sidecar_for(out))]


def _read_torch(path: Path) -> tuple[SteeringVector, list[str]]:
    """A torch.save file: a steering-vectors dict, or a CAA single tensor (layer from the file name)."""
    obj = _torch_load(path)
    if isinstance(obj, torch.Tensor):
        return _read_caa_files({_caa_layer(path): path}, path.parent, source=path)
    if isinstance(obj, dict) and "layer_activations" in obj:
        return _from_steering_vectors(obj, path)
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()) \
            and all(_is_int_like(k) for k in obj):
        return _from_steering_vectors({"layer_activations": obj}, path,
                                      warnings=[Said("import_warning_bare_dict", name=path.name)])
    keys = sorted(map(str, obj))[:8] if isinstance(obj, dict) else None
    if keys is not None:
        raise refused("vector_torch_unexpected_dict", name=path.name, held=type(obj).__name__, keys=keys)
    raise refused("vector_torch_unexpected", name=path.name, held=type(obj).__name__)


def _from_steering_vectors(obj: dict, path: Path, warnings: list[str] | None = None):
    layer_type = obj.get("layer_type", "decoder_block")
    if layer_type != "decoder_block":
        raise refused("vector_sv_layer_type", name=path.name, layer_type=str(layer_type)[:60])
    acts = obj["layer_activations"]
    if not isinstance(acts, dict) or not acts:
        raise refused("vector_sv_activations", name=path.name)
    directions = {}
    for key, tensor in acts.items():
        if not isinstance(tensor, torch.Tensor):
            raise invalid(path.name, Said("vector_detail_sv_activation_type", entry=repr(key),
                                          type=type(tensor).__name__))
        directions[_layer_from(key, path.name, f"layer_activations[{key!r}]")] = _one_d(tensor, path.name, key)
    sidecar_path = _sidecar_for(path)
    meta, extras = _read_sidecar(sidecar_path)
    warnings = list(warnings or [])
    if meta is None:
        warnings.append(_no_sidecar_warning(path, sidecar_path))
    return _assemble(directions, extras, meta, path, "steering-vectors", warnings=warnings)


# ======================================================================== Neuronpedia JSON
def _write_neuronpedia(vector: SteeringVector, out: Path) -> list[Path]:
    if len(vector.layers) != 1:
        raise refused("export_neuronpedia_layers", layers=vector.layers)
    layer = vector.layer
    doc: dict[str, Any] = {
        "modelId": vector.model_id,
        "layer": layer,
        "layerNumber": layer,
        "hookType": NEURONPEDIA_HOOK,
        "hookName": f"blocks.{layer}.{NEURONPEDIA_HOOK}",
        "vectorLabel": vector.name or vector.method,
        # float32 -> Python float is exact and JSON keeps the shortest repr that round-trips, so the
        # numbers read back bit for bit.
        "vector": vector.direction().tolist(),
        "steer_ui": vector.metadata(),
    }
    if vector.extras:
        doc["steer_ui_extras"] = _encode_extras(vector.extras)
    text = json.dumps(doc, allow_nan=False)
    return [_atomic(out, lambda tmp: Path(tmp).write_text(text))]


def _read_neuronpedia(path: Path) -> tuple[SteeringVector, list[str]]:
    doc = parse_json(path.read_bytes(), path.name)
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]
    if not isinstance(doc, dict):
        raise refused("vector_json_not_object", name=path.name)
    vec_key = next((k for k in ("vector", "steeringVector", "values") if k in doc), None)
    if vec_key is None:
        if "steer_ui" in doc:
            raise refused("vector_json_sidecar", name=path.name)
        raise refused("vector_json_no_vector", name=path.name, keys=sorted(doc)[:10])
    values = doc[vec_key]
    if not isinstance(values, list) or not values:
        raise refused("vector_json_empty", name=path.name, field=vec_key)
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise refused("vector_json_not_number", name=path.name, field=vec_key, index=i, value=repr(x)[:60])
        if not math.isfinite(x):
            raise refused("vector_json_not_finite", name=path.name, field=vec_key, index=i, value=x)
    warnings: list[str] = []
    layer = _neuronpedia_layer(doc, path.name, warnings)
    directions = {layer: torch.tensor(values, dtype=torch.float64).to(torch.float32)}
    meta = doc.get("steer_ui") if isinstance(doc.get("steer_ui"), dict) else None
    extras = _decode_extras(doc["steer_ui_extras"], path.name) if "steer_ui_extras" in doc else {}
    foreign = {"model_id": str(doc.get("modelId") or doc.get("model") or ""),
               "name": str(doc.get("vectorLabel") or doc.get("label") or path.stem)}
    return _assemble(directions, extras, meta, path, "neuronpedia", foreign=foreign, warnings=warnings)


def _neuronpedia_layer(doc: dict, name: str, warnings: list[str]) -> int:
    """Block index L whose output the vector steers, from layer / layerNumber / hookType / hook name."""
    hook = doc.get("hookType")
    hook_name = doc.get("hookName") or doc.get("hook") or doc.get("hook_name")
    layer = doc.get("layer", doc.get("layerNumber"))
    if isinstance(hook_name, str):
        m = re.fullmatch(r"blocks\.(\d+)\.(hook_resid_(?:pre|post))", hook_name)
        if not m:
            raise refused("vector_json_hook", name=name, hook=hook_name[:80])
        layer, hook = layer if layer is not None else int(m.group(1)), hook or m.group(2)
    if isinstance(layer, str):  # Neuronpedia source ids look like "6-res-jb"
        m = re.match(r"^(\d+)", layer)
        if not m:
            raise refused("vector_json_layer_text", name=name, layer=layer[:60])
        layer = int(m.group(1))
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise refused("vector_json_layer", name=name, layer=repr(layer)[:60])
    if hook is None:
        warnings.append(Said("import_warning_no_hook", name=name, hook=NEURONPEDIA_HOOK, layer=layer))
        return layer
    if hook == NEURONPEDIA_HOOK:
        return layer
    if hook == "hook_resid_pre":
        if layer == 0:
            raise refused("vector_json_resid_pre_0", name=name)
        warnings.append(Said("import_warning_resid_pre", name=name, layer=layer, block=layer - 1))
        return layer - 1
    raise refused("vector_json_hook_type", name=name, hook=str(hook)[:80], expected=NEURONPEDIA_HOOK)


# ======================================================================== CAA-style directory
def _write_caa(vector: SteeringVector, out: Path) -> list[Path]:
    if out.suffix in (".pt", ".pth") or out.is_file():
        raise refused("export_caa_directory", name=out.name)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for layer, direction in vector.directions.items():
        target = out / f"vec_layer_{layer}.pt"
        written.append(_atomic(target, lambda tmp, d=direction: torch.save(d.clone(), tmp)))
    written.append(_write_sidecar(vector, out / CAA_SIDECAR))
    return written


def _caa_files(directory: Path) -> dict[int, Path]:
    files: dict[int, Path] = {}
    for p in sorted(directory.iterdir()):
        m = CAA_NAME.match(p.name)
        if m and p.is_file():
            layer = int(m.group(1))
            if layer in files:
                raise invalid(str(directory), Said("vector_detail_caa_two_files", layer=layer,
                                                   first=files[layer].name, second=p.name))
            if len(files) >= limits.MAX_LAYERS:
                raise invalid(str(directory), Said("vector_detail_caa_too_many", limit=limits.MAX_LAYERS))
            files[layer] = p
    return files


def _caa_layer(path: Path) -> int:
    m = CAA_NAME.match(path.name)
    if not m:
        raise refused("vector_caa_name", name=path.name)
    return int(m.group(1))


def _read_caa_dir(directory: Path) -> tuple[SteeringVector, list[str]]:
    return _read_caa_files(_caa_files(directory), directory, source=directory)


def _read_caa_files(files: dict[int, Path], directory: Path, source: Path):
    directions = {}
    model_hints = set()
    for layer, p in files.items():
        obj = _torch_load(p)
        if not isinstance(obj, torch.Tensor):
            raise refused("vector_caa_not_tensor", name=p.name, found=type(obj).__name__)
        directions[layer] = _one_d(obj, p.name, layer)
        m = CAA_NAME.match(p.name)
        if m and m.group(2):
            model_hints.add(m.group(2))
    meta, extras = _read_sidecar(directory / CAA_SIDECAR)
    warnings = [] if meta is not None else [_no_sidecar_warning(source, directory / CAA_SIDECAR)]
    foreign = {"model_id": model_hints.pop()} if len(model_hints) == 1 else {}
    return _assemble(directions, extras, meta, source, "caa", foreign=foreign, warnings=warnings)


# ======================================================================== shared helpers
def _assemble(directions: dict[int, torch.Tensor], extras: dict[str, torch.Tensor], meta: dict | None, path: Path,
              fmt: str, foreign: dict | None = None, warnings: list[str] | None = None):
    """Build the record: our own metadata when the file carries it, else provenance for a foreign file."""
    warnings = list(warnings or [])
    name = path.name
    sizes = {layer: int(v.shape[0]) for layer, v in directions.items()}
    if len(set(sizes.values())) > 1:
        raise refused("vector_layer_sizes_differ", name=name, sizes=sizes)
    for layer, vec in directions.items():
        bad = ~torch.isfinite(vec)
        if bad.any():
            raise refused("vector_layer_not_finite", name=name, layer=layer, index=int(bad.nonzero()[0]))
    for key, tensor in extras.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise refused("vector_extra_not_finite", name=name, tensor=key)
    hidden = next(iter(sizes.values()))
    if meta is not None and not isinstance(meta, dict):
        raise invalid(name, Said("vector_detail_meta_not_object", type=type(meta).__name__))
    described = meta.get("layers", sorted(directions)) if meta is not None else None
    if meta is not None and (not isinstance(described, list) or not all(_is_int_like(x) for x in described)):
        raise invalid(name, Said("vector_detail_meta_layers"))
    if meta is not None and sorted(map(int, described)) != sorted(directions):
        warnings.append(Said("import_warning_meta_layers", name=name, described=described[:16],
                             layers=sorted(directions)))
        meta = None
    if meta is not None:
        _check_declared_extras(meta, extras, name)
        fields = set(SteeringVector.__dataclass_fields__) - {"directions", "extras", "hidden_size"}
        kwargs = {k: meta[k] for k in fields if k in meta}
        if meta.get("hidden_size") not in (None, hidden):
            raise refused("vector_meta_hidden_size", name=name, declared=str(meta['hidden_size'])[:20], size=hidden)
    else:
        kwargs = {"method": "imported", "name": path.stem,
                  "hyperparameters": {"imported_from": fmt, "source_file": name, "source_sha256": _digest(path)}}
        kwargs.update({k: v for k, v in (foreign or {}).items() if v})
    try:
        vector = SteeringVector(directions=directions, extras=extras, hidden_size=hidden, **kwargs)
    except (TypeError, ValueError) as exc:
        raise invalid(name, said_of(exc)) from None
    return vector, warnings


def _check_declared_extras(meta: dict, extras: dict[str, torch.Tensor], name: str) -> None:
    """Refuse a vector whose metadata lists extra tensors the file does not carry.

    The metadata records every extra tensor the vector had (``extra_tensors``):
    an L2S vector without its MLP, a TSV vector without its prototypes or an
    ITI vector without its per-head shifts would import as something else
    (a constant vector, or one that fails at the first use), so it is refused,
    naming what would be lost.
    """
    declared = meta.get("extra_tensors", {})
    if not isinstance(declared, dict):
        raise invalid(name, Said("vector_detail_meta_extra_tensors"))
    missing = sorted(str(k) for k in declared if k not in extras)
    if missing:
        raise refused("vector_extras_missing", name=name, method=str(meta.get('method'))[:40], missing=missing[:8])


def _no_sidecar_warning(path: Path, sidecar: Path) -> str:
    return Said("import_warning_no_sidecar", name=path.name, sidecar=sidecar.name)


def _check_torch_file(path: Path) -> None:
    """Bound what ``torch.load`` may allocate, before it runs: the pickle part and the stored tensor bytes.

    A zip (the default layout) lists its entries with their uncompressed sizes;
    the legacy layout starts with its pickles, which are walked (never run)
    within :data:`MAX_PICKLE_BYTES`.  Views over the stored bytes (expanded,
    aliased) are refused after loading by :func:`steer_ui.vector.check_tensor`.
    """
    name = path.name
    with open(path, "rb") as f:
        head = f.read(MAX_PICKLE_BYTES + 1)
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as z:
                entries = z.infolist()
        except (zipfile.BadZipFile, OSError, ValueError):
            raise refused("vector_unreadable_torch", name=name) from None
        if len(entries) > limits.MAX_LAYERS + limits.MAX_EXTRAS + 16:
            raise invalid(name, Said("vector_detail_torch_entries", entries=len(entries)))
        pickles = sum(e.file_size for e in entries if e.filename.endswith(".pkl"))
        stored = sum(e.file_size for e in entries if "/data/" in e.filename)
        if pickles > MAX_PICKLE_BYTES or stored > limits.MAX_VECTOR_BYTES:
            raise invalid(name, Said("vector_detail_torch_sizes", pickle=pickles, size=f"{stored / 2**20:.1f}",
                                     pickle_limit=MAX_PICKLE_BYTES, limit=f"{limits.MAX_VECTOR_BYTES / 2**20:.0f}"))
        return
    # Legacy layout: magic number, protocol, system info and the object: four pickles, then raw storages.
    stream = io.BytesIO(head[:MAX_PICKLE_BYTES])
    try:
        for _ in range(4):
            for _op in pickletools.genops(stream):
                pass
    except Exception:  # genops raises ValueError for junk and for a pickle cut at the limit
        raise invalid(name, Said("vector_detail_torch_pickle", limit=MAX_PICKLE_BYTES)) from None


def _torch_load(path: Path) -> Any:
    _check_torch_file(path)
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        if "weights_only" in str(exc) or "Unsupported global" in str(exc) or "Unpickler" in str(exc):
            raise refused("vector_torch_objects", name=path.name, why=_unsupported_global(exc)) from None
        raise refused("vector_unreadable_torch", name=path.name) from None
    total = _check_plain(obj, path.name)
    if total > limits.MAX_VECTOR_BYTES:
        raise invalid(path.name, Said("vector_detail_torch_over_mb", size=f"{total / 2**20:.1f}",
                                      limit=f"{limits.MAX_VECTOR_BYTES / 2**20:.0f}"))
    return obj


def _check_plain(obj: Any, name: str, depth: int = 0) -> int:
    """Only tensors, dicts, lists and plain scalars: anything else is refused.  Returns the tensors' bytes.

    Every tensor is checked (:func:`check_tensor`) before anything reshapes or copies it.
    """
    if depth > 6:
        raise invalid(name, Said("vector_detail_too_deep"))
    if isinstance(obj, torch.Tensor):
        return check_tensor(obj, Said("vector_tensor_in_file", name=name))
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return 0
    if isinstance(obj, dict):
        total = 0
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise invalid(name, Said("vector_detail_dict_key", type=type(k).__name__))
            total += _check_plain(v, name, depth + 1)
        return total
    if isinstance(obj, (list, tuple)):
        return sum(_check_plain(v, name, depth + 1) for v in obj)
    raise invalid(name, Said("vector_detail_object", type=type(obj).__name__))


def _unsupported_global(exc: Exception) -> Said:
    """What a refused pickle asked for, in plain words (torch's own paragraph is about its loader's settings)."""
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    return Said("vector_reason_asks_for", what=m.group(1)[:80]) if m else Said("vector_reason_pickle")


def _one_d(tensor: torch.Tensor, name: str, layer) -> torch.Tensor:
    if not tensor.is_floating_point():
        raise refused("vector_layer_dtype", name=name, layer=layer, dtype=tensor.dtype)
    if tensor.numel() == 0 or sum(1 for d in tensor.shape if d != 1) > 1:
        raise refused("vector_layer_shape", name=name, layer=layer, shape=tuple(tensor.shape))
    return tensor.reshape(-1)


def _layer_from(key: Any, name: str, where: str) -> int:
    if _is_int_like(key) and int(key) >= 0:
        return int(key)
    raise refused("vector_layer_name", name=name, where=where)


def _is_int_like(key: Any) -> bool:
    return (isinstance(key, int) and not isinstance(key, bool)) or (isinstance(key, str) and key.isdigit())


def _check_finite(vector: SteeringVector, name: str) -> None:
    for layer, vec in vector.directions.items():
        if not torch.isfinite(vec).all():
            raise refused("vector_layer_nan", name=name, layer=layer)


def _check_size(path: Path, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise refused("vector_file_over_limit", name=path.name, size=f"{size / 2**20:.1f}", limit=f"{max_bytes / 2**20:.0f}")


def _sidecar_for(path: Path) -> Path:
    return path.with_name(path.stem + SIDECAR_SUFFIX)


def _write_sidecar(vector: SteeringVector, target: Path) -> Path:
    doc = {"steer_ui": vector.metadata(), "extras": _encode_extras(vector.extras)}
    text = json.dumps(doc, allow_nan=False, indent=1)
    return _atomic(target, lambda tmp: Path(tmp).write_text(text))


def _read_sidecar(path: Path) -> tuple[dict | None, dict[str, torch.Tensor]]:
    if not path.is_file():
        return None, {}
    if path.stat().st_size > limits.MAX_FILE_BYTES:
        raise invalid(path.name, Said("vector_detail_sidecar_over_mb", limit=limits.MAX_FILE_BYTES >> 20))
    doc = parse_json(path.read_bytes(), path.name)
    if not isinstance(doc, dict) or not isinstance(doc.get("steer_ui"), dict):
        raise invalid(path.name, Said("vector_detail_sidecar_no_steer_ui"))
    return doc["steer_ui"], _decode_extras(doc.get("extras") or {}, path.name)


def _encode_extras(extras: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Extra tensors as {dtype, shape, little-endian bytes in base64}: exact for every dtype, compact."""
    out = {}
    for key, tensor in extras.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in EXTRA_DTYPES:
            raise refused("export_extra_dtype", tensor=key, dtype=dtype)
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[key] = {"dtype": dtype, "shape": list(tensor.shape), "base64": base64.b64encode(raw).decode("ascii")}
    return out


def _decode_extras(doc: Any, name: str) -> dict[str, torch.Tensor]:
    if not isinstance(doc, dict):
        raise invalid(name, Said("vector_detail_extras_not_object"))
    if len(doc) > limits.MAX_EXTRAS:
        raise invalid(name, Said("vector_detail_extras_count", count=len(doc), limit=limits.MAX_EXTRAS))
    # Every declared shape and length is checked, for all of them, before any base64 is decoded.
    plan, total = [], 0
    for key, item in doc.items():
        try:
            dtype = EXTRA_DTYPES[item["dtype"]]
            shape = [int(d) for d in item["shape"]]
            text = item["base64"]
            if not isinstance(text, str):
                raise TypeError("base64 must be a string")
        except (KeyError, TypeError, ValueError) as exc:
            raise invalid(name, Said("vector_detail_extra_malformed", tensor=str(key)[:60],
                                     error=reason(exc))) from None
        itemsize = torch.empty(0, dtype=dtype).element_size()
        numel = math.prod(shape)
        if len(shape) > limits.MAX_DIMS or min(shape, default=0) < 0 or numel > limits.MAX_ELEMENTS:
            raise invalid(name, Said("vector_detail_extra_shape", tensor=str(key)[:60], shape=tuple(shape)[:8],
                                     dims=limits.MAX_DIMS, elements=limits.MAX_ELEMENTS))
        need = numel * itemsize
        if len(text) != 4 * (-(-need // 3)):
            raise invalid(name, Said("vector_detail_extra_base64", tensor=str(key)[:60], chars=len(text),
                                     shape=shape, dtype=item['dtype'], need=need))
        total += need
        if total > limits.MAX_VECTOR_BYTES:
            raise invalid(name, Said("vector_detail_extras_over_mb", limit=limits.MAX_VECTOR_BYTES >> 20))
        plan.append((key, dtype, shape, text, need))
    out = {}
    for key, dtype, shape, text, need in plan:
        try:
            raw = bytearray(base64.b64decode(text, validate=True))
        except ValueError:  # binascii's own words ("Incorrect padding") say less
            raise invalid(name, Said("vector_detail_extra_malformed", tensor=str(key)[:60],
                                     error=Said("vector_reason_base64"))) from None
        if len(raw) != need:
            raise invalid(name, Said("vector_detail_extra_bytes", tensor=str(key)[:60], bytes=len(raw), shape=shape,
                                     need=need))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[key] = flat.view(dtype).reshape(shape)  # owns the bytearray: no further copy
    return out




def _atomic(target: Path, write: Callable[[Path], Any]) -> Path:
    """Write through a temporary file in the same folder, then rename: no half-written vector files."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(_caa_files(path).values()) if path.is_dir() else [path]
    for p in files:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _model_type(handle) -> str:
    try:
        return str(handle.model_type or "")
    except AttributeError:
        return str(getattr(getattr(handle.model, "config", None), "model_type", "") or "")


def _family(model_type: str) -> str:
    # Gemma 3's text-only checkpoints say gemma3_text, the multimodal ones gemma3: same decoder.
    return model_type.removesuffix("_text")

