"""Which attention each decoder block has (full or sliding-window), as the decode steps need to know it.

The static step (:mod:`.static_decode`) and the fused CPU step (:mod:`.fused_decode`) build their own masks, so
both must refuse a model whose blocks attend in a way they do not know; this is the one place that says how.
"""
from __future__ import annotations

FULL, SLIDING = "full_attention", "sliding_attention"


def text_config(handle):
    """The text model's config (a multimodal model's language part)."""
    config = handle.model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def layer_types(handle) -> list[str]:
    """Each decoder block's attention kind, as transformers names them (``full_attention``, ``sliding_attention``).

    Models without ``layer_types`` in their config apply one kind to every
    block: sliding where the config sets a window (Mistral, Phi-3), else full.
    """
    config = text_config(handle)
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return list(kinds)[: handle.arch.num_layers]
    kind = SLIDING if getattr(config, "sliding_window", None) else FULL
    return [kind] * handle.arch.num_layers


def kinds_problem(handle) -> str | None:
    """Why the blocks' attention is not the causal full or sliding-window kind a decode step can mask, or None."""
    config = text_config(handle)
    kinds = set(layer_types(handle))
    if not kinds <= {FULL, SLIDING}:
        return f"layer types {sorted(kinds - {FULL, SLIDING})}"
    if SLIDING in kinds and not getattr(config, "sliding_window", None):
        return "sliding-window layers without a window size in the config"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention"
    return None
