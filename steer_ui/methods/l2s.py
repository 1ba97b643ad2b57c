"""L2S, Learning to Steer: input-dependent steering vectors (Parekh et al., NeurIPS 2025).

A mean steering vector pushes every input the same way.  L2S instead
*predicts* a vector for each input from the input itself:

* **P2S target** (prompt-to-steer, the oracle).  For a contrastive pair
  ``(prompt X, positive, negative)`` the target at layer L* is
  ``z_X = h⁺ − h⁻``, the difference of the residual stream at the output of
  block L* for ``X + positive`` and ``X + negative``, read either as the mean
  over the completion tokens (``position="mean"``, the default) or at the
  last completion token (``position="last"``).  The mean suits short
  completions whose every token carries the answer (names, labels, one word);
  the last token suits long completions whose meaning is only settled at
  their end (sentences, CAA answers ending in "(A)").
* **Context** ``h_{X,L′}``: the residual at block L′ of the last prompt token,
  the one the model's first answer token is predicted from.
* **g**, a two-layer MLP ``Linear(D→H) → tanh → Linear(H→D)``, maps the
  context to the target.  It is fitted to the residual ``z − z̄`` (inputs and
  targets standardised), so an untrained g *is* Mean-S and early stopping on a
  validation split can only keep an epoch that predicts validation targets at
  least as well as the mean does.
* **Mean-S**: ``z̄``, the mean target over the training inputs; stored as the
  vector's ``directions[L*]`` so exports to tools that know nothing of L2S
  carry Mean-S.

At inference g runs once per prompt, on the prompt's own activation at L′,
through the core engine's input-dependent hook (``Steer(fn=g,
context_layer=L′)``), and ``α · g(h_{X,L′})`` is added at the output of block
L*.  By default at *all* positions: the first answer token is predicted at the
last prompt position, which the core counts as a prompt position, so steering
``generated`` positions only would leave the first answer token unsteered.
Steering prompt positions needs L′ <= L* (the context must exist before the
steered block runs); with ``positions="generated"`` any L′ works.

Units.  Raw α = 1 adds the predicted target itself.  Relative α is
``α · n_{L*} / ‖z‖_avg``: g's output is *not* normalised per input (its norm
is part of what it predicts) but divided by one constant, the mean norm of the
training targets, so α = 1 makes the average predicted vector as long as a
typical residual at L* while inputs keep their different lengths.  Mean-S and
P2S use the same factor, so one α means the same thing for all three sources.

Storage (native safetensors): ``extras`` hold ``l2s.encoder.weight``,
``l2s.encoder.bias``, ``l2s.decoder.weight``, ``l2s.decoder.bias``,
``l2s.input_mean``, ``l2s.input_scale``, ``l2s.target_mean``,
``l2s.target_scale``; ``hyperparameters`` hold the sizes, activation, L*, L′,
the target position and the training settings.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..model.hooks import Steer, SteeringError, StepState, steering
from ..vector import SteeringVector, VectorError

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
TARGET_POSITIONS = ("mean", "last")
SOURCES = ("none", "mean", "l2s", "p2s")
EXTRA = "l2s."
Progress = Callable[[float, str], None]

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "epochs": 400,  # upper bound; early stopping usually ends far sooner
    "patience": 40,
    "lr": 1e-3,
    "weight_decay": 1e-4,
    "batch_size": 32,
    "cos_weight": 0.1,  # weight of the (1 − cosine) term added to the MSE
    "activation": "tanh",
    "test_fraction": 0.2,  # held out by group for the report; never trained on
    "val_fraction": 0.2,  # of the training groups, for early stopping
    "eval_alpha": 0.5,  # raw α of the held-out steering comparison (chosen on the validation split)
    "eval_limit": None,  # score steering on at most this many held-out pairs (cosines use all of them)
    "steer_positions": "all",
    "extract_batch": 32,
}


class L2SError(ValueError):
    """An L2S request that cannot be carried out (bad data, layers, vector)."""


def _noop(_f: float, _m: str) -> None:
    pass


def default_hidden(hidden_size: int) -> int:
    """H scaled to the model width: D/4 clamped to 100..1024 (100 for tiny models, 160 for Gemma 3 270M)."""
    return int(min(1024, max(100, hidden_size // 4)))


# ======================================================================= data
@dataclass
class Pair:
    prompt: str
    positive: str
    negative: str
    group: str = ""


def as_pairs(dataset) -> list[Pair]:
    """Contrastive pairs from a ``Dataset`` (pairs, or labelled kinds paired within groups), a DataFrame with
    prompt/positive/negative columns, or a list of ``(prompt, positive, negative[, group])`` tuples / dicts."""
    frame = _pairs_frame(dataset)
    pairs = []
    for i, row in enumerate(frame.itertuples(index=False), start=1):
        prompt, pos, neg = row.prompt, row.positive, row.negative
        for col, value in (("prompt", prompt), ("positive", pos), ("negative", neg)):
            if not isinstance(value, str):
                raise L2SError(f"pair {i}: column '{col}' must be text, found {type(value).__name__}")
        if not prompt.strip():
            raise L2SError(f"pair {i}: L2S needs a prompt (the input it predicts a vector from); the prompt is empty")
        if not pos.strip() or not neg.strip():
            raise L2SError(f"pair {i}: empty positive or negative completion")
        if pos == neg:
            raise L2SError(f"pair {i}: positive and negative completions are identical ('{pos}')")
        group = str(getattr(row, "group", "") or prompt)
        pairs.append(Pair(prompt, pos, neg, group))
    if not pairs:
        raise L2SError("no contrastive pairs given")
    return pairs


def _pairs_frame(dataset) -> pd.DataFrame:
    kind = getattr(dataset, "kind", None)
    if kind is not None:  # steer_ui.data.Dataset
        if kind != "pairs":
            dataset = dataset.as_pairs()
        return dataset.frame
    if isinstance(dataset, pd.DataFrame):
        missing = [c for c in ("prompt", "positive", "negative") if c not in dataset.columns]
        if missing:
            raise L2SError(f"pairs need columns prompt, positive, negative; missing {missing} "
                           f"(found {list(dataset.columns)})")
        return dataset
    rows = []
    for i, item in enumerate(dataset, start=1):
        if isinstance(item, Pair):
            rows.append(vars(item))
        elif isinstance(item, dict):
            rows.append({k: item.get(k) for k in ("prompt", "positive", "negative", "group")})
        elif isinstance(item, (tuple, list)) and len(item) in (3, 4):
            rows.append(dict(zip(("prompt", "positive", "negative", "group"), item)))
        else:
            raise L2SError(f"pair {i}: expected (prompt, positive, negative[, group]), found {item!r:.80}")
    return pd.DataFrame(rows, columns=["prompt", "positive", "negative", "group"])


def join_text(prompt: str, completion: str) -> tuple[str, str]:
    """Prompt and completion as they are concatenated: a space is inserted when neither side has one."""
    if prompt and not prompt[-1].isspace() and completion and not completion[0].isspace():
        completion = " " + completion
    return prompt, completion


def split_groups(groups: Sequence[str], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices (kept, held out): whole groups, seeded; at least one group on each side."""
    names = sorted(set(groups))
    if len(names) < 2:
        raise L2SError(f"a split by group needs at least two groups, found {len(names)}")
    order = np.random.default_rng(seed).permutation(len(names))
    n_out = min(max(int(round(fraction * len(names))), 1), len(names) - 1)
    out_groups = {names[j] for j in order[:n_out]}
    kept = [i for i, g in enumerate(groups) if g not in out_groups]
    held = [i for i, g in enumerate(groups) if g in out_groups]
    return kept, held


# ================================================================ activations
class _Stop(Exception):
    """Raised by the last needed hook so blocks after it (and the unembedding) are skipped."""


def _encode(handle, prompts: Sequence[str], completions: Sequence[str] | None):
    """Left-padded prompts, right-padded completions: every prompt ends at column P−1.

    Returns (input_ids, attention_mask, position_ids, P, completion lengths).
    """
    tok = handle.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    p_ids = [tok(p).input_ids for p in prompts]
    if completions is None:
        c_ids = [[] for _ in prompts]
    else:
        c_ids = [tok(c, add_special_tokens=False).input_ids for c in completions]
    for i, c in enumerate(c_ids):
        if completions is not None and not c:
            raise L2SError(f"completion {completions[i]!r} tokenises to nothing")
    P = max(len(p) for p in p_ids)
    C = max(len(c) for c in c_ids)
    rows = len(p_ids)
    ids = torch.full((rows, P + C), pad, dtype=torch.long)
    mask = torch.zeros((rows, P + C), dtype=torch.long)
    for r, (p, c) in enumerate(zip(p_ids, c_ids)):
        ids[r, P - len(p):P] = torch.tensor(p)
        mask[r, P - len(p):P] = 1
        if c:
            ids[r, P:P + len(c)] = torch.tensor(c)
            mask[r, P:P + len(c)] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, position_ids, P, [len(c) for c in c_ids]


def _forward_collect(handle, ids, mask, position_ids, layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """Block outputs (rows, seq, D) at ``layers``, stopping after the last one."""
    arch = handle.arch
    outputs: dict[int, torch.Tensor] = {}
    last = max(layers)

    def grab(i):
        def hook(_m, _inp, out):
            outputs[i] = (out[0] if isinstance(out, tuple) else out).detach().float().cpu()
            if i == last:
                raise _Stop
        return hook

    dev = handle.input_device
    with handle.lock, torch.inference_mode(), one_thread(dev):
        removers = [arch.layers[i].register_forward_hook(grab(i)) for i in sorted(set(layers))]
        try:
            handle.model.base_model(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                    position_ids=position_ids.to(dev), use_cache=False)
        except _Stop:
            pass
        finally:
            for r in removers:
                r.remove()
    return outputs


def _check_layer(handle, layer: int, what: str) -> int:
    n = handle.arch.num_layers
    if not isinstance(layer, (int, np.integer)) or not 0 <= int(layer) < n:
        raise L2SError(f"{what} {layer} does not exist: the model has layers 0..{n - 1}")
    return int(layer)


def extract(handle, pairs: Sequence[Pair], layer: int, context_layer: int, position: str = "mean",
            batch_size: int = 32, progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(contexts, targets), each (n, D) float32 on CPU.

    ``targets[i] = h⁺ − h⁻`` at block ``layer`` (mean over completion tokens or
    the last one); ``contexts[i]`` = block ``context_layer`` at the last prompt
    token.  Positive and negative rows of a pair go in the same batch.
    """
    if position not in TARGET_POSITIONS:
        raise L2SError(f"position must be one of {TARGET_POSITIONS}, got '{position}'")
    layer = _check_layer(handle, layer, "layer")
    context_layer = _check_layer(handle, context_layer, "context layer")
    progress = progress or _noop
    contexts, targets = [], []
    half = max(1, batch_size // 2)
    for start in range(0, len(pairs), half):
        chunk = pairs[start:start + half]
        prompts, comps = [], []
        for sign in ("positive", "negative"):
            for p in chunk:
                prompt, comp = join_text(p.prompt, getattr(p, sign))
                prompts.append(prompt)
                comps.append(comp)
        ids, mask, pos_ids, P, lengths = _encode(handle, prompts, comps)
        out = _forward_collect(handle, ids, mask, pos_ids, [layer, context_layer])
        h = out[layer]
        reads = []
        for r, n in enumerate(lengths):
            span = h[r, P:P + n]
            reads.append(span.mean(0) if position == "mean" else span[-1])
        reads = torch.stack(reads)
        k = len(chunk)
        targets.append(reads[:k] - reads[k:])
        contexts.append(out[context_layer][:k, P - 1])
        progress(min(1.0, (start + k) / len(pairs)), f"activations {start + k}/{len(pairs)}")
    return torch.cat(contexts), torch.cat(targets)


def prompt_contexts(handle, prompts: Sequence[str], context_layer: int, batch_size: int = 32) -> torch.Tensor:
    """(n, D): block ``context_layer`` at each prompt's last token, batched with left padding."""
    context_layer = _check_layer(handle, context_layer, "context layer")
    out = []
    for start in range(0, len(prompts), batch_size):
        ids, mask, pos_ids, P, _ = _encode(handle, prompts[start:start + batch_size], None)
        out.append(_forward_collect(handle, ids, mask, pos_ids, [context_layer])[context_layer][:, P - 1])
    return torch.cat(out)


# ===================================================================== the MLP
class SteeringMLP(nn.Module):
    """g(x) = z̄ + s_z · W₂ act(W₁ (x − μ) / s_x + b₁) + b₂: predicts a target from a context.

    μ, s_x standardise the context (s_x one scalar: the RMS of centred inputs);
    z̄, s_z (mean target, RMS of centred targets) put the outputs back in model
    units, so the trainable part only learns the input-dependent residual.
    """

    def __init__(self, d_in: int, hidden: int, d_out: int, activation: str = "tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise L2SError(f"activation must be one of {tuple(ACTIVATIONS)}, got '{activation}'")
        self.activation = activation
        self.encoder = nn.Linear(d_in, hidden)
        self.act = ACTIVATIONS[activation]()
        self.decoder = nn.Linear(hidden, d_out)
        self.register_buffer("input_mean", torch.zeros(d_in))
        self.register_buffer("input_scale", torch.ones(1))
        self.register_buffer("target_mean", torch.zeros(d_out))
        self.register_buffer("target_scale", torch.ones(1))

    @property
    def sizes(self) -> list[int]:
        return [self.encoder.in_features, self.encoder.out_features, self.decoder.out_features]

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """The standardised input-dependent part (what training fits)."""
        return self.decoder(self.act(self.encoder((x - self.input_mean) / self.input_scale)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.target_mean + self.target_scale * self.residual(x)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {EXTRA + k: v.detach().cpu().float().contiguous() for k, v in self.state_dict().items()}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], activation: str) -> "SteeringMLP":
        state = {k[len(EXTRA):]: v for k, v in tensors.items() if k.startswith(EXTRA)}
        needed = ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias", "input_mean", "input_scale",
                  "target_mean", "target_scale")
        missing = [k for k in needed if k not in state]
        if missing:
            raise VectorError(f"L2S vector is missing the MLP tensors {[EXTRA + k for k in missing]}")
        hidden, d_in = state["encoder.weight"].shape
        d_out = state["decoder.weight"].shape[0]
        if state["decoder.weight"].shape[1] != hidden:
            raise VectorError(f"L2S decoder has {state['decoder.weight'].shape[1]} inputs but the encoder has "
                              f"{hidden} outputs")
        net = cls(int(d_in), int(hidden), int(d_out), activation)
        net.load_state_dict({k: state[k] for k in needed})
        net.eval()
        net.requires_grad_(False)
        return net


@dataclass
class FitReport:
    epochs_run: int
    best_epoch: int  # 0 = the untrained net (Mean-S) was best
    best_val_loss: float
    stopped_early: bool
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)  # index 0: before training
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"epochs_run": self.epochs_run, "best_epoch": self.best_epoch, "best_val_loss": self.best_val_loss,
                "stopped_early": self.stopped_early, "seconds": round(self.seconds, 3),
                "train_loss": [round(x, 6) for x in self.train_loss], "val_loss": [round(x, 6) for x in self.val_loss]}


def _loss(pred: torch.Tensor, target: torch.Tensor, cos_weight: float) -> torch.Tensor:
    """MSE of standardised residuals + cos_weight · (1 − cosine) of the full vectors (in standardised units)."""
    mse = (pred - target).pow(2).mean()
    if not cos_weight:
        return mse
    return mse + cos_weight * (1 - nn.functional.cosine_similarity(pred, target, dim=-1, eps=1e-8)).mean()


def fit_mlp(contexts: torch.Tensor, targets: torch.Tensor, train_idx: Sequence[int], val_idx: Sequence[int],
            hidden: int, activation: str = "tanh", epochs: int = 400, patience: int = 40, lr: float = 1e-3,
            weight_decay: float = 1e-4, batch_size: int = 32, cos_weight: float = 0.1, seed: int = 0,
            progress: Progress | None = None) -> tuple[SteeringMLP, FitReport]:
    """Fit g on ``train_idx``; keep the epoch with the lowest validation loss; stop after ``patience`` epochs
    without improvement.  Standardisation statistics come from the training rows only."""
    progress = progress or _noop
    started = time.perf_counter()
    train_idx, val_idx = list(train_idx), list(val_idx)
    if len(train_idx) < 2:
        raise L2SError(f"L2S needs at least 2 training pairs, got {len(train_idx)}")
    if not val_idx:
        raise L2SError("L2S early stopping needs at least one validation pair")
    x = contexts.float()
    z = targets.float()
    gen = torch.Generator().manual_seed(int(seed))
    torch.manual_seed(int(seed))
    net = SteeringMLP(x.shape[1], int(hidden), z.shape[1], activation)
    xt, zt = x[train_idx], z[train_idx]
    with torch.no_grad():
        net.input_mean.copy_(xt.mean(0))
        net.input_scale.fill_(float((xt - xt.mean(0)).pow(2).mean().sqrt().clamp_min(1e-6)))
        net.target_mean.copy_(zt.mean(0))
        net.target_scale.fill_(float((zt - zt.mean(0)).pow(2).mean().sqrt().clamp_min(1e-6)))
        # Start exactly at Mean-S: a zero decoder makes the residual vanish.
        net.decoder.weight.zero_()
        net.decoder.bias.zero_()
    # Standardised residual targets and the standardised Mean-S offset (for the cosine term on whole vectors).
    offset = (net.target_mean / net.target_scale).detach()
    r_all = (z - net.target_mean) / net.target_scale
    with one_thread():
        return _fit_loop(net, x, r_all, offset, train_idx, val_idx, epochs, patience, lr, weight_decay, batch_size,
                         cos_weight, gen, progress, started)


@contextmanager
def one_thread(device=None):
    """Run CPU work on one intra-op thread.

    The MLP's hundreds of tiny products and the small-batch forward passes
    here spend most of their time in threads spin-waiting for each other on
    a busy CPU: measured on the shared 2-core machine, one thread took 1/6 of
    the CPU time for a fit and 1/5 of the wall time for an activation pass.
    The setting is process-wide, so it is restored on exit; GPU work is left
    alone.
    """
    if device is not None and torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _fit_loop(net, x, r_all, offset, train_idx, val_idx, epochs, patience, lr, weight_decay, batch_size, cos_weight,
              gen, progress, started):
    def val_loss() -> float:
        with torch.no_grad():
            return float(_loss(net.residual(x[val_idx]) + offset, r_all[val_idx] + offset, cos_weight))

    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    best = val_loss()
    report = FitReport(epochs_run=0, best_epoch=0, best_val_loss=best, stopped_early=False, val_loss=[best])
    best_state = {k: v.clone() for k, v in net.state_dict().items()}
    bs = max(1, min(int(batch_size), len(train_idx)))
    tidx = torch.tensor(train_idx)
    for epoch in range(1, int(epochs) + 1):
        net.train()
        order = tidx[torch.randperm(len(tidx), generator=gen)]
        total = 0.0
        for start in range(0, len(order), bs):
            b = order[start:start + bs]
            loss = _loss(net.residual(x[b]) + offset, r_all[b] + offset, cos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(b)
        net.eval()
        report.train_loss.append(total / len(order))
        v = val_loss()
        report.val_loss.append(v)
        report.epochs_run = epoch
        if v < best - 1e-7:
            best, report.best_epoch = v, epoch
            best_state = {k: t.clone() for k, t in net.state_dict().items()}
        if epoch % 10 == 0:
            progress(epoch / epochs, f"epoch {epoch}: train {report.train_loss[-1]:.4f}, val {v:.4f}")
        if epoch - report.best_epoch >= patience:
            report.stopped_early = epoch < epochs
            break
    net.load_state_dict(best_state)
    net.eval()
    net.requires_grad_(False)
    report.best_val_loss = best
    report.seconds = time.perf_counter() - started
    return net, report


# ============================================================ vector <-> MLP
def mlp_of(vector: SteeringVector) -> SteeringMLP:
    """The MLP stored in an L2S vector's extras (rebuilt per call: microseconds, and never stale)."""
    if vector.method != METHOD:
        raise L2SError(f"vector '{vector.name or vector.method}' is a {vector.method} vector, not an L2S one")
    net = SteeringMLP.from_tensors(vector.extras, vector.hyperparameters.get("activation", "tanh"))
    if net.sizes[0] != vector.hidden_size or net.sizes[2] != vector.hidden_size:
        raise VectorError(f"L2S MLP maps {net.sizes[0]} -> {net.sizes[2]} values but the vector's hidden size is "
                          f"{vector.hidden_size}")
    return net


def layers_of(vector: SteeringVector) -> tuple[int, int]:
    """(L*, L′) of an L2S vector."""
    hp = vector.hyperparameters
    layer = int(hp.get("layer", vector.layer))
    return layer, int(hp.get("context_layer", layer))


def unit_scale(handle, vector: SteeringVector, relative: bool) -> float:
    """Raw multiplier per unit of α: 1 in raw units, n_{L*} / mean‖z‖ in relative units."""
    if not relative:
        return 1.0
    norm = float(vector.hyperparameters.get("target_norm_mean") or 0.0)
    if not norm > 0:
        norm = float(mlp_of(vector).target_mean.norm())
    if not norm > 0:
        raise SteeringError("this L2S vector has no target scale; relative units are undefined")
    return handle.relative_scale(layers_of(vector)[0]) / norm


def _check_positions(layer: int, context_layer: int, positions: str) -> None:
    if positions in ("all", "prompt") and context_layer > layer:
        raise SteeringError(
            f"context layer {context_layer} comes after steered layer {layer}: steering prompt positions needs the "
            f"context first; use positions='generated' or a context layer <= {layer}")


def _g(net: SteeringMLP) -> Callable[[torch.Tensor], torch.Tensor]:
    def g(context: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            m = net.to(context.device)
            return m(context.float())
    return g


def build_steers(handle, vector: SteeringVector, alpha: float, relative: bool = False,
                 positions: str | None = None) -> list[Steer]:
    """One input-dependent Steer: ``fn=g`` reads the prompt's last token at L′, adds α·g(·) at L*."""
    from ..steering import check_alpha, check_compatible

    alpha = check_alpha(alpha)
    check_compatible(handle, vector)
    net = mlp_of(vector)
    layer, context_layer = layers_of(vector)
    _check_layer(handle, context_layer, "context layer")
    positions = positions or vector.positions
    _check_positions(layer, context_layer, positions)
    return [Steer(layer=layer, fn=_g(net), context_layer=context_layer,
                  alpha=alpha * unit_scale(handle, vector, relative), positions=positions)]


def mean_steers(handle, vector: SteeringVector, alpha: float, relative: bool = False,
                positions: str | None = None) -> list[Steer]:
    """Mean-S: the same vector z̄ for every input, in the same units as :func:`build_steers`."""
    from ..steering import check_alpha

    layer, _ = layers_of(vector)
    return [Steer(layer=layer, vector=vector.directions[layer],
                  alpha=check_alpha(alpha) * unit_scale(handle, vector, relative),
                  positions=positions or vector.positions)]


def p2s_vector(handle, vector: SteeringVector, prompt: str, positive: str, negative: str) -> torch.Tensor:
    """The oracle target z_X = h⁺ − h⁻ for one pair, at the vector's layer and target position."""
    layer, context_layer = layers_of(vector)
    position = vector.hyperparameters.get("position", "mean")
    _, z = extract(handle, [Pair(prompt, positive, negative)], layer, context_layer, position)
    return z[0]


def steer_sources(handle, vector: SteeringVector, alpha: float, prompt: str | None = None,
                  positive: str | None = None, negative: str | None = None, relative: bool = False,
                  positions: str | None = None) -> dict[str, list[Steer]]:
    """Steers for each source the UI can compare: ``mean`` (Mean-S), ``l2s`` (g), and ``p2s`` (the oracle, only
    when the pair's ``prompt``, ``positive`` and ``negative`` are given).  Same α units for all."""
    out = {"mean": mean_steers(handle, vector, alpha, relative, positions),
           "l2s": build_steers(handle, vector, alpha, relative, positions)}
    if prompt is not None and positive and negative:
        layer, _ = layers_of(vector)
        z = p2s_vector(handle, vector, prompt, positive, negative)
        from ..steering import check_alpha

        out["p2s"] = [Steer(layer=layer, vector=z, alpha=check_alpha(alpha) * unit_scale(handle, vector, relative),
                            positions=positions or vector.positions)]
    return out


def predict(handle, vector: SteeringVector, prompts: Sequence[str]) -> torch.Tensor:
    """g(h_{X,L′}) for each prompt: (n, D), raw units (α = 1)."""
    _, context_layer = layers_of(vector)
    with torch.no_grad():
        return mlp_of(vector)(prompt_contexts(handle, list(prompts), context_layer))


def describe(handle, vector: SteeringVector, prompts: Sequence[str]) -> pd.DataFrame:
    """Per prompt: the predicted vector's norm, its norm relative to Mean-S, and its cosine to Mean-S —
    how input-dependent the steering really is."""
    pred = predict(handle, vector, prompts)
    layer, _ = layers_of(vector)
    mean = vector.directions[layer]
    return pd.DataFrame({
        "prompt": list(prompts),
        "predicted_norm": pred.norm(dim=-1).tolist(),
        "norm_over_mean": (pred.norm(dim=-1) / mean.norm().clamp_min(1e-12)).tolist(),
        "cosine_to_mean": nn.functional.cosine_similarity(pred, mean.unsqueeze(0), dim=-1).tolist(),
    })


# ================================================================ evaluation
def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)


def _mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).pow(2).mean(-1)


def steering_effect(handle, pairs: Sequence[Pair], vectors: dict[str, torch.Tensor], layer: int, context_layer: int,
                    alpha: float, positions: str = "all", batch_size: int = 16) -> pd.DataFrame:
    """Per pair and source: teacher-forced log p(positive), log p(negative), their margin, and whether the greedy
    continuation starts with the positive completion, with ``alpha · vectors[source][i]`` added at ``layer``.

    ``vectors``: source name -> (n, D) per-pair vectors (``none`` is implied, α = 0).  Every source goes
    through the core input-dependent hook (one ``Steer(fn=...)`` whose fn returns each row's vector), so this
    measures exactly what generation would do.  The greedy check is exact: a teacher-forced pass on
    prompt+positive predicts each positive token at the next position iff greedy decoding would produce it.
    """
    _check_positions(layer, context_layer, positions)
    names = ["none"] + [s for s in vectors if s != "none"]
    D = handle.arch.hidden_size
    jobs = []  # (pair index, source, sign)
    for i in range(len(pairs)):
        for s in names:
            for sign in ("positive", "negative"):
                jobs.append((i, s, sign))
    # Rows of similar length share a batch, so little compute goes to padding.
    jobs.sort(key=lambda j: (len(pairs[j[0]].prompt), len(getattr(pairs[j[0]], j[2]))))
    results = {}
    arch = handle.arch
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        prompts, comps, rows_vec, rows_alpha = [], [], [], []
        for i, s, sign in chunk:
            p, c = join_text(pairs[i].prompt, getattr(pairs[i], sign))
            prompts.append(p)
            comps.append(c)
            rows_vec.append(torch.zeros(D) if s == "none" else vectors[s][i].float())
            rows_alpha.append(0.0 if s == "none" else float(alpha))
        ids, mask, pos_ids, P, lengths = _encode(handle, prompts, comps)
        table = torch.stack(rows_vec)
        steer = Steer(layer=layer, fn=lambda _ctx, t=table: t.to(_ctx.device), context_layer=context_layer,
                      alpha=torch.tensor(rows_alpha), positions=positions)
        dev = handle.input_device
        state = StepState(prompt_len=P)
        with torch.inference_mode(), one_thread(dev), steering(handle, [steer], state):
            out = handle.model.base_model(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                          position_ids=pos_ids.to(dev), use_cache=False)
        hidden = out.last_hidden_state
        # One unembedding call per batch: per-row calls would stream the (vocab × D) matrix once per row.
        where = [(r, P - 1 + t) for r, n in enumerate(lengths) for t in range(n)]
        rows_at = torch.tensor([r for r, _ in where])
        cols_at = torch.tensor([c for _, c in where])
        logits = arch.logits(hidden[rows_at.to(hidden.device), cols_at.to(hidden.device)]).cpu()
        wanted = ids[rows_at, cols_at + 1]
        logp = logits.log_softmax(-1).gather(1, wanted.unsqueeze(1)).squeeze(1)
        hit = logits.argmax(-1) == wanted
        for r, (i, s, sign) in enumerate(chunk):
            sel = rows_at == r
            results[(i, s, sign)] = (float(logp[sel].sum()), bool(hit[sel].all()))
    rows = []
    for i in range(len(pairs)):
        for s in names:
            lp_pos, greedy_pos = results[(i, s, "positive")]
            lp_neg, _ = results[(i, s, "negative")]
            rows.append({"pair": i, "group": pairs[i].group, "source": s, "logp_positive": lp_pos,
                         "logp_negative": lp_neg, "margin": lp_pos - lp_neg, "greedy_positive": greedy_pos})
    frame = pd.DataFrame(rows)
    base = frame[frame.source == "none"].set_index("pair")["margin"]
    frame["margin_gain"] = frame["margin"] - frame["pair"].map(base)
    return frame


def compare_heldout(handle, vector: SteeringVector, pairs: Sequence[Pair], alpha: float | None = None,
                    relative: bool = False, contexts: torch.Tensor | None = None,
                    targets: torch.Tensor | None = None, limit: int | None = None) -> dict:
    """The held-out table: cosine / MSE of L2S and Mean-S predictions to the true targets, the margin gain and
    greedy-positive rate per source (none, Mean-S, L2S, P2S) at ``alpha``, and per-input predicted norms.

    ``limit``: measure steering on the first ``limit`` pairs only (it costs 8 forward rows per pair); the
    cosines and MSEs always use every pair."""
    layer, context_layer = layers_of(vector)
    hp = vector.hyperparameters
    position = hp.get("position", "mean")
    alpha = float(hp.get("eval_alpha", DEFAULTS["eval_alpha"]) if alpha is None else alpha)
    if contexts is None or targets is None:
        contexts, targets = extract(handle, pairs, layer, context_layer, position)
    net = mlp_of(vector)
    with torch.no_grad():
        pred = net(contexts)
    mean = vector.directions[layer].unsqueeze(0).expand_as(targets)
    raw_alpha = alpha * unit_scale(handle, vector, relative)
    k = len(pairs) if not limit else min(int(limit), len(pairs))
    effect = steering_effect(handle, pairs[:k], {"mean": mean[:k], "l2s": pred[:k], "p2s": targets[:k]}, layer,
                             context_layer, raw_alpha, positions=vector.positions)
    by_source = effect.groupby("source", sort=False)
    l2s_cos, mean_cos = _cos(pred, targets), _cos(mean, targets)
    per_input = pd.DataFrame({
        "group": [p.group for p in pairs],
        "prompt": [p.prompt for p in pairs],
        "target_norm": targets.norm(dim=-1).tolist(),
        "predicted_norm": pred.norm(dim=-1).tolist(),
        "cosine_to_mean": _cos(pred, mean).tolist(),
        "l2s_cosine": l2s_cos.tolist(),
        "mean_cosine": mean_cos.tolist(),
    })
    margins = by_source["margin"].mean()
    gains = by_source["margin_gain"].mean()
    greedy = by_source["greedy_positive"].mean()
    return {
        "n": len(pairs),
        "n_steered": k,
        "alpha": alpha,
        "relative": relative,
        "raw_alpha": raw_alpha,
        "l2s_cosine": float(l2s_cos.mean()),
        "mean_cosine": float(mean_cos.mean()),
        "l2s_mse": float(_mse(pred, targets).mean()),
        "mean_mse": float(_mse(mean, targets).mean()),
        "margin": {s: float(v) for s, v in margins.items()},
        "margin_gain": {s: float(v) for s, v in gains.items() if s != "none"},
        "positive_rate": {s: float(v) for s, v in greedy.items()},
        "predicted_norm_mean": float(pred.norm(dim=-1).mean()),
        "predicted_norm_std": float(pred.norm(dim=-1).std()) if len(pairs) > 1 else 0.0,
        "cosine_to_mean_mean": float(_cos(pred, mean).mean()),
        "per_input": per_input,
        "per_pair_effect": effect,
    }


def table(result: dict) -> pd.DataFrame:
    """The held-out comparison as one frame, one row per source (for the README and the UI)."""
    return pd.DataFrame(table_rows(result))


def table_rows(result: dict) -> list[dict]:
    """The held-out comparison as JSON-safe records (None where a number does not apply)."""
    rows = []
    for s in SOURCES:
        if s not in result["positive_rate"]:
            continue
        rows.append({
            "source": {"none": "no steering", "mean": "Mean-S", "l2s": "L2S", "p2s": "P2S (oracle)"}[s],
            "cosine_to_target": {"mean": result["mean_cosine"], "l2s": result["l2s_cosine"], "p2s": 1.0}.get(s),
            "mse_to_target": {"mean": result["mean_mse"], "l2s": result["l2s_mse"], "p2s": 0.0}.get(s),
            "margin": result["margin"][s],
            "margin_gain": result["margin_gain"].get(s, 0.0),
            "positive_rate": result["positive_rate"][s],
        })
    return rows


# ==================================================================== training
def train(handle, dataset, layer: int | None = None, context_layer: int | None = None, hidden: int | None = None,
          position: str = "mean", progress: Progress | None = None, **hp) -> tuple[SteeringVector, dict]:
    """Train L2S on contrastive pairs; returns (vector, report).

    Groups are split three ways, seeded: ``test_fraction`` held out (only
    scored), then ``val_fraction`` of the rest for early stopping, the rest
    for fitting.  ``layer`` (L*) defaults to a third of the depth,
    ``context_layer`` (L′) to L*.  Other settings: see ``DEFAULTS``; settings
    other methods take (e.g. ``template``) are refused unless None.
    """
    unknown = {k for k, v in hp.items() if v is not None} - set(DEFAULTS)
    if unknown:
        raise L2SError(f"unknown L2S settings {sorted(unknown)} (known: {sorted(DEFAULTS)})")
    settings = {**DEFAULTS, **{k: v for k, v in hp.items() if v is not None}}
    progress = progress or _noop
    n_layers, D = handle.arch.num_layers, handle.arch.hidden_size
    layer = _check_layer(handle, default_layer(n_layers) if layer is None else layer, "layer")
    context_layer = _check_layer(handle, layer if context_layer is None else context_layer, "context layer")
    positions = settings["steer_positions"]
    _check_positions(layer, context_layer, positions)
    if position not in TARGET_POSITIONS:
        raise L2SError(f"position must be one of {TARGET_POSITIONS}, got '{position}'")
    hidden = default_hidden(D) if hidden is None else int(hidden)
    if hidden < 1:
        raise L2SError(f"hidden size must be a positive integer, got {hidden}")
    if settings["activation"] not in ACTIVATIONS:
        raise L2SError(f"activation must be one of {tuple(ACTIVATIONS)}, got '{settings['activation']}'")

    pairs = as_pairs(dataset)
    groups = [p.group for p in pairs]
    if len(set(groups)) < 3:
        raise L2SError(f"L2S needs at least 3 groups (train, validation, held-out test); found {len(set(groups))}")
    seed = int(settings["seed"])
    fit_idx, test_idx = split_groups(groups, settings["test_fraction"], seed)
    sub, val_sub = split_groups([groups[i] for i in fit_idx], settings["val_fraction"], seed + 1)
    train_idx, val_idx = [fit_idx[j] for j in sub], [fit_idx[j] for j in val_sub]

    progress(0.0, f"extracting activations for {len(pairs)} pairs at layers {context_layer} and {layer}")
    contexts, targets = extract(handle, pairs, layer, context_layer, position, settings["extract_batch"],
                                progress=lambda f, m: progress(0.4 * f, m))
    net, fit = fit_mlp(contexts, targets, train_idx, val_idx, hidden, settings["activation"],
                       epochs=settings["epochs"], patience=settings["patience"], lr=settings["lr"],
                       weight_decay=settings["weight_decay"], batch_size=settings["batch_size"],
                       cos_weight=settings["cos_weight"], seed=seed,
                       progress=lambda f, m: progress(0.4 + 0.4 * f, m))
    mean_s = targets[train_idx].mean(0)
    target_norm_mean = float(targets[train_idx].norm(dim=-1).mean())
    frame_hash = getattr(dataset, "content_hash", None)
    if frame_hash is None:
        from ..vector import dataset_hash

        frame_hash = dataset_hash([[p.prompt, p.positive, p.negative, p.group] for p in pairs])
    vector = SteeringVector(
        directions={layer: mean_s},
        hidden_size=D,
        method=METHOD,
        model_id=handle.model_id,
        model_type=handle.model_type,
        positions=positions,
        name=f"l2s L{layer}<-L{context_layer}",
        hyperparameters={
            "layer": layer, "context_layer": context_layer, "position": position, "hidden": hidden,
            "layer_sizes": net.sizes, "activation": settings["activation"], "target_norm_mean": target_norm_mean,
            "mean_s_norm": float(mean_s.norm()),
            **{k: settings[k] for k in ("seed", "epochs", "patience", "lr", "weight_decay", "batch_size",
                                         "cos_weight", "test_fraction", "val_fraction", "eval_alpha")},
            "split_counts": {"train": len(train_idx), "validation": len(val_idx), "test": len(test_idx)},
        },
        dataset_hash=frame_hash,
        extras=net.state_tensors(),
    )
    # Recommended α (relative units): up to raw α = 2, i.e. twice the average target; beyond that P2S itself
    # overshoots (validation split of the capitals pairs, docs/l2s.md).
    reach = 2.0 * target_norm_mean / max(handle.relative_scale(layer), 1e-12)
    vector.alpha_range = (-reach, reach)

    test_pairs = [pairs[i] for i in test_idx]
    limit = settings["eval_limit"]
    progress(0.8, f"scoring steering on {min(len(test_idx), limit or len(test_idx))} held-out pairs")
    held = compare_heldout(handle, vector, test_pairs, alpha=settings["eval_alpha"],
                           contexts=contexts[test_idx], targets=targets[test_idx], limit=limit)
    with torch.no_grad():
        val_pred = net(contexts[val_idx])
    val_cos = float(_cos(val_pred, targets[val_idx]).mean())
    val_mean_cos = float(_cos(mean_s.unsqueeze(0).expand(len(val_idx), -1), targets[val_idx]).mean())
    summary = {k: held[k] for k in ("l2s_cosine", "mean_cosine", "l2s_mse", "mean_mse", "margin_gain",
                                    "positive_rate", "alpha", "n", "n_steered")}
    vector.metrics = {"heldout": summary, "validation": {"l2s_cosine": val_cos, "mean_cosine": val_mean_cos},
                      "best_epoch": fit.best_epoch}
    report = {
        "layer": layer, "context_layer": context_layer, "position": position, "hidden": hidden,
        "splits": {"train": len(train_idx), "validation": len(val_idx), "test": len(test_idx),
                   "test_groups": sorted({groups[i] for i in test_idx})},
        "fit": fit.as_dict(),
        "validation": {"l2s_cosine": val_cos, "mean_cosine": val_mean_cos},
        **{k: v for k, v in held.items() if k not in ("per_input", "per_pair_effect")},
        "table": table_rows(held),
        "per_input": held["per_input"].to_dict("records"),
    }
    progress(1.0, f"held-out cosine: L2S {held['l2s_cosine']:.3f} vs Mean-S {held['mean_cosine']:.3f}")
    return vector, report


def default_layer(num_layers: int) -> int:
    """L* default: a third of the depth (block 6 of Gemma 3 270M's 18, chosen on the validation split of the
    capitals pairs: see docs/l2s.md)."""
    return max(0, min(num_layers - 1, int(round((num_layers - 1) / 3))))


from dataclasses import asdict, dataclass  # noqa: E402  (interim adapter; the l2s package replaces it)


@dataclass
class L2SSettings:
    layer: int | None = None
    context_layer: int | None = None
    hidden: int | None = None
    position: str = "mean"
    seed: int = 0
    epochs: int = 400
    patience: int = 40
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 32
    cos_weight: float = 0.1
    activation: str = "tanh"
    test_fraction: float = 0.2
    val_fraction: float = 0.2
    eval_alpha: float = 0.5
    eval_limit: int | None = None
    steer_positions: str = "all"
    extract_batch: int = 32


class _L2S:
    name = "l2s"
    label = "L2S (input-dependent)"
    Settings = L2SSettings
    steering = "input"

    def train(self, handle, dataset, settings, progress):
        return train(handle, dataset, progress=progress, **asdict(settings))

    def steers(self, handle, vector, alpha, *, layer=None, relative=False, positions=None):
        return build_steers(handle, vector, alpha, relative=relative, positions=positions)


METHOD = _L2S()


__all__ = ["train", "build_steers", "mean_steers", "p2s_vector", "steer_sources", "predict",
           "describe", "extract", "prompt_contexts", "fit_mlp", "SteeringMLP", "compare_heldout", "steering_effect",
           "table", "as_pairs", "Pair", "L2SError", "DEFAULTS", "default_hidden", "default_layer", "mlp_of",
           "layers_of"]
