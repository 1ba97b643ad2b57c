"""The weights' precision (float32, bfloat16, int8): which one a model runs in, and what it costs, measured.

The cost is measured against the same model in float32 on fixed prompts (:data:`PROBE_PROMPTS`): the largest
change of any next-token probability, how many top-1 tokens agree, and the largest change of a steered
prompt's Δlogit (steered − unsteered next-token logits, a fixed random direction at the middle block with α
the size of the residual there).  For int8 it is measured at the first load on a machine, from the float32
model just before it is quantised, and kept in the cache with the int8 weights.

The default on a CPU is chosen by these numbers: int8 where the model has its own int8 codes (a GGUF) and
their measured cost is within :data:`DEFAULT_MAX_DP` with every top-1 kept, float32 otherwise (int8 rounded
from float weights cost ~0.02 on Gemma 3 270M; docs/bench.md).  Other devices keep their dtype rules
(bfloat16 on CUDA).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..messages import KeyedError
from ..policy import WEIGHTS
from .generation import encode_prompt

DEFAULT_MAX_DP = 0.01  # #37's bound for a default: max |Δ next-token probability| against float32

PROBE_PROMPTS = (
    "The capital of France is",
    "Water boils at one hundred degrees Celsius at sea level, and",
    "She opened the book and began to read",
    "The best way to learn a new language is",
    "In 1969, the first humans walked on",
    "def fibonacci(n):",
)


class PrecisionError(KeyedError):
    """A weights setting that cannot be used (unknown, or int8 off the CPU)."""


# the integer-product paths the loader may switch on, in its order, where measured within the bound: W8A8 for
# every product; else W8A16 for every product where a packed path takes every weight (AMX's tiles, or AVX-512
# VNNI's vpdpbusd on the same packing: the fused CPU step's blocks then take int16 activations too:
# w8a16_kernel.c); else W8A16 for the unembedding alone.  Each at every row count, so a request's result does not
# depend on its batch.  Without a packed path W8A16 for every product stays off: the fused step's blocks take
# float activations there, and the dynamic path it would decode on was slower
AUTO_INTEGER_PATHS = ("w8a8", "w8a16", "w8a16_unembedding")


def integer_path(measured: dict | None, packed: bool = False) -> str | None:
    """The integer-product path the loader switches on for a model with this measured cost ("w8a8", "w8a16" or
    "w8a16_unembedding"), or None: the first of :data:`AUTO_INTEGER_PATHS` measured within the bound, "w8a16"
    only where ``packed`` (this machine's packed path takes every block weight)."""
    return next((path for path in AUTO_INTEGER_PATHS
                 if (path != "w8a16" or packed) and ((measured or {}).get(path) or {}).get("on")), None)


def path_in_use(measured: dict | None) -> str | None:
    """The integer-product path a loaded model runs (the loader records its choice as ``in_use``; a cost without
    it, as the tests write one, reads as a machine without a packed path would choose)."""
    measured = measured or {}
    return measured["in_use"] if "in_use" in measured else integer_path(measured)


def check_weights(weights: str, device: torch.device, dtype: str) -> str:
    """``weights`` validated against the device and an explicit ``dtype``; "auto" stays "auto"."""
    if weights in (None, "", "auto"):
        return "auto"
    if weights not in WEIGHTS:
        raise PrecisionError.from_key("model_error_weights", weights=str(weights)[:40], known=", ".join(WEIGHTS))
    if weights == "int8" and device.type != "cpu":
        raise PrecisionError.from_key("model_error_int8_device", device=device.type)
    compute = "float32" if weights == "int8" else weights
    if dtype not in (None, "", "auto", compute):
        raise PrecisionError.from_key("model_error_weights_dtype", weights=weights, compute=compute,
                                      dtype=str(dtype)[:40])
    return weights


def final_hidden(handle, prompts=PROBE_PROMPTS) -> list[torch.Tensor]:
    """The final-norm input of each prompt's last position, (1, hidden) each."""
    hs = []
    with handle.lock, torch.inference_mode():
        for p in prompts:
            ids = encode_prompt(handle, p).to(handle.input_device)
            out = handle.model.base_model(input_ids=ids, use_cache=False)
            hs.append(out.last_hidden_state[:, -1, :])
    return hs


def next_token_probs(handle, prompts=PROBE_PROMPTS) -> torch.Tensor:
    """(prompts, vocab) float32 next-token probabilities of the unsteered model, on the CPU."""
    with torch.inference_mode():
        return torch.cat([handle.arch.logits(h).softmax(-1).float().cpu() for h in final_hidden(handle, prompts)])


def fingerprint(handle, alpha: float | None = None) -> dict:
    """What the cost is measured on: next-token probabilities of :data:`PROBE_PROMPTS` and the steered Δlogit of
    the first one.  ``alpha``: the steering size to use (the float32 run's, so both runs steer alike); None
    measures it (the residual norm at the middle block's output for that prompt)."""
    from .analysis import naive_logits
    from .hooks import Steer

    layer = handle.arch.num_layers // 2
    prompt = PROBE_PROMPTS[0]
    if alpha is None:
        ids = encode_prompt(handle, prompt).to(handle.input_device)
        with handle.lock, torch.inference_mode():
            hidden = handle.model(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states
        alpha = float(hidden[layer + 1][0, -1].float().norm())
    gen = torch.Generator().manual_seed(37)
    direction = torch.randn(handle.arch.hidden_size, generator=gen)
    steer = Steer(layer=layer, vector=direction / direction.norm(), alpha=alpha)
    with handle.lock:
        delta = naive_logits(handle, prompt, [steer]) - naive_logits(handle, prompt, [])
    return {"probs": next_token_probs(handle), "delta_logit": delta, "alpha": alpha, "layer": layer}


def cost(reference: dict, candidate: dict) -> dict:
    """The candidate's cost against the float32 ``reference`` (both from :func:`fingerprint`)."""
    p, q = reference["probs"], candidate["probs"]
    agree = int((p.argmax(-1) == q.argmax(-1)).sum())
    return {"max_abs_dp": float((p - q).abs().max()), "top1_agree": agree, "prompts": int(p.shape[0]),
            "max_abs_ddlogit": float((reference["delta_logit"] - candidate["delta_logit"]).abs().max()),
            "steer": f"a random unit direction at block {reference['layer']}, alpha {reference['alpha']:.4g}"}


def w8a8_cost(int8_handle, reference: dict, exact_codes: bool = True) -> dict:
    """W8A8's cost (issue #50), measured as :func:`cost` with *every* int8 product of ``int8_handle`` on int8
    activations (``Int8Weight.w8a8``: the prompts' passes too, as the loader would use it), then put back off.
    ``on``: whether it is within the default's bound (the loader then turns it on for every product);
    ``kernel``: the build measured.  Only for a model on its own int8 codes (a GGUF's), as int8's default is:
    weights rounded from floats already cost ~0.02."""
    from .int8 import w8a8_identity

    return _rounded_activations_cost(int8_handle, reference, exact_codes, "w8a8", w8a8_identity(),
                                     "int8, one scale per row")


def w8a16_cost(int8_handle, reference: dict, exact_codes: bool = True) -> dict:
    """As :func:`w8a8_cost`, for integer products on int16 activations (``Int8Weight.w8a16``)."""
    from .int8 import w8a16_identity

    return _rounded_activations_cost(int8_handle, reference, exact_codes, "w8a16", w8a16_identity(),
                                     "int16, one scale per row")


def w8a16_unembedding_cost(int8_handle, reference: dict, exact_codes: bool = True) -> dict:
    """As :func:`w8a16_cost`, with integer products on int16 activations for the unembedding alone (the block
    products keep float activations, so the fused CPU step still decodes).  The unembedding is a decode step's
    largest product; on the embedded model its int16 rounding costs far less than every product's."""
    from .int8 import w8a16_identity

    unembedding = int8_handle.arch.int8_unembedding
    if unembedding is None:
        return {"on": False, "kernel": w8a16_identity(), "status": "not measured: the unembedding is not int8"}
    return _rounded_activations_cost(int8_handle, reference, exact_codes, "w8a16", w8a16_identity(),
                                     "int16, one scale per row, the unembedding only", weights=[unembedding])


def _rounded_activations_cost(int8_handle, reference: dict, exact_codes: bool, switch: str, kernel: str | None,
                              activations: str, weights: list | None = None) -> dict:
    """The cost of turning the weights' flag ``switch`` on for ``weights`` (default: every product), measured
    with kernel build ``kernel`` (None: no compiler), then put back off."""
    from .int8 import int8_weights

    name = switch.upper()
    if kernel is None:
        return {"on": False, "kernel": None, "status": f"no {name} kernel here (no C compiler)"}
    if not exact_codes:
        return {"on": False, "kernel": kernel, "status": "not measured: the int8 weights are rounded from floats"}
    weights = int8_weights(int8_handle.model) if weights is None else weights
    for w in weights:
        setattr(w, switch, True)
    try:
        measured = cost(reference, fingerprint(int8_handle, alpha=reference["alpha"]))
    finally:
        for w in weights:
            setattr(w, switch, False)
    measured["kernel"], measured["activations"] = kernel, activations
    measured["status"] = "measured"
    measured["on"] = within_default_bound(measured)
    return measured


def within_default_bound(measured: dict | None) -> bool:
    return (measured is not None and measured["max_abs_dp"] <= DEFAULT_MAX_DP
            and measured["top1_agree"] == measured["prompts"])


def describe(weights: str, measured: dict | None, exact: bool | None = None) -> str:
    """One line for the model line: the precision and, measured, its cost against float32."""
    what = {"float32": "float32 weights", "bfloat16": "bfloat16 weights and arithmetic",
            "int8": "int8 weights (the GGUF's own codes), float32 arithmetic" if exact
            else "int8 weights (rounded per output row), float32 arithmetic"}[weights]
    if weights == "float32" or measured is None:
        return what
    return (f"{what}: vs float32, max |Δp| {measured['max_abs_dp']:.2g}, top-1 {measured['top1_agree']}/"
            f"{measured['prompts']}, max |ΔΔlogit| {measured['max_abs_ddlogit']:.2g}")


def read_cost(path: Path, kernel: str | None = None) -> dict | None:
    """The cost kept at ``path``, or None when there is none or it was measured with another ``kernel``
    (:func:`steer_ui.model.int8.kernel_identity`: a rebuilt kernel sums in another order, so it is measured
    again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "max_abs_dp" not in data:
        return None
    return data if kernel is None or data.get("kernel") == kernel else None


def write_cost(path: Path, measured: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(measured, indent=1))
    tmp.replace(path)
