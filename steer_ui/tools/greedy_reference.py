"""Greedy tokens of the app's decode against a float32 eager reference (issue #51).

The app decodes through its own batch (on CUDA a captured static step, in
the model's dtype, bfloat16 there); the reference is the plainest decode
there is: the float32 model, one full forward per token, no KV cache, the
same steering hook.  Equal tokens for every prompt mean the captured path
and the dtype change nothing a reader sees.

Where the tokens part, the divergence is examined on the prefix both
decodes share: the reference's margin between its token and ours, and the
largest gap between the model's own eager logits and the reference's on
that prefix (what its dtype costs there).  A margin inside that gap is a
near tie that the dtype decided: ``explained``.  A margin larger than it
(or an eager pass of the model itself that disagrees with the decode) points
at the decode, not the dtype.
"""
from __future__ import annotations

import math

import torch

from ..model.generation import encode_prompt
from ..model.hooks import steering


@torch.inference_mode()
def _eager_logits(handle, ids: torch.Tensor, steers) -> torch.Tensor:
    """The last position's logits (vocab,) in float32 from one full forward, steered by ``steers``."""
    with steering(handle, steers):
        out = handle.model(input_ids=ids.to(handle.input_device), use_cache=False, logits_to_keep=1)
    return out.logits[0, -1].float()


def eager_greedy(handle, ids: torch.Tensor, steers, n_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """(tokens, logits of each step): greedy decoding by full forwards, no cache, EOS not special."""
    tokens, logits = [], []
    for _ in range(n_tokens):
        step = _eager_logits(handle, ids, steers)
        token = int(step.argmax())
        tokens.append(token)
        logits.append(step)
        ids = torch.cat([ids, torch.tensor([[token]], dtype=ids.dtype, device=ids.device)], dim=1)
    return tokens, logits


def _bf16_spacing(x: float) -> float:
    """The distance between adjacent bfloat16 numbers at magnitude ``x`` (8 significant bits)."""
    if x == 0.0 or not math.isfinite(x):
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def _divergence(handle, ids, steers, ours: list[int], ref: list[int], ref_logits) -> dict | None:
    """What decided the first token where ``ours`` and ``ref`` part (None where they never do)."""
    at = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    if at is None:
        return None
    prefix = torch.cat([ids, torch.tensor([ref[:at]], dtype=ids.dtype)], dim=1)
    reference_logits = ref_logits[at]
    own_eager = _eager_logits(handle, prefix, steers).to(reference_logits.device)
    ours_token, ref_token = ours[at], ref[at]
    margin = float(reference_logits[ref_token] - reference_logits[ours_token])
    dtype_gap = float((own_eager - reference_logits).abs().max())
    return {
        "at_token": at,
        "ours_token": ours_token,
        "reference_token": ref_token,
        "reference_margin": margin,
        "max_abs_logit_gap_vs_reference": dtype_gap,
        "bf16_spacing_at_logit": _bf16_spacing(float(reference_logits[ref_token])),
        "model_eager_token": int(own_eager.argmax()),
        "explained": margin <= dtype_gap,
    }


def greedy_vs_reference(handle, reference, steer, prompts, n_tokens: int, decode) -> dict:
    """Each prompt's unsteered and steered greedy tokens from ``decode`` against ``reference`` decoded eagerly.

    ``decode(prompt, steers, n_tokens)`` returns the app's side-by-side result
    (its ``unsteered`` and ``steered`` sides); ``reference`` is the float32
    model (``handle`` itself when that is float32).  A sequence counts as
    matched when its tokens are equal or its first divergence is explained
    (see the module's docstring).
    """
    sequences = []
    for prompt in prompts:
        ids = encode_prompt(handle, prompt)
        result = decode(prompt, [steer], n_tokens)
        for side, steers, tokens in (("unsteered", [], result.unsteered.tokens),
                                     ("steered", [steer], result.steered.tokens)):
            ours = [t.token_id for t in tokens][:n_tokens]
            ref, ref_logits = eager_greedy(reference, ids, steers, n_tokens)
            divergence = _divergence(handle, ids, steers, ours, ref, ref_logits)
            sequences.append({"prompt": prompt, "side": side, "equal": divergence is None,
                              "matched_tokens": n_tokens if divergence is None else divergence["at_token"],
                              "divergence": divergence})
    equal = sum(s["equal"] for s in sequences)
    matched = sum(s["equal"] or s["divergence"]["explained"] for s in sequences)
    return {
        "status": "measured",
        "prompts": len(prompts),
        "new_tokens": n_tokens,
        "sequences": len(sequences),
        "equal": equal,
        "equal_or_explained": matched,
        "reference": "float32 weights, eager full forward per token (no cache), the same steering hook",
        "detail": sequences,
    }
