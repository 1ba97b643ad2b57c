"""L2S's training settings: every one typed and bounded, for the CLI, the Train form and the API alike."""
from __future__ import annotations

from dataclasses import dataclass

from ..base import setting
from .activations import TARGET_POSITIONS
from .mlp import ACTIVATIONS, DECODER_INITS
from .pairs import L2SError

STEER_POSITIONS = ("all", "prompt", "generated")


@dataclass
class L2SSettings:
    layer: int | None = setting(
        None, "L*, the block whose output is steered (empty: a third of the depth)", minimum=0, maximum=1023)
    context_layer: int | None = setting(
        None, "L′, the block whose last prompt token g reads (empty: L*)", minimum=0, maximum=1023)
    hidden: int | None = setting(
        None, "hidden width H of the MLP g (empty: D/4 clamped to 100..1024)", minimum=1, maximum=16384)
    position: str = setting(
        "mean", "target read: mean over the completion tokens (short answers) or the last one (long answers)",
        choices=TARGET_POSITIONS)
    seed: int = setting(0, "seed of the group splits and of g's initialisation", minimum=0, maximum=2**31 - 1)
    epochs: int = setting(400, "most epochs to fit g (early stopping usually ends far sooner)",
                          minimum=1, maximum=5000)
    patience: int = setting(40, "stop after this many epochs without a better validation loss",
                            minimum=1, maximum=1000, ui=False)
    lr: float = setting(1e-3, "Adam learning rate (> 0)", minimum=0.0, maximum=1.0, ui=False)
    weight_decay: float = setting(1e-4, "Adam weight decay", minimum=0.0, maximum=1.0, ui=False)
    batch_size: int = setting(32, "training pairs per optimiser step", minimum=1, maximum=4096, ui=False)
    cos_weight: float = setting(0.1, "weight of the (1 − cosine) term added to the MSE loss",
                                minimum=0.0, maximum=100.0, ui=False)
    activation: str = setting("tanh", "g's nonlinearity", choices=tuple(ACTIVATIONS), ui=False)
    decoder_init: str = setting("svd", "g's decoder at epoch 0: the top principal directions of the centred "
                                "training shifts (svd) or zero; both start at mean steering",
                                choices=DECODER_INITS, ui=False)
    test_fraction: float = setting(0.2, "fraction of groups held out for the report (never trained on)",
                                   minimum=0.05, maximum=0.9, ui=False)
    val_fraction: float = setting(0.2, "fraction of the remaining groups used for early stopping",
                                  minimum=0.05, maximum=0.9, ui=False)
    norm_budget: float = setting(
        0.1, "norm budget of the steering comparison: the mean norm of the added vector as a fraction of the "
        "typical residual norm at L* (relative units); α is calibrated on validation within it, for L2S and mean "
        "steering alike", minimum=0.001, maximum=2.0, ui=False)
    calibration_steps: int = setting(4, "strengths tried up to the norm budget when calibrating α on the "
                                     "validation split (1: the budget itself)", minimum=1, maximum=12, ui=False)
    residual_steps: int = setting(2, "weights tried on the validation split, with α, for g's input-dependent part "
                                  "(k tries 0, 1/k, …, 1, where weight 0 is mean steering; k = 0 keeps g as trained)",
                                  minimum=0, maximum=8, ui=False)
    eval_limit: int | None = setting(None, "score steering on at most this many validation and held-out pairs "
                                     "(empty: all; cosines always use all)", minimum=1, maximum=100000, ui=False)
    steer_positions: str = setting("all", "positions the trained vector steers by default",
                                   choices=STEER_POSITIONS, ui=False)
    extract_batch: int = setting(32, "rows per activation-extraction batch", minimum=1, maximum=512, ui=False)

    def validate(self) -> None:
        if not self.lr > 0:
            raise L2SError.from_key("setting_not_positive", name="lr", value=repr(self.lr))
