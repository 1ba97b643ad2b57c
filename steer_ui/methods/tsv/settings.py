"""TSV's settings: every field typed and bounded, so the CLI, the Train form and the API share one validator.

Paper defaults unless noted.  Bounds are server-side limits on what a client
may ask for (a visitor can send anything over HTTP), not recommendations;
:meth:`TSVSettings.validate` adds the rules that span fields or need a
strict inequality.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import constraints as C
from ..base import setting
from .data import MAX_TEMPLATE, PROMPT_TEMPLATE, TSVError, template_pieces
from .labelling import MAX_SHOTS

MAX_EPOCHS = 200
MAX_ROWS = 1_000_000


@dataclass
class TSVSettings:
    """Hyperparameters of one TSV training request."""

    # one count for both stages, as the CLI's --epochs says
    ALIASES: ClassVar[dict[str, tuple[str, ...]]] = {"epochs": ("init_epochs", "aug_epochs")}

    layer: int | None = setting(
        None, "decoder block whose output the vector is added to (empty: the paper's relative depth, 9/32 of the "
              "blocks, e.g. block 5 of Gemma 3 270M's 18; or the best block of layer_sweep)",
        minimum=0, maximum=1000)
    layer_sweep: int = setting(
        0, "when layer is empty, try this many blocks around the paper's depth first and keep the one with the best "
           "validation AUROC (0: no sweep). Cost: one brief training per block (sweep_epochs epochs on the exemplars, "
           "then scoring the validation rows), about N × sweep_epochs / (init_epochs + aug_epochs) of the main "
           "training's time, more for early blocks; reads the labels of a third of the unlabelled training rows "
           "for the choice", minimum=0, maximum=9)
    sweep_epochs: int = setting(5, "epochs of each layer-sweep candidate's brief training", minimum=1, maximum=50)
    exemplars: int = setting(32, "labelled training rows TSV keeps the labels of; the rest are pseudo-labelled",
                             minimum=2, maximum=10_000)
    init_epochs: int = setting(20, "epochs of stage 1 (labelled exemplars only)", minimum=0, maximum=MAX_EPOCHS)
    aug_epochs: int = setting(20, "epochs of stage 2 (exemplars plus confident pseudo-labelled rows)",
                              minimum=0, maximum=MAX_EPOCHS)
    logit_penalty: bool = setting(True, "penalise next-token logit changes above max_logit_change (centred: "
                                        "relative to their mean over the vocabulary)")
    max_logit_change: float = setting(2.0, "the |Δlogit| bound of the logit penalty", minimum=0, maximum=1e4)
    kl_penalty: bool = setting(True, "penalise the KL divergence of the next-token distribution")
    generate: str = setting(
        "auto", "label the model's own greedy answers instead of the dataset's (the paper's TruthfulQA task): each "
                "answer is truthful when its best ROUGE-L (LCS F-measure on word tokens) to a correct reference beats "
                "its best to an incorrect one. auto: yes for TruthfulQA-shaped data (questions with correct and "
                "incorrect references), no otherwise", choices=("auto", "yes", "no"))
    answer_shots: int = setting(
        MAX_SHOTS, "when the model answers the questions itself: how many worked examples of TruthfulQA's QA primer "
                   "come before each question (0: the template's zero-shot prompt, the TSV paper's; a small base "
                   "model rambles without examples, and rambling answers get near-random labels)",
        minimum=0, maximum=MAX_SHOTS)
    seed: int = setting(0, "seed of the split, the exemplars and the initialisation", minimum=0, maximum=2**31 - 1)

    # expert settings: in the settings JSON, not in the form
    lam: float = setting(0.05, "λ: the vector's strength as a fraction of the mean residual norm at the layer "
                               "(paper: raw 5 on 4096-d models)", minimum=0, maximum=10, ui=False)
    kappa: float = setting(10.0, "κ: 1 / cosine temperature of the prototype classifier",
                           minimum=0, maximum=1000, ui=False)
    ema: float = setting(0.99, "decay of the prototypes' exponential moving average", minimum=0, maximum=1,
                         ui=False)
    lr: float = setting(5e-3, "AdamW learning rate of the vector", minimum=0, maximum=1, ui=False)
    selected: int = setting(128, "K: confident pseudo-labelled rows kept for stage 2 (at most half the unlabelled "
                                 "rows)", minimum=0, maximum=MAX_ROWS, ui=False)
    sinkhorn_epsilon: float = setting(0.05, "ε of the Sinkhorn transport", minimum=0, maximum=10, ui=False)
    sinkhorn_iterations: int = setting(3, "Sinkhorn iterations", minimum=1, maximum=1000, ui=False)
    batch_size: int = setting(128, "rows per optimiser step", minimum=1, maximum=1024, ui=False)
    supervised: bool = setting(False, "train on every labelled training row; no pseudo-labels", ui=False)
    # "class_means": the exemplars' class means with v = 0 (our default: with EMA 0.99 and the few steps a CPU
    # affords, random prototypes, the paper's choice, barely move); "random": the paper's.
    prototype_init: str = setting("class_means", "how the prototypes start", choices=("class_means", "random"),
                                  ui=False)
    logit_weight: float = setting(0.2, "weight of the logit penalty in the loss", minimum=0, maximum=100, ui=False)
    # "max": the worst token per row.  "mean" dilutes one exploding token by 1/vocab; "sum" gives gradients
    # thousands of times the cross-entropy's, which poison AdamW's second-moment estimate for hundreds of steps.
    logit_reduction: str = setting("max", "how a row's over-bound logit changes are combined",
                                   choices=C.REDUCTIONS, ui=False)
    kl_weight: float = setting(0.1, "weight of the KL penalty in the loss", minimum=0, maximum=100, ui=False)
    # With 8, the bound held on the rows each step saw but a held-out tail reached 3.01 on TruthfulQA
    # (limit 1.5 × 2.0); 32 covers every exemplar.
    # How the bound is made to hold (docs/tsv.md has the measurements).  The hinge is soft: alone ("hinge") it let
    # the held-out centred |Δlogit| reach 3 × the bound.  "projection" scales the vector down after each step whose
    # penalised positions went over; the detector then loses most of its strength (AUROC 0.97 -> 0.78 at 5 + 5
    # epochs).  "steering_scale" keeps one vector with two strengths: the detector reads the training
    # strength λ·v (where the constraints do not bite: no token is generated while scoring), and steering uses
    # s·λ·v, with s ≤ 1 tracked during training so the step's penalised positions sit at bound_target × the
    # bound, the penalties acting at s·λ·v (so they shape the direction, not the detector's strength), and s
    # calibrated at the end on the training rows' generation positions.  The saved vector is the steering one.
    # "calibrated" (default): the same two strengths, but the penalties train nothing (the vector is the
    # unconstrained one, trained once); only the calibration of the steering strength enforces the bound.  At 5 + 5
    # epochs it was the one mode that kept the detector's AUROC (penalties at the steering strength cost 0.06)
    # and it also gave the larger steering strength under the bound (docs/tsv.md).
    bound_mode: str = setting("calibrated", "how the |Δlogit| bound is enforced: steering_scale (a separate, "
                                                "calibrated steering strength, the penalties acting at it; the "
                                                "detector keeps the training strength), calibrated (the same, "
                                                "without the penalties in training), projection (one strength, "
                                                "scaled down to the bound) or hinge (the soft penalty alone)",
                              choices=("steering_scale", "calibrated", "projection", "hinge"), ui=False)
    bound_target: float = setting(0.8, "the share of max_logit_change that the projection or the steering scale "
                                       "aims at: below 1, a margin for positions calibration never saw (a margin, not a "
                                       "guarantee: docs/tsv.md)",
                                  minimum=0.05, maximum=1, ui=False)
    calibration_rows: int = setting(96, "training rows whose generation positions calibrate the steering scale "
                                        "after training", minimum=1, maximum=MAX_ROWS, ui=False)
    # "answer": the penalties act where a steered model generates (the last prompt token and the answer tokens but
    # the last), and the detector's last position stays free; "answer_and_end" adds it; "last" is it alone (before).
    penalty_positions: str = setting("answer", "positions whose next-token logits the penalties bound",
                                     choices=("answer", "answer_and_end", "last"), ui=False)
    # Each position costs a pass over the whole vocabulary (262k tokens on Gemma 3) forward and backward; a fresh
    # random draw each step covers every position over the epochs at a fraction of the cost.
    penalty_tokens: int = setting(64, "generation positions per optimiser step whose logits are penalised, drawn at "
                                      "random from the penalty rows' generation positions", minimum=1,
                                  maximum=100_000, ui=False)
    penalty_rows: int = setting(32, "rows per optimiser step whose full-vocabulary logits are penalised",
                                minimum=1, maximum=1024, ui=False)
    test_fraction: float = setting(0.25, "share of the groups held out for the AUROC", minimum=0, maximum=1,
                                   ui=False)
    max_rows: int | None = setting(None, "subsample whole groups to about this many rows, for speed (empty: all)",
                                   minimum=1, maximum=MAX_ROWS, ui=False)
    compare: bool = setting(True, "also train the opposite constraint setting for the with/without report",
                            ui=False)
    # each bound costs one more training run, measured on the same split (report["bound_sweep"])
    bound_sweep: tuple[float, ...] = setting((), "extra constrained runs, one per |Δlogit| bound",
                                             minimum=0, maximum=1e4, ui=False)
    cache_batch: int = setting(16, "texts per batch when caching the frozen blocks", minimum=1, maximum=256,
                               ui=False)
    template: str = setting(PROMPT_TEMPLATE, "the QA prompt; only {question} and {answer} may appear",
                            max_length=MAX_TEMPLATE, ui=False)

    def validate(self) -> None:
        """The rules bounds cannot say: strict inequalities, the template's fields, settings that need others."""
        checks = [  # (holds, message key, its parameters): said in the page's language
            (self.lam > 0, "setting_not_positive", {"name": "lam", "value": self.lam}),
            (self.kappa > 0, "setting_not_positive", {"name": "kappa", "value": self.kappa}),
            (self.ema < 1, "setting_below_one", {"name": "ema", "value": self.ema}),
            (self.lr > 0, "setting_not_positive", {"name": "lr", "value": self.lr}),
            (self.sinkhorn_epsilon > 0, "setting_positive", {"name": "sinkhorn_epsilon"}),
            (0 < self.test_fraction < 1, "setting_fraction", {"name": "test_fraction", "value": self.test_fraction}),
            (self.logit_penalty or not self.bound_sweep, "tsv_bound_sweep", {}),
        ]
        for ok, key, params in checks:
            if not ok:
                raise TSVError.from_key(key, **params)
        template_pieces(self.template)

    @property
    def constrained(self) -> bool:
        return self.logit_penalty or self.kl_penalty


PAPER_DEPTH = 9 / 32  # the paper steers block 9 of LLaMA-3.1-8B's 32


def default_layer(num_layers: int) -> int:
    """The paper's relative depth: 9/32 of the blocks (block 5 of Gemma 3 270M's 18, block 1 of a 4-block model)."""
    return max(0, min(num_layers - 1, round(num_layers * PAPER_DEPTH)))
