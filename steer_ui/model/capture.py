"""The one activation reader: record what decoder blocks produce during a forward pass.

Sites:

* ``resid``: the output of decoder block L, the residual stream after block L
  (the steering site; HF ``hidden_states[L + 1]``), width ``hidden_size``;
* ``heads``: the input of block L's attention output projection (``o_proj`` /
  ``c_proj`` / ``dense`` / ``out_proj``), i.e. the concatenated per-head
  attention outputs, width ``num_heads · head_dim`` (ITI's site).

:func:`recording` installs the hooks and always removes them; :func:`capture`
runs one (optionally left-padded) batch through the decoder and returns what
was recorded; :func:`left_pad` and :func:`length_batches` are the batching
helpers every reader shares, so padded rows give the activations they would
give alone (to float rounding).
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch

SITES = ("resid", "heads")
Reduce = Callable[[torch.Tensor], torch.Tensor]

_OUT_PROJ_PATHS = ("self_attn.o_proj", "attn.c_proj", "attention.dense", "self_attn.out_proj", "attn.out_proj",
                   "self_attention.dense", "attn.o_proj")


class CaptureError(ValueError):
    """A capture request this model cannot serve (no such layer, site or module)."""


def head_geometry(handle) -> tuple[int, int]:
    """(num_heads, head_dim) of the attention layers."""
    config = handle.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    if not heads:
        raise CaptureError(f"cannot find the number of attention heads in the config of {handle.model_id}")
    head_dim = getattr(config, "head_dim", None) or handle.arch.hidden_size // heads
    return int(heads), int(head_dim)


def out_projection(handle, layer: int) -> torch.nn.Module:
    """The attention output projection of block ``layer`` (its input is the per-head outputs, concatenated)."""
    block = handle.arch.layers[layer]
    for path in _OUT_PROJ_PATHS:
        obj = block
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.Module):
            return obj
    raise CaptureError(f"cannot find the attention output projection in block {layer} of {handle.model_id} "
                       f"(tried {', '.join(_OUT_PROJ_PATHS)})")


def out_projection_weight(handle, layer: int) -> torch.Tensor:
    """W_O as (hidden, heads · head_dim), whatever the module type (GPT-2's Conv1D stores it transposed)."""
    module = out_projection(handle, layer)
    w = module.weight
    if type(module).__name__ == "Conv1D":
        w = w.T
    return w.detach().float().cpu()


def site_width(handle, site: str) -> int:
    if site == "resid":
        return handle.arch.hidden_size
    heads, head_dim = head_geometry(handle)
    return heads * head_dim


def thread_owned(fn: Callable) -> Callable:
    """``fn`` as a hook that acts only in the thread that makes it (so, registers it).

    Hooks live on the one shared model, and several threads run it at once:
    the decode engine, a session's training job, another's slider.  A hook
    that fired in every thread would leak one user's steering or recording
    into another's forward pass; tied to its thread, it cannot.  (So a
    forward pass must run in the thread that installed its hooks: never
    yield out of a steering block to a consumer in another thread.)  Marked
    ``_steer_ui`` for :func:`steer_ui.model.hooks.hook_count`.
    """
    owner = threading.get_ident()

    @functools.wraps(fn)
    def hook(*args, **kwargs):
        if threading.get_ident() != owner:
            return None
        return fn(*args, **kwargs)

    hook._steer_ui = True
    return hook


def _check(handle, layers: Sequence[int], site: str) -> list[int]:
    if site not in SITES:
        raise CaptureError(f"site must be one of {SITES}, got {site!r}")
    n = handle.arch.num_layers
    out = []
    for layer in layers:
        layer = int(layer)
        if not 0 <= layer < n:
            raise CaptureError(f"layer {layer} does not exist: the model has layers 0..{n - 1}")
        out.append(layer)
    return sorted(set(out))


@contextmanager
def recording(handle, layers: Sequence[int], site: str = "resid", reduce: Reduce | None = None,
              detach: bool = True) -> Iterator[dict[int, torch.Tensor]]:
    """Yield a dict that forward passes inside the block fill with ``reduce(activation)`` per layer.

    ``reduce`` maps the (rows, seq, width) activation to what is kept (default:
    all of it).  Hooks are removed on every exit.  ``detach=False`` keeps the
    autograd graph (training through a capture).
    """
    layers = _check(handle, layers, site)
    store: dict[int, torch.Tensor] = {}
    keep = reduce or (lambda h: h)

    def post(layer):
        def hook(_m, _inp, output):
            h = output[0] if isinstance(output, tuple) else output
            store[layer] = keep(h.detach() if detach else h)
        return thread_owned(hook)

    def pre(layer):
        def hook(_m, args, kwargs):
            h = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
            store[layer] = keep(h.detach() if detach else h)
        return thread_owned(hook)

    removers = []
    try:
        for layer in layers:
            if site == "resid":
                removers.append(handle.arch.layers[layer].register_forward_hook(post(layer)))
            else:
                removers.append(out_projection(handle, layer).register_forward_pre_hook(pre(layer), with_kwargs=True))
        yield store
    finally:
        for r in removers:
            r.remove()


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) for token rows padded on the left.

    Position ids count real tokens only, so a padded row sees the positions it
    would see alone.
    """
    seq = max(len(r) for r in rows)
    ids = torch.full((len(rows), seq), int(pad_id), dtype=torch.long)
    attn = torch.zeros((len(rows), seq), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, seq - len(r):] = torch.as_tensor(list(r), dtype=torch.long)
            attn[i, seq - len(r):] = 1
    positions = (attn.cumsum(-1) - 1).clamp_min(0)
    return ids, attn, positions


def length_batches(lengths: Sequence[int], batch_size: int, token_budget: int) -> list[list[int]]:
    """Row indices grouped into batches of similar length (shortest first), each within both budgets."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[i]  # ascending, so the newest row is the longest
        if current and (len(current) >= batch_size or longest * (len(current) + 1) > token_budget):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def forward(handle, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None):
    """One decoder pass (no lm_head, no cache) on the model's input device; returns the base model's output.

    The mask is passed only when some position is padding, so unpadded rows
    take the same kernels as a single-row call.
    """
    dev = handle.input_device
    kwargs = {"input_ids": input_ids.to(dev), "use_cache": False}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids.to(dev)
    if attention_mask is not None and (input_ids.shape[0] > 1 or bool((attention_mask == 0).any())):
        kwargs["attention_mask"] = attention_mask.to(dev)
    return handle.model.base_model(**kwargs)


def capture(handle, input_ids: torch.Tensor, layers: Sequence[int], site: str = "resid",
            attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
            reduce: Reduce | None = None) -> dict[int, torch.Tensor]:
    """Run one batch and return ``{layer: reduce(activation)}`` for ``layers`` at ``site``."""
    with recording(handle, layers, site=site, reduce=reduce) as store:
        forward(handle, input_ids, attention_mask, position_ids)
    return dict(store)


class _Enough(Exception):
    """Raised once the block :func:`capture_through` reads has run: the later blocks are not needed."""


def capture_through(handle, input_ids: torch.Tensor, layer: int, attention_mask: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Block ``layer``'s output for one batch, running blocks 0..``layer`` only (no later block, no final norm):
    a read that needs one block's residual pays for the blocks up to it and nothing else."""
    def stop(_m, _inp, _out):
        raise _Enough

    with recording(handle, [layer]) as store:
        remover = handle.arch.layers[layer].register_forward_hook(thread_owned(stop))  # after the recording hook
        try:
            forward(handle, input_ids, attention_mask, position_ids)
        except _Enough:
            pass
        finally:
            remover.remove()
    return store[layer]
