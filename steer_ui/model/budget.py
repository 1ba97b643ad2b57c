"""What one request costs the shared model: its tokens, and the working memory a forward pass over them needs.

Characters are a poor measure of cost (one character such as U+E0100 is four byte tokens on Gemma), so
every text a visitor sends is counted in tokens of the loaded model's tokenizer, and a request's working
memory is estimated from the model's shape before any work starts:

    request_bytes = rows · tokens · (2 · layers · kv_heads · head_dim · b)        the KV cache kept
                  + rows · heads · tokens² · 4                                   one block's attention scores
                  + rows · tokens · (4 · hidden + 3 · intermediate) · b           one block's activations
                  + rows · vocab · 4 · 5                                         the last position's logits

with b the bytes of the model's dtype; ``rows`` is the batch rows the request runs (three for a
side-by-side generation: unsteered, steered, counterfactual; one per α for a sweep).  The service
compares it with ``policy.max_request_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """What sets the size of a decoder's key/value cache."""

    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int | None

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("layers", "attention_heads", "kv_heads", "head_dim", "sliding_window")}
        d["sliding_layers"] = sum(1 for t in self.layer_types if t == "sliding_attention")
        d["queries_per_kv_head"] = self.attention_heads // max(self.kv_heads, 1)
        return d


def kv_layout(config) -> KVLayout:
    """Layers, heads, KV heads, head dim and per-layer attention type from a transformers config."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        layers = int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
    except (AttributeError, TypeError):
        raise ValueError(f"cannot read layers / heads / hidden size from the {type(cfg).__name__}") from None
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    types = tuple(getattr(cfg, "layer_types", None) or ("full_attention",) * layers)
    window = getattr(cfg, "sliding_window", None)
    if "sliding_attention" not in types:
        window = None
    return KVLayout(layers=layers, attention_heads=heads, kv_heads=kv_heads, head_dim=head_dim, layer_types=types,
                    sliding_window=int(window) if window else None)


@dataclass(frozen=True)
class Cost:
    """A request's size: its longest text in tokens, the rows it runs, the working memory that needs, and the
    part of it a generation keeps while it decodes (its KV cache; the rest is one forward pass's scratch)."""

    tokens: int
    rows: int
    bytes: int
    kv: int = 0


def intermediate_size(config) -> int:
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    return int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * hidden)


def _layout(handle) -> KVLayout:
    layout = handle.__dict__.get("_kv_layout")
    if layout is None:
        layout = handle.__dict__["_kv_layout"] = kv_layout(handle.model.config)
    return layout


def kv_bytes(handle, tokens: int, rows: int = 1) -> int:
    """The KV cache of ``rows`` sequences of ``tokens`` positions: what a decoding request keeps."""
    layout = _layout(handle)
    b = torch.empty((), dtype=handle.dtype).element_size()
    return int(rows * tokens * 2 * layout.layers * layout.kv_heads * layout.head_dim * b)


def request_bytes(handle, tokens: int, rows: int = 1) -> int:
    """The working memory (bytes) of ``rows`` sequences of ``tokens`` positions through ``handle``'s model."""
    layout = _layout(handle)
    b = torch.empty((), dtype=handle.dtype).element_size()
    hidden, vocab = handle.arch.hidden_size, handle.arch.vocab_size
    kv = kv_bytes(handle, tokens, rows)
    scores = rows * layout.attention_heads * tokens * tokens * 4
    activations = rows * tokens * (4 * hidden + 3 * intermediate_size(handle.model.config)) * b
    logits = rows * vocab * 4 * 5  # float32 logits and the few vocabulary-sized copies the views make
    return int(kv + scores + activations + logits)


def count_tokens(handle, text: str) -> int:
    """Tokens ``text`` becomes as a prompt (special tokens such as BOS included)."""
    return len(handle.tokenizer(text).input_ids)


def cost(handle, texts, rows: int = 1, extra_tokens: int = 0) -> Cost:
    """The cost of running ``rows`` rows over the longest of ``texts`` plus ``extra_tokens`` (new tokens)."""
    tokens = max((count_tokens(handle, t) for t in texts), default=0)
    return Cost(tokens=tokens, rows=rows, bytes=request_bytes(handle, tokens + extra_tokens, rows),
                kv=kv_bytes(handle, tokens + extra_tokens, rows))
