"""g, the steering MLP: ``Linear(D→H) → act → Linear(H→D)`` on standardised contexts, fitted to ``z − z̄``.

Fitting starts at Mean-S and keeps the epoch with the lowest validation loss,
so the result predicts validation targets at least as well as the mean does.
What makes it work on a few hundred pairs (docs/l2s.md measures each):

* the MLP predicts only the residual ``z − z̄`` (steering adds ``z̄ + g``), so
  the mean shift, the part every input shares, is never at risk;
* the decoder starts as the top singular directions of the centred training
  shifts (``decoder_init="svd"``) with a zero encoder: the output is exactly
  Mean-S at epoch 0, and the first steps only choose, per input, among the
  directions in which the shifts really vary, instead of searching all of R^D;
* weight decay, and early stopping on the validation loss.  Storage: the tensors go in a vector's ``extras`` under
``l2s.`` (see :meth:`SteeringMLP.state_tensors`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from ...messages import Said
from ...vector import VectorError
from ..base import Progress, noop
from .cpu import one_thread
from .pairs import L2SError

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
DECODER_INITS = ("svd", "zero")
EXTRA = "l2s."


def default_hidden(hidden_size: int) -> int:
    """H scaled to the model width: D/4 clamped to 100..1024 (100 for tiny models, 160 for Gemma 3 270M)."""
    return int(min(1024, max(100, hidden_size // 4)))


class SteeringMLP(nn.Module):
    """g(x) = z̄ + s_z · W₂ act(W₁ (x − μ) / s_x + b₁) + b₂: predicts a target from a context.

    μ, s_x standardise the context (s_x one scalar: the RMS of centred inputs);
    z̄, s_z (mean target, RMS of centred targets) put the outputs back in model
    units, so the trainable part only learns the input-dependent residual.
    """

    def __init__(self, d_in: int, hidden: int, d_out: int, activation: str = "tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise L2SError.from_key("l2s_activation", known=tuple(ACTIVATIONS), value=activation)
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
            raise VectorError.from_key("l2s_mlp_missing", tensors=[EXTRA + k for k in missing])
        hidden, d_in = state["encoder.weight"].shape
        d_out = state["decoder.weight"].shape[0]
        if state["decoder.weight"].shape[1] != hidden:
            raise VectorError.from_key("l2s_mlp_inner", inputs=state["decoder.weight"].shape[1], outputs=hidden)
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
            decoder_init: str = "svd", progress: Progress | None = None) -> tuple[SteeringMLP, FitReport]:
    """Fit g on ``train_idx``; keep the epoch with the lowest validation loss; stop after ``patience`` epochs
    without improvement.  Standardisation statistics come from the training rows only.

    ``decoder_init``: ``"svd"`` (the decoder spans the top principal directions of the centred training
    shifts, the encoder is zero) or ``"zero"`` (a zero decoder, a random encoder).  Both start at Mean-S."""
    if decoder_init not in DECODER_INITS:
        raise L2SError.from_key("l2s_decoder_init", known=DECODER_INITS, value=decoder_init)
    progress = progress or noop
    started = time.perf_counter()
    train_idx, val_idx = list(train_idx), list(val_idx)
    if len(train_idx) < 2:
        raise L2SError.from_key("l2s_train_pairs", count=len(train_idx))
    if not val_idx:
        raise L2SError.from_key("l2s_validation_pairs")
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
        net.decoder.bias.zero_()
    # Standardised residual targets and the standardised Mean-S offset (for the cosine term on whole vectors).
    offset = (net.target_mean / net.target_scale).detach()
    r_all = (z - net.target_mean) / net.target_scale
    with torch.no_grad():
        if decoder_init == "svd":
            _principal_decoder(net, r_all[train_idx], gen)
        else:  # start exactly at Mean-S: a zero decoder makes the residual vanish
            net.decoder.weight.zero_()
    with one_thread():
        return _fit_loop(net, x, r_all, offset, train_idx, val_idx, epochs, patience, lr, weight_decay, batch_size,
                         cos_weight, gen, progress, started)


def _principal_decoder(net: SteeringMLP, residuals: torch.Tensor, gen: torch.Generator) -> None:
    """Decoder columns = the top principal directions of the training residuals, each as long as the residuals'
    spread along it; encoder zero, so tanh(0) = 0 and g starts exactly at Mean-S.

    With fewer directions than hidden units (rank < H), the spare columns get small random directions so that
    no unit is dead (a zero column and a zero encoder row would both get zero gradient forever).
    """
    n, hidden = residuals.shape[0], net.decoder.weight.shape[1]
    _u, s, vh = torch.linalg.svd(residuals, full_matrices=False)
    spread = s / max(n - 1, 1) ** 0.5
    k = int(min(hidden, int((spread > spread[0] * 1e-4).sum()) if len(spread) else 0))
    weight = torch.randn(net.decoder.weight.shape, generator=gen) * (1e-2 * float(spread[0]) if k else 1e-2)
    weight /= max(net.decoder.weight.shape[0], 1) ** 0.5
    weight[:, :k] = (vh[:k] * spread[:k, None]).T
    net.decoder.weight.copy_(weight)
    net.encoder.weight.zero_()
    net.encoder.bias.zero_()


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
            progress(epoch / epochs, Said("progress_l2s_epoch", epoch=epoch, train=f"{report.train_loss[-1]:.4f}",
                                          val=f"{v:.4f}"))
        if epoch - report.best_epoch >= patience:
            report.stopped_early = epoch < epochs
            break
    net.load_state_dict(best_state)
    net.eval()
    net.requires_grad_(False)
    report.best_val_loss = best
    report.seconds = time.perf_counter() - started
    return net, report
