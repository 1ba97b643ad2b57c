"""Batched activation extraction with a disk cache.

One forward pass per batch records every layer at once through the one
activation reader (:func:`steer_ui.model.capture.recording`):

* site ``resid``: the output of each decoder block (the steering site; HF
  ``hidden_states[L + 1]``), width ``hidden_size``;
* site ``heads``: the input of each attention output projection (``o_proj`` /
  ``c_proj`` / ``dense`` / ``out_proj``), i.e. the concatenated per-head
  attention outputs, width ``num_heads · head_dim`` (ITI's site).

Each row's text is ``template`` filled with its prompt and completion
(default: prompt, a space, completion).  Positions reduce the sequence to one
vector per row and layer: ``last`` (last token), ``mean`` (mean over the
completion's tokens) or an integer token index (from the start of the row's
own tokens, negative from the end).  Rows are batched by length and padded on
the left with an attention mask and matching position ids
(:func:`~steer_ui.model.capture.length_batches`,
:func:`~steer_ui.model.capture.left_pad`), so a padded row gives the
activations it would give alone (to float rounding).

Results are cached under ``cache_root()/activations`` keyed by (model
fingerprint, dataset content hash, position, template, site); a re-train or a
different layer never re-runs the model.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..model.capture import SITES, forward, left_pad, length_batches, recording, site_width
from ..model.identity import model_fingerprint
from ..messages import Said
from ..paths import cache_root
from .datasets import Dataset, DatasetError, _join

Progress = Callable[[float, str], None]
CACHE_VERSION = 1
MAX_TOKENS = 512  # per row; longer rows keep their end (the last token is what most positions read)
TOKEN_BUDGET = 4096  # padded tokens per batch


@dataclass
class Activations:
    """``values``: (rows, layers, width) float32 on CPU, rows in dataset order."""

    values: torch.Tensor
    labels: np.ndarray | None
    groups: list[str]
    position: str
    site: str
    template: str
    model_id: str
    content_hash: str
    from_cache: bool = False
    seconds: float = 0.0

    @property
    def num_layers(self) -> int:
        return self.values.shape[1]

    def layer(self, layer: int) -> torch.Tensor:
        return self.values[:, layer, :]

    def heads(self, num_heads: int) -> torch.Tensor:
        """(rows, layers, heads, head_dim) view of a ``heads`` site extraction."""
        rows, layers, width = self.values.shape
        return self.values.reshape(rows, layers, num_heads, width // num_heads)


# ------------------------------------------------------------------ texts
def _check_template(template: str | None) -> str:
    if template is None:
        return "join"
    if template.count("{completion}") != 1:
        raise DatasetError.from_key("activations_template", template=repr(template))
    return template


def render(prompt: str, completion: str, template: str | None) -> tuple[str, int, int]:
    """(text, completion start, completion end) in characters."""
    if template is None or template == "join":
        text = _join(prompt, completion)
        start = len(text) - len(completion)
        return text, start, len(text)
    before, after = template.split("{completion}")
    head = before.replace("{prompt}", prompt)
    tail = after.replace("{prompt}", prompt)
    return head + completion + tail, len(head), len(head) + len(completion)


def _encode(handle, text: str, start: int, end: int) -> tuple[list[int], list[bool]]:
    """Token ids and a completion-token mask for one row."""
    tok = handle.tokenizer
    try:
        enc = tok(text, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        ids = list(enc["input_ids"])
        mask = [(e > start and s < end and e > s) for s, e in offsets]
    except (NotImplementedError, TypeError, KeyError):  # slow tokenizers have no offsets
        ids = list(tok(text).input_ids)
        n_prefix = len(tok(text[:start]).input_ids)
        mask = [i >= n_prefix for i in range(len(ids))]
    if not ids:
        raise DatasetError.from_key("activations_no_tokens", text=repr(text[:60]))
    if len(ids) > MAX_TOKENS:
        ids, mask = ids[-MAX_TOKENS:], mask[-MAX_TOKENS:]
    return ids, mask


# ------------------------------------------------------------------ extraction
def extract_texts(handle, prompts: Sequence[str], completions: Sequence[str], position: str | int = "last",
                  site: str = "resid", template: str | None = None, batch_size: int = 32,
                  progress: Progress | None = None) -> torch.Tensor:
    """(rows, layers, width) activations for raw texts, no cache.  ``batch_size=1`` runs one at a time, unpadded."""
    if site not in SITES:
        raise DatasetError.from_key("activations_site", sites=SITES, site=repr(site))
    position = _check_position(position)
    template = _check_template(template)
    progress = progress or (lambda _f, _m: None)
    n = len(prompts)
    encoded = [_encode(handle, *render(p, c, template)) for p, c in zip(prompts, completions)]
    num_layers = handle.arch.num_layers
    out = torch.zeros(n, num_layers, site_width(handle, site), dtype=torch.float32)
    pad_id = handle.tokenizer.pad_token_id if handle.tokenizer.pad_token_id is not None else 0
    batch_state: dict[str, torch.Tensor] = {}

    def reduce(h: torch.Tensor) -> torch.Tensor:
        h = h.float()
        if position == "last":
            return h[:, -1, :].cpu()
        if position == "mean":
            w = batch_state["weights"]
            return ((h * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp_min(1.0)).cpu()
        return h[torch.arange(h.shape[0]), batch_state["index"], :].cpu()

    batches = length_batches([len(ids) for ids, _mask in encoded], batch_size, TOKEN_BUDGET)
    done = 0
    with handle.lock, torch.inference_mode(), recording(handle, range(num_layers), site, reduce=reduce) as store:
        for batch in batches:
            ids, attn, positions = left_pad([encoded[i][0] for i in batch], pad_id)
            seq = ids.shape[1]
            comp = torch.zeros(ids.shape, dtype=torch.float32)
            index = torch.zeros(len(batch), dtype=torch.long)
            for r, i in enumerate(batch):
                row_mask = torch.tensor(encoded[i][1], dtype=torch.float32)
                k = len(row_mask)
                if row_mask.sum() == 0:  # completion vanished in tokenisation: fall back to the last token
                    row_mask[-1] = 1.0
                comp[r, seq - k:] = row_mask
                if isinstance(position, int):
                    j = position if position >= 0 else k + position
                    index[r] = seq - k + min(max(j, 0), k - 1)
            batch_state["weights"], batch_state["index"] = comp, index
            store.clear()
            forward(handle, ids, attn, positions)
            out[batch] = torch.stack([store[layer] for layer in range(num_layers)], dim=1)
            done += len(batch)
            progress(done / max(n, 1), Said("progress_extracting", done=done, n=n))
    return out


def _check_position(position: str | int) -> str | int:
    if isinstance(position, (int, np.integer)):
        return int(position)
    if isinstance(position, str):
        if position in ("last", "mean"):
            return position
        try:
            return int(position)
        except ValueError:
            pass
    raise DatasetError.from_key("activations_position", position=repr(position))


# ------------------------------------------------------------------ cache
def cache_path(handle, dataset: Dataset, position: str | int, template: str | None, site: str) -> Path:
    key = json.dumps([CACHE_VERSION, model_fingerprint(handle), dataset.content_hash, str(position),
                      _check_template(template), site])
    return cache_root() / "activations" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.safetensors"


def extract(handle, dataset: Dataset, position: str | int = "last", template: str | None = None,
            site: str = "resid", batch_size: int = 32, progress: Progress | None = None,
            cache: bool = True) -> Activations:
    """Activations of every layer for every row of ``dataset`` (pairs are expanded by ``as_labelled``).

    ``batch_size=1`` is the one-at-a-time mode (no padding), for comparison.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    labelled = dataset.as_labelled()
    position = _check_position(position)
    progress = progress or (lambda _f, _m: None)
    start = time.perf_counter()
    path = cache_path(handle, labelled, position, template, site) if cache else None
    common = dict(labels=labelled.labels, groups=labelled.groups, position=str(position), site=site,
                  template=_check_template(template), model_id=handle.model_id, content_hash=labelled.content_hash)
    if path is not None and path.is_file():
        try:
            with safe_open(str(path), framework="pt") as f:
                values = f.get_tensor("values")
            if values.shape[0] == len(labelled):
                progress(1.0, Said("progress_activations_cached", n=len(labelled)))
                return Activations(values=values, from_cache=True, seconds=time.perf_counter() - start, **common)
        except Exception:  # a damaged cache file is rebuilt, never trusted
            pass
    frame = labelled.frame
    values = extract_texts(handle, frame["prompt"].tolist(), frame["completion"].tolist(), position=position,
                           site=site, template=template, batch_size=batch_size, progress=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=path.parent)
        os.close(fd)
        try:
            save_file({"values": values.contiguous()}, tmp, metadata={
                "model_id": handle.model_id, "content_hash": labelled.content_hash, "position": str(position),
                "site": site, "template": _check_template(template)})
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return Activations(values=values, from_cache=False, seconds=time.perf_counter() - start, **common)
