"""A model's small operations with fewer kernels: RMS norms as one ``F.rms_norm`` call, rotary embeddings on
queries and keys together, and (on CUDA) q/k/v and gate/up as one product each.

A decode step of a few rows is mostly the reading of the weights, but
Hugging Face's modules also launch many small kernels per block: an RMS norm
is eight to ten (cast, square, mean, add, rsqrt, multiply, cast, multiply),
the rotary embedding of queries and keys ten.  On a GPU each costs a few
microseconds even inside a CUDA graph (the captured 8B step at stop 53:
~800 such kernels, 2.2 ms of a 8.9 ms step beside 4.5 ms of products); on
the CPU each is a dispatch from Python.

Every change is checked on a probe input on the model's own device and
dtype when it is installed, and left out where the check fails:

* **rotary** (:func:`fused_rotary`): queries and keys are rotated in one
  pass over their concatenation; the same element-wise operations in the
  same order, so the result is the model's own **bit for bit** (checked so).
  Installed for the families whose module-level ``apply_rotary_pos_emb`` it
  reproduces (Llama, Mistral, Qwen, Gemma): that function is looked up by
  the attention's forward at call time, so the module's name is re-pointed.
* **Gemma's norms** ``x · rsqrt(mean x² + eps) · (1 + w)`` in float32: one
  call with ``1 + w`` kept (:func:`norm_gain`), bit for bit (the CPU's
  rule, issue #50).
* **on CUDA, every RMS norm of the Llama form** (``w · (x · rsqrt(mean x²
  + eps)).to(dtype)``) and Gemma's in half precision: the same formula in
  one fused kernel, equal to the module's own up to the output dtype's
  rounding (the fused kernel's mean sums in another order), checked within
  two units in the last place.  Off the GPU these stay as they are, so CPU
  results are unchanged.
* **on CUDA, q/k/v and gate/up** (:func:`fused_products`): one product over
  the stacked weights, each linear's weight a view of its rows; checked
  within the same rounding.

Calls that need gradients (TSV training through the frozen blocks) keep the
original forwards.  ``STEER_UI_FUSED_OPS=0`` installs nothing (the GPU
run's A/B: docs/bench.md).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

import torch
import torch.nn.functional as F

ENV = "STEER_UI_FUSED_OPS"


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() != "0"


def install(model: torch.nn.Module) -> dict:
    """The fusions this model's device and dtype allow; how many norms, rotary functions and product groups."""
    if enabled():
        fused_norms(model)
        fused_rotary(model)
        fused_products(model)
    # what the model runs with now (a second handle on the same model, int8's, finds them already fused)
    return {"norms": sum(isinstance(m.__dict__.get("forward"), _FusedNorm) for m in model.modules()),
            "rotary": sum(hasattr(getattr(f, "apply_rotary_pos_emb", None), "steer_ui_original")
                          for f in _attention_families(model)),
            "products": sum(isinstance(m.__dict__.get("forward"), _FirstOfGroup) for m in model.modules())}


# ------------------------------------------------------------------ norms
def norm_gain(module: torch.nn.Module) -> torch.Tensor:
    """A Gemma norm's gain ``1 + w`` (float32, contiguous), kept on the module and made again whenever the
    weight is written in place (its version counter moves: a test or a user may set a norm's gain after
    loading).  The fused norm and the fused decode step both read it."""
    weight = module.weight
    kept = module.__dict__.get("_steer_ui_gain")
    if kept is None or kept[0] != weight._version:
        kept = module.__dict__["_steer_ui_gain"] = (weight._version, (1.0 + weight.detach().float()).contiguous())
    return kept[1]


def _gemma_form(module) -> bool:
    name = type(module).__name__
    return name.startswith("Gemma") and name.endswith("RMSNorm") and isinstance(getattr(module, "eps", None), float)


def _llama_form(module) -> bool:
    """``w · (x · rsqrt(mean x² + eps)).to(dtype)``: Llama's norm and the families that copy it (Mistral, Qwen)."""
    return type(module).__name__.endswith("RMSNorm") and not _gemma_form(module) and isinstance(
        getattr(module, "variance_epsilon", None), float)


class _FusedNorm:
    """A norm's forward as one ``F.rms_norm`` call (Gemma: with its kept gain; Llama: then times ``w``)."""

    def __init__(self, module: torch.nn.Module, original, gemma: bool):
        self.module, self.original, self.gemma = module, original, gemma

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self.module
        weight = module.weight
        # calls that need gradients (training through the blocks) keep the original, whose backward is torch's own
        if x.device != weight.device or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return self.original(x)
        if self.gemma:  # (norm(x.float()) · (1 + w)).type_as(x): the gain multiplies in float32
            scale = norm_gain(module)
            return F.rms_norm(x.float(), scale.shape, scale, module.eps).to(x.dtype)
        # the normalised input rounds to x's dtype before w multiplies, as the module's own forward does
        return weight * F.rms_norm(x, weight.shape, None, module.variance_epsilon).to(x.dtype)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the dtype's rounding: within two units in the last place of the larger magnitude."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ulp = torch.finfo(a.dtype).eps
    gap = (a.float() - b.float()).abs()
    return bool((gap <= 2 * ulp * torch.maximum(a.float().abs(), b.float().abs()) + 1e-30).all())


def fused_norms(model: torch.nn.Module) -> int:
    """The model's RMS norms as one fused call each where this device and dtype allow; returns how many.

    Off CUDA: Gemma's float32 norms only, and only where a probe gives the
    module's own result bit for bit (issue #50: a side-by-side step of Gemma 3
    270M dispatched 2,402 torch operators, 1,412 with its norms fused).  On
    CUDA: both forms in any float dtype, where the probe agrees up to the
    dtype's rounding.
    """
    changed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if "forward" in module.__dict__ or not isinstance(weight, torch.Tensor) or weight.dim() != 1:
            continue
        gemma, llama = _gemma_form(module), _llama_form(module)
        cuda = weight.device.type == "cuda"
        if not (gemma and weight.dtype == torch.float32) and not (cuda and (gemma or llama)):
            continue
        fused = _FusedNorm(module, module.forward, gemma)
        probe = torch.randn(5, weight.shape[0], generator=torch.Generator().manual_seed(50)) * 30
        probe = probe.to(weight.device, weight.dtype)
        with torch.no_grad():
            own, mine = fused.original(probe), fused(probe)
        if torch.equal(own, mine) or (cuda and _close(own, mine)):
            module.forward = fused
            changed += 1
    return changed


# ------------------------------------------------------------------ rotary
def _attention_families(model: torch.nn.Module) -> set:
    """The Python modules that define the model's attention classes (where each family's
    ``apply_rotary_pos_emb`` lives)."""
    names = {type(m).__module__ for m in model.modules() if type(m).__name__.endswith("Attention")}
    return {sys.modules[n] for n in names if n in sys.modules}


def _rotated(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1):
    """``q · cos + rotate_half(q) · sin`` and the same for ``k``, on their concatenation along the heads: six
    kernels for both instead of ten, each element computed by the same operations in the same order."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    both = torch.cat((q, k), dim=1)
    half = both.shape[-1] // 2
    turned = torch.cat((-both[..., half:], both[..., :half]), dim=-1)
    out = both * cos + turned * sin
    return out[:, : q.shape[1]], out[:, q.shape[1]:]


def _fits(q, k, cos, sin, unsqueeze_dim) -> bool:
    """The calls :func:`_rotated` reproduces: (batch, heads, seq, head_dim) queries and keys of one dtype, the
    heads axis 1, cos/sin over the whole head."""
    return (unsqueeze_dim == 1 and q.dim() == 4 and k.dim() == 4 and q.dtype == k.dtype == cos.dtype == sin.dtype
            and q.shape[0] == k.shape[0] and q.shape[2:] == k.shape[2:] and cos.shape[-1] == q.shape[-1]
            and q.shape[-1] % 2 == 0)


def _rotary_for(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze_dim = kwargs.pop("unsqueeze_dim", args[0] if len(args) == 1 else 1)
        if kwargs or len(args) > 1 or not _fits(q, k, cos, sin, unsqueeze_dim):
            return original(q, k, cos, sin, *args, **kwargs)
        return _rotated(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.steer_ui_original = original
    return apply_rotary_pos_emb


def _probe(device, dtype):
    g = torch.Generator().manual_seed(51)
    q, k = torch.randn(2, 4, 3, 8, generator=g), torch.randn(2, 2, 3, 8, generator=g)
    angle = torch.randn(2, 3, 4, generator=g)
    cos, sin = torch.cat((angle.cos(),) * 2, -1), torch.cat((angle.sin(),) * 2, -1)
    # a transposed view, as the attention modules pass their queries and keys
    q, k = q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)
    return [t.to(device, dtype) for t in (q, k, cos, sin)]


def fused_rotary(model: torch.nn.Module) -> int:
    """Point the model's attention modules' ``apply_rotary_pos_emb`` at :func:`_rotated` where a probe on the
    model's device and dtype gives the original's queries and keys bit for bit; returns how many modules took it
    (one per family, shared by every model of that family in the process, which is why it must be exact)."""
    p = next(model.parameters(), None)
    if p is None or not p.is_floating_point():
        return 0
    changed = 0
    for module in _attention_families(model):
        original = getattr(module, "apply_rotary_pos_emb", None)
        if original is None or getattr(original, "steer_ui_original", None) is not None:
            continue
        wrapped = _rotary_for(original)
        args = _probe(p.device, p.dtype)
        with torch.no_grad():
            own, mine = original(*args), wrapped(*args)
        if all(torch.equal(a, b) for a, b in zip(own, mine)):
            module.apply_rotary_pos_emb = wrapped
            changed += 1
    return changed


@contextlib.contextmanager
def uninstalled(model: torch.nn.Module):
    """The model's own norms, rotary functions and products for the duration (an A/B of the fusions in one
    process: a CUDA graph records what the modules launched while it was captured).  Not for use while other
    threads run the model: the rotary function is a module-level name."""
    forwards = {m: m.__dict__.pop("forward") for m in model.modules()
                if isinstance(m.__dict__.get("forward"), (_FusedNorm, _FirstOfGroup, _LaterOfGroup))}
    rotary = {f: f.apply_rotary_pos_emb for f in _attention_families(model)
              if hasattr(getattr(f, "apply_rotary_pos_emb", None), "steer_ui_original")}
    for family, wrapped in rotary.items():
        family.apply_rotary_pos_emb = wrapped.steer_ui_original
    try:
        yield
    finally:
        for module, forward in forwards.items():
            module.forward = forward
        for family, wrapped in rotary.items():
            family.apply_rotary_pos_emb = wrapped


# ------------------------------------------------------------------ products
# the linears of a module read in this order from one input: computed as one product over their stacked weights
_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_STASH = threading.local()  # per thread: group -> (input, parts) until the later members have read their part


class _FirstOfGroup:
    """The first linear of a group: one product for the whole group, its own part returned, the rest kept for the
    later members (:class:`_LaterOfGroup`) called with the same input tensor."""

    def __init__(self, linear: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None, sizes: list[int]):
        self.linear, self.weight, self.bias, self.sizes = linear, weight, bias, sizes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        own = self.linear.weight
        # training through the blocks, or weights no longer views of the stacked matrix (``model.to(dtype)``
        # makes new ones): each linear its own product
        if (torch.is_grad_enabled() and x.requires_grad) or own.dtype != self.weight.dtype or \
                own.data_ptr() != self.weight.data_ptr():
            return F.linear(x, own, self.linear.bias)
        parts = F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
        _STASH.__dict__[id(self)] = (x, dict(enumerate(parts[1:], start=1)))
        return parts[0]


class _LaterOfGroup:
    """A later linear of a group (``index`` in it): its part of the first member's product when called with the
    same input tensor, else its own product."""

    def __init__(self, linear: torch.nn.Linear, first: _FirstOfGroup, index: int):
        self.linear, self.first, self.index = linear, first, index

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        kept = _STASH.__dict__.get(id(self.first))
        if kept is not None and kept[0] is x and self.index in kept[1]:
            part = kept[1].pop(self.index)
            if not kept[1]:
                del _STASH.__dict__[id(self.first)]
            return part
        return F.linear(x, self.linear.weight, self.linear.bias)  # another input (or read twice)


def fused_products(model: torch.nn.Module, devices: tuple[str, ...] = ("cuda",)) -> int:
    """Queries, keys and values as one product, and the MLP's gate and up as one, on ``devices``; returns how many
    groups.  The group's weights are stacked into one matrix and each linear's weight becomes a view of its rows
    (no second copy).  A group is changed only where a probe's parts agree with the separate products up to the
    dtype's rounding.  Plain ``nn.Linear`` s of one dtype and device, all with a bias or none."""
    changed = 0
    for module in model.modules():
        for names in _GROUPS:
            linears = [getattr(module, n, None) for n in names]
            if not all(type(m) is torch.nn.Linear and "forward" not in m.__dict__ for m in linears):
                continue
            w0 = linears[0].weight
            if (w0.device.type not in devices or not w0.is_floating_point()
                    or any(m.weight.dtype != w0.dtype or m.weight.device != w0.device
                           or m.weight.shape[1] != w0.shape[1] for m in linears)
                    or len({m.bias is None for m in linears}) != 1):
                continue
            changed += _group(linears)
    return changed


def _group(linears: list[torch.nn.Linear]) -> int:
    probe = torch.randn(3, linears[0].weight.shape[1], generator=torch.Generator().manual_seed(52))
    probe = probe.to(linears[0].weight.device, linears[0].weight.dtype)
    with torch.no_grad():
        own = [m(probe) for m in linears]
        weight = torch.cat([m.weight.detach() for m in linears])
        bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
        sizes = [m.weight.shape[0] for m in linears]
        first = _FirstOfGroup(linears[0], weight, bias, sizes)
        later = [_LaterOfGroup(m, first, i) for i, m in enumerate(linears[1:], start=1)]
        parts = [first(probe)] + [m(probe) for m in later]
    if not all(torch.equal(a, b) or _close(a, b) for a, b in zip(own, parts)):
        return 0
    start = 0
    for m, size in zip(linears, sizes):  # each weight a view of the stacked one: no second copy stays
        m.weight = torch.nn.Parameter(weight[start:start + size], requires_grad=False)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[start:start + size], requires_grad=False)
        start += size
    linears[0].forward = first
    for m, forward in zip(linears[1:], later):
        m.forward = forward
    return 1
