"""What L2S reads from the model: P2S targets ``z = h⁺ − h⁻`` at L* and prompt contexts at L′.

Rows are laid out with the prompt left-padded and the completion right-padded,
so every prompt ends at the same column ``P − 1``: the column the context is
read at, and the boundary the steering hooks use between prompt and generated
positions (:func:`encode` is shared with :mod:`.evaluation` for that reason).
Activations come through :func:`steer_ui.model.capture.recording`; the pass
stops after the last block needed, so the blocks above it and the unembedding
are never run.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from ...model.capture import forward, left_pad, length_batches, recording
from ...messages import Said
from ..base import Progress, noop
from .pairs import L2SError, Pair, join_text

TARGET_POSITIONS = ("mean", "last")
# Tokens (positive and negative rows together) in one extraction batch: bounds the activations held at once.
TOKEN_BUDGET = 16384


class _Stop(Exception):
    """Raised once the last needed block has been recorded, so the blocks after it are skipped."""


def _stop(_h: torch.Tensor) -> torch.Tensor:
    raise _Stop


LAYER_WORDS = {"layer": "l2s_word_layer", "context layer": "l2s_word_context_layer"}  # what check_layer names


def check_layer(handle, layer, what: str) -> int:
    n = handle.arch.num_layers
    if not isinstance(layer, (int, np.integer)) or not 0 <= int(layer) < n:
        what = Said(LAYER_WORDS[what]) if what in LAYER_WORDS else what  # said in the page's language
        raise L2SError.from_key("l2s_layer_missing", which=what, layer=layer, last=n - 1)
    return int(layer)


def tokenize(handle, prompts: Sequence[str], completions: Sequence[str] | None) -> tuple[list, list]:
    """(prompt token rows, completion token rows); completions have no special tokens and may not be empty."""
    tok = handle.tokenizer
    p_ids = [tok(p).input_ids for p in prompts]
    if completions is None:
        return p_ids, [[] for _ in prompts]
    c_ids = [tok(c, add_special_tokens=False).input_ids for c in completions]
    for text, c in zip(completions, c_ids):
        if not c:
            raise L2SError.from_key("l2s_no_tokens", text=repr(text))
    return p_ids, c_ids


def encode(handle, prompts: Sequence[str], completions: Sequence[str] | None):
    """Left-padded prompts, right-padded completions: every prompt ends at column P−1.

    Returns (input_ids, attention_mask, position_ids, P, completion lengths).
    """
    return encode_tokens(handle, *tokenize(handle, prompts, completions))


def pad_id(handle) -> int:
    pad = handle.tokenizer.pad_token_id
    return 0 if pad is None else int(pad)


def encode_tokens(handle, p_ids: Sequence[Sequence[int]], c_ids: Sequence[Sequence[int]]):
    """:func:`encode` on token rows."""
    pad = pad_id(handle)
    ids, mask, _ = left_pad(p_ids, pad)
    P = ids.shape[1]
    C = max(len(c) for c in c_ids)
    if C:
        tail = torch.full((len(c_ids), C), pad, dtype=torch.long)
        tail_mask = torch.zeros((len(c_ids), C), dtype=torch.long)
        for r, c in enumerate(c_ids):
            if c:
                tail[r, :len(c)] = torch.as_tensor(list(c), dtype=torch.long)
                tail_mask[r, :len(c)] = 1
        ids, mask = torch.cat([ids, tail], 1), torch.cat([mask, tail_mask], 1)
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)  # real tokens only, across the prompt/completion seam
    return ids, mask, position_ids, P, [len(c) for c in c_ids]


def block_outputs(handle, ids, mask, position_ids, layers: Sequence[int],
                  reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """``reduce(block output)`` (default: all of it, (rows, seq, D)) at ``layers``, float32 on CPU."""
    keep = reduce or (lambda h: h)
    with handle.lock, torch.inference_mode():
        # The second recording's hook on the last layer runs after the first one's has stored it.
        with recording(handle, layers, reduce=lambda h: keep(h).float().cpu()) as store, \
                recording(handle, [max(layers)], reduce=_stop):
            try:
                forward(handle, ids, mask, position_ids)
            except _Stop:
                pass
    return dict(store)


def extract(handle, pairs: Sequence[Pair], layer: int, context_layer: int, position: str = "mean",
            batch_size: int = 32, progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(contexts, targets), each (n, D) float32 on CPU, in the order of ``pairs``.

    ``targets[i] = h⁺ − h⁻`` at block ``layer`` (mean over completion tokens or
    the last one); ``contexts[i]`` = block ``context_layer`` at the last prompt
    token.  Positive and negative rows of a pair go in the same batch, and
    pairs of similar length share one.
    """
    if position not in TARGET_POSITIONS:
        raise L2SError.from_key("l2s_position", positions=TARGET_POSITIONS, position=position)
    layer = check_layer(handle, layer, "layer")
    context_layer = check_layer(handle, context_layer, "context layer")
    progress = progress or noop
    texts = [[join_text(p.prompt, getattr(p, sign)) for p in pairs] for sign in ("positive", "negative")]
    tokens = [tokenize(handle, [t[0] for t in side], [t[1] for t in side]) for side in texts]
    (p_pos, c_pos), (p_neg, c_neg) = tokens
    # What a pair's two rows cost in one batch: the longer prompt plus the longer completion, twice.
    cost = [2 * (max(len(p_pos[i]), len(p_neg[i])) + max(len(c_pos[i]), len(c_neg[i]))) for i in range(len(pairs))]
    contexts: list = [None] * len(pairs)
    targets: list = [None] * len(pairs)
    done = 0
    for chunk in length_batches(cost, max(1, batch_size // 2), TOKEN_BUDGET):
        p_ids = [p_pos[i] for i in chunk] + [p_neg[i] for i in chunk]
        c_ids = [c_pos[i] for i in chunk] + [c_neg[i] for i in chunk]
        ids, mask, pos_ids, P, lengths = encode_tokens(handle, p_ids, c_ids)
        out = block_outputs(handle, ids, mask, pos_ids, [layer, context_layer])
        h = out[layer]
        reads = torch.stack([h[r, P:P + n].mean(0) if position == "mean" else h[r, P + n - 1]
                             for r, n in enumerate(lengths)])
        k = len(chunk)
        for j, i in enumerate(chunk):
            targets[i] = reads[j] - reads[k + j]
            contexts[i] = out[context_layer][j, P - 1]
        done += k
        progress(min(1.0, done / len(pairs)), Said("progress_activations_pairs", done=done, total=len(pairs)))
    return torch.stack(contexts), torch.stack(targets)


def prompt_contexts(handle, prompts: Sequence[str], context_layer: int, batch_size: int = 32) -> torch.Tensor:
    """(n, D): block ``context_layer`` at each prompt's last token, batched with left padding."""
    context_layer = check_layer(handle, context_layer, "context layer")
    p_ids, _ = tokenize(handle, prompts, None)
    out: list = [None] * len(prompts)
    for chunk in length_batches([len(p) for p in p_ids], batch_size, TOKEN_BUDGET):
        ids, mask, pos_ids = left_pad([p_ids[i] for i in chunk], pad_id(handle))
        last = block_outputs(handle, ids, mask, pos_ids, [context_layer], reduce=lambda h: h[:, -1])[context_layer]
        for j, i in enumerate(chunk):
            out[i] = last[j]
    return torch.stack(out)
