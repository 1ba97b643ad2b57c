"""TSV: a Truthfulness Separator Vector for hallucination detection, with lm_head constraints.

After "Steer LLM Latents for Hallucination Detection" (Park et al., ICML
2025; official code ``deeplearning-wisc/tsv``).  One vector ``v`` is added,
with a fixed strength λ, to every position of the output of decoder block
``L``.  The representation of a (prompt, answer) is the final-layer hidden
state (after the final norm) of the last answer token, L2-normalised.  Two
prototypes on the unit sphere, μ_hallucinated (class 0) and μ_truthful
(class 1), give p(c | r) = softmax_c(κ μ_cᵀ r).  Only ``v`` is trained (by
gradient); the prototypes follow an exponential moving average of the class
means.

Training, as in the paper:

1. stage 1: cross-entropy on a few labelled exemplars (default 32);
2. pseudo-labelling: Sinkhorn–Knopp optimal transport of the unlabelled rows
   onto the two classes with the exemplars' class proportions as marginals,
   then the K most confident rows per class (lowest cross-entropy between
   their transport plan and the model's prediction);
3. stage 2: exemplars (one-hot) + selected rows (soft labels).

Our additions: the lm_head constraints of :mod:`.constraints` (a hinge on
|Δlogit| above ``max_logit_change``, real and direct-path, and a KL term) so
the vector does not wreck the next-token distribution at the strength it
was trained at, and baselines on the same held-out split.

Speed on a CPU: blocks 0..L never see ``v``, so every text is run through the
frozen model once (:func:`.constraints.cache_prefix`); each step re-runs only
blocks L+1.. (:func:`.constraints.run_suffix`).

λ is relative: ``lam`` × the mean residual norm at block L (Gemma 3 270M's
norms grow from ~140 at block 0 to ~35,000 at block 17, so no raw default
fits every layer).  The stored direction is λ·v, the exact vector added, so
steering with it at raw α = 1 is the training strength.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from ..data import DatasetError
from ..model.hooks import Steer, StepState, steering
from ..vector import SteeringVector, VectorError, dataset_hash
from . import constraints as C

Progress = Callable[[float, str], None]

PROMPT_TEMPLATE = "Answer the question concisely. Q: {question} A:"
CLASSES = ("hallucinated", "truthful")  # class index = label: 1 means truthful


class TSVError(DatasetError):  # the CLI and the UI report DatasetError as a one-line message
    """A TSV request that cannot run as asked (bad data, bad settings)."""


@dataclass
class TSVSettings:
    """Hyperparameters; paper defaults unless noted."""

    layer: int | None = None  # default: three quarters of the depth (see default_layer)
    lam: float = 0.05  # λ as a fraction of the mean residual norm at block L (paper: raw 5 on 4096-d models)
    kappa: float = 10.0  # 1 / cosine temperature 0.1
    ema: float = 0.99
    lr: float = 5e-3
    init_epochs: int = 20
    aug_epochs: int = 20
    exemplars: int = 32
    selected: int = 128  # K, scaled down to half the unlabelled rows when there are fewer
    sinkhorn_epsilon: float = 0.05
    sinkhorn_iterations: int = 3
    batch_size: int = 128
    supervised: bool = False  # train on every labelled training row; no pseudo-labels
    # "class_means": the exemplars' class means with v = 0 (our default: with EMA 0.99 and the few steps a CPU
    # affords, random prototypes, the paper's choice, barely move); "random": the paper's.
    prototype_init: str = "class_means"
    logit_penalty: bool = True
    logit_weight: float = 0.2
    max_logit_change: float = 2.0
    # "max": the worst token per row.  "mean" dilutes one exploding token by 1/vocab; "sum" gives gradients
    # thousands of times the cross-entropy's, which poison AdamW's second-moment estimate for hundreds of steps.
    logit_reduction: str = "max"
    kl_penalty: bool = True
    kl_weight: float = 0.1
    # rows per optimiser step whose full-vocabulary logits are penalised.  With 8, the bound held on the rows
    # each step saw but a held-out tail reached 3.01 on TruthfulQA (limit 1.5 × 2.0); 32 covers every exemplar.
    penalty_rows: int = 32
    test_fraction: float = 0.25
    max_rows: int | None = None  # subsample (whole groups) for speed
    compare: bool = True  # also train the opposite constraint setting for the with/without report
    # extra constrained runs, one per |Δlogit| bound, so the AUROC cost of each bound is measured on the same
    # split (report["bound_sweep"]); each costs one more training run
    bound_sweep: tuple[float, ...] = ()
    cache_batch: int = 16
    template: str = PROMPT_TEMPLATE
    seed: int = 0

    def validate(self) -> None:
        checks = [
            (self.lam > 0, f"lam must be > 0, got {self.lam}"),
            (self.kappa > 0, f"kappa must be > 0, got {self.kappa}"),
            (0 <= self.ema < 1, f"ema must be in [0, 1), got {self.ema}"),
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.init_epochs >= 0 and self.aug_epochs >= 0, "epochs must be >= 0"),
            (self.exemplars >= 2, f"exemplars must be >= 2, got {self.exemplars}"),
            (self.selected >= 0, f"selected must be >= 0, got {self.selected}"),
            (self.sinkhorn_epsilon > 0, "sinkhorn_epsilon must be > 0"),
            (self.sinkhorn_iterations >= 1, "sinkhorn_iterations must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.prototype_init in ("random", "class_means"), "prototype_init must be 'random' or 'class_means'"),
            (self.max_logit_change >= 0, "max_logit_change must be >= 0"),
            (all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and b >= 0
                 for b in self.bound_sweep),
             f"bound_sweep must be a list of finite bounds >= 0, got {list(self.bound_sweep)}"),
            (self.logit_penalty or not self.bound_sweep,
             "bound_sweep varies max_logit_change, which only the logit penalty uses: turn logit_penalty on"),
            (self.logit_weight >= 0 and self.kl_weight >= 0, "logit_weight and kl_weight must be >= 0"),
            (self.logit_reduction in C.REDUCTIONS, f"logit_reduction must be one of {C.REDUCTIONS}"),
            (0 < self.test_fraction < 1, f"test_fraction must be in (0, 1), got {self.test_fraction}"),
            ("{question}" in self.template, "template must contain '{question}'"),
        ]
        for ok, msg in checks:
            if not ok:
                raise TSVError(msg)

    @property
    def constrained(self) -> bool:
        return self.logit_penalty or self.kl_penalty


def default_layer(num_layers: int) -> int:
    """Three quarters of the depth (block 14 of Gemma 3 270M's 18).

    Each training step re-runs every block after L, forward and backward, so
    a late layer is what makes training affordable on a CPU; the paper's
    models used a middle layer.  Probes on the embedded model separate true
    from false statements from block 5 on, so the signal is there.
    """
    return max(0, min(num_layers - 2, round(num_layers * 3 / 4)))


# --------------------------------------------------------------- the maths
def class_probs(reps: torch.Tensor, prototypes: torch.Tensor, kappa: float) -> torch.Tensor:
    """p(c | r) = softmax(κ μ_cᵀ r) for L2-normalised r and μ: (rows, 2)."""
    return (kappa * F.normalize(reps, dim=-1) @ F.normalize(prototypes, dim=-1).T).softmax(-1)


def sinkhorn(logits: torch.Tensor, marginals: torch.Tensor, epsilon: float = 0.05,
             iterations: int = 3) -> torch.Tensor:
    """Soft pseudo-labels (rows, classes) by Sinkhorn–Knopp optimal transport.

    ``logits``: κ·similarities (rows, classes).  The cost is the model's
    log-probability scaled by 1/ε; rows are alternately rescaled so class
    totals match ``marginals`` (proportions summing to 1) and each sample's
    labels sum to 1, which is the last step, so per-sample sums are exact and
    class totals approximate after few iterations.  Worked in the log domain
    (ε = 0.05 turns log-probabilities into exponents of hundreds).
    """
    marginals = torch.as_tensor(marginals, dtype=torch.float64).reshape(-1)
    if marginals.numel() != logits.shape[1] or (marginals <= 0).any():
        raise TSVError(f"sinkhorn needs one positive marginal per class, got {marginals.tolist()}")
    marginals = marginals / marginals.sum()
    n = logits.shape[0]
    log_q = (logits.double().log_softmax(-1) / epsilon).T  # (classes, rows)
    for _ in range(iterations):
        log_q = log_q - torch.logsumexp(log_q, dim=1, keepdim=True) + marginals.log().unsqueeze(1)
        log_q = log_q - torch.logsumexp(log_q, dim=0, keepdim=True) - math.log(n)
    return (log_q.exp() * n).T.float()


def select_confident(probs: torch.Tensor, pseudo: torch.Tensor, k: int,
                     class_dist: Sequence[float]) -> torch.Tensor:
    """Indices of the ``k`` most confident pseudo-labelled rows, split across classes by ``class_dist``.

    A row belongs to the class its transport plan favours; confidence is low
    cross-entropy between the plan and the model's prediction (the paper's
    entropy criterion).  A class with fewer rows than its quota gives all it
    has; the quota is not refilled from the other class, so the selection
    keeps the exemplars' balance rather than the model's bias.
    """
    ce = -(pseudo * (probs + 1e-8).log()).sum(1)
    hard = pseudo.argmax(1)
    chosen = []
    for c, share in enumerate(class_dist):
        members = (hard == c).nonzero(as_tuple=True)[0]
        quota = min(len(members), int(round(k * float(share))))
        if quota > 0:
            chosen.append(members[torch.topk(ce[members], quota, largest=False).indices])
    return torch.cat(chosen) if chosen else torch.zeros(0, dtype=torch.long)


def ema_prototypes(prototypes: torch.Tensor, reps: torch.Tensor, weights: torch.Tensor,
                   decay: float = 0.99) -> torch.Tensor:
    """μ ← normalise(decay·μ + (1 − decay)·weighted class mean of normalised reps).

    ``weights`` (rows, classes): one-hot labels or soft pseudo-labels.  A class
    with no weight in the batch keeps its prototype.
    """
    reps = F.normalize(reps.detach().float(), dim=-1)
    protos = F.normalize(prototypes.float(), dim=-1)
    weights = weights.detach().float()
    totals = weights.sum(0)
    means = (weights.T @ reps) / (totals.unsqueeze(1) + 1e-8)
    updated = F.normalize(decay * protos + (1 - decay) * means, dim=-1)
    return torch.where(totals.unsqueeze(1) > 0, updated, protos)


def auroc(labels: Sequence[int], scores: Sequence[float]) -> float | None:
    """Area under the ROC curve, or None when only one class is present."""
    from sklearn.metrics import roc_auc_score

    labels = [int(x) for x in labels]
    if len(set(labels)) < 2:
        return None
    return float(roc_auc_score(labels, [float(s) for s in scores]))


# -------------------------------------------------------------------- data
_TRUE = {"1", "true", "yes", "truthful", "correct", "t", "y"}
_FALSE = {"0", "false", "no", "hallucinated", "hallucination", "incorrect", "f", "n"}


def _label_of(value, row: int) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return 1
    if text in _FALSE:
        return 0
    raise TSVError(f"row {row}: label '{value}' is not truthful/hallucinated (expected 1/0, true/false, yes/no)")


def rows_of(dataset) -> pd.DataFrame:
    """(prompt, completion, label, group) rows from a Dataset, a DataFrame or a list of tuples/dicts.

    Labelled statements count as answers with an empty prompt.
    """
    frame = getattr(dataset, "frame", dataset)
    if isinstance(frame, (list, tuple)):
        records = []
        for i, item in enumerate(frame):
            if isinstance(item, dict):
                records.append(item)
            elif isinstance(item, (list, tuple)) and len(item) in (2, 3, 4):
                if len(item) == 2:
                    records.append({"prompt": "", "completion": item[0], "label": item[1]})
                else:
                    rec = {"prompt": item[0], "completion": item[1], "label": item[2]}
                    if len(item) == 4:
                        rec["group"] = item[3]
                    records.append(rec)
            else:
                raise TSVError(f"row {i}: expected (prompt, answer, label) or a dict, got {type(item).__name__}")
        frame = pd.DataFrame(records)
    if not isinstance(frame, pd.DataFrame):
        raise TSVError(f"TSV needs labelled answers or statements, got {type(dataset).__name__}")
    cols = {c.lower(): c for c in frame.columns}
    if "positive" in cols and "negative" in cols and "label" not in cols:
        raise TSVError("TSV needs labelled answers or statements (prompt, completion, label); "
                       "this dataset is contrastive pairs (prompt, positive, negative)")
    answer_col = next((cols[c] for c in ("completion", "answer", "statement", "text") if c in cols), None)
    prompt_col = next((cols[c] for c in ("prompt", "question") if c in cols), None)
    if answer_col is None or "label" not in cols:
        raise TSVError(f"TSV needs columns completion (or answer/statement) and label; found {list(frame.columns)}")
    out = pd.DataFrame({
        "prompt": frame[prompt_col].fillna("").astype(str) if prompt_col else "",
        "completion": frame[answer_col].fillna("").astype(str),
        "label": [_label_of(v, i) for i, v in enumerate(frame[cols["label"]])],
    })
    if "group" in cols:
        out["group"] = frame[cols["group"]].astype(str).values
    else:
        out["group"] = [p if p.strip() else a for p, a in zip(out.prompt, out.completion)]
    empty = out.completion.str.strip() == ""
    if empty.any():
        raise TSVError(f"row {int(empty.idxmax())}: empty answer")
    if len(out) == 0:
        raise TSVError("the dataset has no rows")
    return out.reset_index(drop=True)


def format_text(prompt: str, answer: str, template: str = PROMPT_TEMPLATE) -> str:
    """The text the model reads: the QA template around the question, then the answer.

    Statements (no prompt) are read alone.  A prompt that already starts like
    the template is used as it is.
    """
    answer = str(answer).strip()
    prompt = str(prompt or "").strip()
    if not prompt:
        return answer
    head = template.split("{question}")[0].strip()
    query = prompt if head and prompt.startswith(head) else template.format(question=prompt)
    return f"{query} {answer}"


def prefix_text(prompt: str, template: str = PROMPT_TEMPLATE) -> str:
    prompt = str(prompt or "").strip()
    if not prompt:
        return ""
    head = template.split("{question}")[0].strip()
    return prompt if head and prompt.startswith(head) else template.format(question=prompt)


def group_split(groups: Sequence[str], labels: Sequence[int], test_fraction: float = 0.25,
                seed: int = 0) -> tuple[list[int], list[int]]:
    """(train rows, test rows) with every group on one side only; both sides get both classes when possible."""
    uniq = sorted(set(groups))
    if len(uniq) < 2:
        raise TSVError(f"a held-out split needs at least 2 groups (questions/entities), found {len(uniq)}")
    for attempt in range(20):
        rng = random.Random(seed + 1000 * attempt)
        order = uniq[:]
        rng.shuffle(order)
        n_test = min(len(order) - 1, max(1, round(len(order) * test_fraction)))
        test_groups = set(order[:n_test])
        test = [i for i, g in enumerate(groups) if g in test_groups]
        train = [i for i, g in enumerate(groups) if g not in test_groups]
        if len({labels[i] for i in test}) == 2 and len({labels[i] for i in train}) == 2:
            return train, test
    raise TSVError("could not split the groups so that both sides hold truthful and hallucinated rows")


def _split(frame: pd.DataFrame, st: TSVSettings) -> tuple[list[int], list[int]]:
    """The data module's group split (the same one probes use), or ours when it leaves a side with one class."""
    labels = frame.label.tolist()
    try:
        from ..data import Dataset, split_indices

        kind = "statements" if (frame.prompt.str.strip() == "").all() else "answers"
        train, test = split_indices(Dataset(frame=frame[["prompt", "completion", "label", "group"]], kind=kind,
                                            schema=kind, source="tsv"), st.test_fraction, st.seed)
        if len({labels[i] for i in train}) == 2 and len({labels[i] for i in test}) == 2:
            return train, test
    except (ImportError, ValueError):
        pass
    return group_split(frame.group.tolist(), labels, st.test_fraction, st.seed)


def subsample_groups(frame: pd.DataFrame, max_rows: int, seed: int = 0) -> pd.DataFrame:
    """Whole groups, drawn at random, until ``max_rows`` rows."""
    if len(frame) <= max_rows:
        return frame
    groups = sorted(frame.group.unique())
    random.Random(seed).shuffle(groups)
    keep, count = set(), 0
    sizes = frame.group.value_counts()
    for g in groups:
        if count + sizes[g] > max_rows and keep:
            continue
        keep.add(g)
        count += sizes[g]
        if count >= max_rows:
            break
    return frame[frame.group.isin(keep)].reset_index(drop=True)


def _pick_exemplars(train: list[int], labels: Sequence[int], n: int, seed: int) -> list[int]:
    """``n`` training rows, with at least two of each class when the data allows."""
    rng = random.Random(seed + 7)
    order = train[:]
    rng.shuffle(order)
    n = min(n, len(order))
    chosen = order[:n]
    for cls in (0, 1):
        have = [i for i in chosen if labels[i] == cls]
        spare = [i for i in order[n:] if labels[i] == cls]
        while len(have) < 2 and spare:
            other = [i for i in chosen if labels[i] != cls]
            if len(other) <= 2:
                break
            chosen.remove(other[-1])
            chosen.append(spare.pop(0))
            have = [i for i in chosen if labels[i] == cls]
    if len({labels[i] for i in chosen}) < 2:
        raise TSVError("the exemplars need both truthful and hallucinated rows; the training split has one class")
    return chosen


# --------------------------------------------------------------- training
def _reps_of(handle, final_residual: torch.Tensor) -> torch.Tensor:
    normed = handle.arch.final_hidden(final_residual.to(handle.dtype)).float()
    return F.normalize(normed, dim=-1)


def _restrict(batches: Sequence[C.SuffixBatch], rows: set[int]) -> list[C.SuffixBatch]:
    """The cached batches cut down to the given dataset rows."""
    out = []
    for b in batches:
        keep = [p for p, i in enumerate(b.index) if i in rows]
        if keep:
            out.append(b if len(keep) == len(b) else b.select(keep))
    return out


def _chunks(parts: list, batch_size: int) -> list[list]:
    """Group cached sub-batches into optimiser steps of about ``batch_size`` rows."""
    steps, cur, n = [], [], 0
    for p in parts:
        cur.append(p)
        n += len(p[0])
        if n >= batch_size:
            steps.append(cur)
            cur, n = [], 0
    if cur:
        steps.append(cur)
    return steps


@dataclass
class _Run:
    """One training run's result (the main one, or its with/without-constraints twin)."""

    v: torch.Tensor
    prototypes: torch.Tensor
    curves: list[dict]
    pseudo: dict
    constrained: bool


def _train_run(handle, st: TSVSettings, layer: int, lam_raw: float, targets: dict[int, torch.Tensor],
               exemplar_batches, unlabelled_batches, labels: Sequence[int], constrained: bool,
               progress: Progress, span: tuple[float, float]) -> _Run:
    """Stage 1, pseudo-labelling, stage 2 for one constraint setting."""
    hidden = handle.arch.hidden_size
    gen = torch.Generator().manual_seed(st.seed)
    rng = random.Random(st.seed)
    v = torch.zeros(hidden, requires_grad=True)
    opt = torch.optim.AdamW([v], lr=st.lr)
    use_logit = constrained and st.logit_penalty
    use_kl = constrained and st.kl_penalty
    exemplar_rows = [i for b in exemplar_batches for i in b.index]
    if st.prototype_init == "class_means":
        reps = torch.cat([_reps_of(handle, b.final_last) for b in exemplar_batches])
        onehot = torch.stack([targets[i] for i in exemplar_rows])
        prototypes = ema_prototypes(torch.zeros(2, hidden), reps, onehot, decay=0.0)
    else:
        prototypes = F.normalize(torch.randn(2, hidden, generator=gen), dim=-1)
    curves: list[dict] = []
    total_epochs = max(1, st.init_epochs + (0 if st.supervised else st.aug_epochs))
    epoch_no = 0

    def run_epochs(parts_all: list[tuple[C.SuffixBatch, torch.Tensor]], epochs: int, stage: int) -> None:
        nonlocal prototypes, epoch_no
        for _ in range(epochs):
            parts = parts_all[:]
            rng.shuffle(parts)
            loss_sum, rows_seen, correct, ex_seen, worst = 0.0, 0, 0, 0, 0.0
            for step in _chunks(parts, st.batch_size):
                opt.zero_grad()
                n_rows = sum(len(b) for b, _ in step)
                budget = min(st.penalty_rows, n_rows)
                step_reps, step_targets = [], []
                for b, t in step:
                    added = lam_raw * v
                    final = run_suffix(handle, b, added)
                    reps = _reps_of(handle, final)
                    logits = st.kappa * reps @ prototypes.T
                    ce = -(t * logits.log_softmax(-1)).sum()
                    loss = ce / n_rows
                    if (use_logit or use_kl) and budget > 0:
                        k = min(budget, len(b))
                        budget -= k
                        lt, kt, w = C.penalty_terms(handle, b, added, final, slice(0, k), st.max_logit_change,
                                                    st.logit_reduction, use_logit, use_kl)
                        share = k / min(st.penalty_rows, n_rows)
                        loss = loss + share * (st.logit_weight * lt + st.kl_weight * kt)
                        worst = max(worst, w)
                    loss.backward()
                    loss_sum += float(loss.detach()) * n_rows
                    rows_seen += len(b)
                    step_reps.append(reps.detach())
                    step_targets.append(t)
                    pred = logits.detach().argmax(-1)
                    for p, i in enumerate(b.index):
                        if i in exemplar_set:
                            ex_seen += 1
                            correct += int(int(pred[p]) == int(labels[i]))
                opt.step()
                prototypes = ema_prototypes(prototypes, torch.cat(step_reps), torch.cat(step_targets), st.ema)
            epoch_no += 1
            curves.append({"epoch": epoch_no, "stage": stage, "loss": loss_sum / max(rows_seen, 1),
                           "exemplar_accuracy": correct / max(ex_seen, 1), "vector_norm": float(v.detach().norm()),
                           "max_abs_delta_logit_seen": worst if (use_logit or use_kl) else None})
            lo, hi = span
            progress(lo + (hi - lo) * epoch_no / total_epochs,
                     f"TSV {'constrained' if constrained else 'unconstrained'}: epoch {epoch_no}/{total_epochs}, "
                     f"loss {curves[-1]['loss']:.3f}")

    exemplar_set = set(exemplar_rows)
    ex_parts = [(b, torch.stack([targets[i] for i in b.index])) for b in exemplar_batches]
    run_epochs(ex_parts, st.init_epochs, 1)
    pseudo: dict[str, Any] = {"selected": 0, "counts": {c: 0 for c in CLASSES}}
    if not st.supervised and unlabelled_batches and st.aug_epochs > 0:
        with torch.no_grad():
            reps = torch.cat([_reps_of(handle, run_suffix(handle, b, lam_raw * v)) for b in unlabelled_batches])
        rows = [i for b in unlabelled_batches for i in b.index]
        ex_labels = [labels[i] for i in exemplar_rows]
        dist = [max(1e-3, ex_labels.count(c) / len(ex_labels)) for c in (0, 1)]
        logits = st.kappa * reps @ prototypes.T
        plan = sinkhorn(logits, torch.tensor(dist), st.sinkhorn_epsilon, st.sinkhorn_iterations)
        k = min(st.selected, max(2, len(rows) // 2))
        picked = select_confident(logits.softmax(-1), plan, k, dist)
        soft = {rows[int(p)]: plan[int(p)] for p in picked}
        hard = {r: int(s.argmax()) for r, s in soft.items()}
        pseudo = {
            "selected": len(soft), "unlabelled": len(rows), "k": k, "class_marginals": dist,
            "counts": {CLASSES[c]: sum(1 for h in hard.values() if h == c) for c in (0, 1)},
            # a diagnostic only: the hidden labels are never used for training
            "accuracy_vs_hidden_labels": (sum(int(labels[r] == h) for r, h in hard.items()) / len(hard))
            if hard else None,
        }
        aug = {**{i: targets[i] for i in exemplar_rows}, **soft}
        parts = [(b, torch.stack([aug[i] for i in b.index]))
                 for b in _restrict(exemplar_batches + unlabelled_batches, set(aug))]
        run_epochs(parts, st.aug_epochs, 2)
    return _Run(v=v.detach().clone(), prototypes=prototypes.detach().clone(), curves=curves, pseudo=pseudo,
                constrained=constrained)


def run_suffix(handle, batch, added):
    return C.run_suffix(handle, batch, added)


def _evaluate(handle, batches, added: torch.Tensor, prototypes: torch.Tensor, kappa: float,
              labels: Sequence[int], top_k: int = 10) -> dict:
    """Held-out p(truthful) scores, AUROC and the Δlogit report at the training strength."""
    finals, scores, rows = [], [], []
    with torch.no_grad():
        for b in batches:
            final = run_suffix(handle, b, added)
            finals.append(final)
            scores += class_probs(_reps_of(handle, final), prototypes, kappa)[:, 1].tolist()
            rows += b.index
    delta = C.measure_delta(handle, batches, added, top_k=top_k, finals=finals)
    return {"auroc": auroc([labels[i] for i in rows], scores), "scores": dict(zip(rows, scores)), "delta": delta}


def _answer_logprob(handle, batches, n_answer: dict[int, int]) -> dict[int, float]:
    """Mean log-probability of the answer tokens under the unsteered model (the perplexity baseline)."""
    out = {}
    with torch.no_grad():
        for b in batches:
            seq = b.input_ids.shape[1]
            for p, i in enumerate(b.index):
                n = max(1, min(n_answer[i], int(b.attention_mask[p].sum()) - 1))
                hidden = b.final_all[p, seq - n - 1:seq - 1]
                logp = C.logits_of(handle, hidden).log_softmax(-1)
                targets = b.input_ids[p, seq - n:].to(logp.device)
                out[i] = float(logp.gather(1, targets.unsqueeze(1)).mean())
    return out


def _baselines(handle, st: TSVSettings, train_batches, test_batches, exemplar_rows, labels,
               n_answer) -> dict:
    """AUROC of simple detectors on the same held-out rows."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    def feats(batches, attr):
        rows = [i for b in batches for i in b.index]
        return rows, torch.cat([getattr(b, attr) for b in batches]).float().numpy()

    tr_rows, tr_x = feats(train_batches, "layer_last")
    te_rows, te_x = feats(test_batches, "layer_last")
    tr_y = np.array([labels[i] for i in tr_rows])
    te_y = [labels[i] for i in te_rows]
    out: dict[str, Any] = {}

    def probe(mask):
        scaler = StandardScaler().fit(tr_x[mask])
        clf = LogisticRegression(C=1.0, max_iter=2000).fit(scaler.transform(tr_x[mask]), tr_y[mask])
        return auroc(te_y, clf.decision_function(scaler.transform(te_x)))

    ex = np.array([i in set(exemplar_rows) for i in tr_rows])
    out["probe"] = {"auroc": probe(np.ones(len(tr_rows), bool)),
                    "note": f"logistic regression on block {st.layer} last-token activations, all {len(tr_rows)} "
                            f"labelled training rows"}
    out["probe_exemplars"] = {"auroc": probe(ex),
                              "note": f"the same probe fitted on the {int(ex.sum())} exemplars only (TSV's labels)"}
    diff = tr_x[tr_y == 1].mean(0) - tr_x[tr_y == 0].mean(0)
    out["mean_difference"] = {"auroc": auroc(te_y, te_x @ diff),
                              "note": f"projection on mean(truthful) - mean(hallucinated) at block {st.layer}"}
    logprob = _answer_logprob(handle, test_batches, n_answer)
    out["mean_token_logprob"] = {"auroc": auroc(te_y, [logprob[i] for i in te_rows]),
                                 "note": "the unsteered model's mean log-probability of the answer tokens"}
    ex_batches = _restrict(train_batches, set(exemplar_rows))
    ex_reps = torch.cat([_reps_of(handle, b.final_last) for b in ex_batches])
    ex_y = [labels[i] for b in ex_batches for i in b.index]
    protos = ema_prototypes(torch.zeros(2, ex_reps.shape[1]), ex_reps,
                            F.one_hot(torch.tensor(ex_y), 2).float(), decay=0.0)
    te_reps = torch.cat([_reps_of(handle, b.final_last) for b in test_batches])
    out["prototypes_without_vector"] = {
        "auroc": auroc(te_y, class_probs(te_reps, protos, st.kappa)[:, 1].tolist()),
        "note": "TSV's scoring rule with exemplar class means as prototypes and no vector (v = 0)"}
    return out


def _settings(layer, hp: dict) -> TSVSettings:
    hp = dict(hp)
    # Names the shared train form uses: one epoch count for both stages; TSV always reads the last token.
    epochs = hp.pop("epochs", None)
    if epochs is not None:
        hp.setdefault("init_epochs", epochs)
        hp.setdefault("aug_epochs", epochs)
    hp.pop("position", None)
    names = {f.name for f in fields(TSVSettings)}
    unknown = sorted(set(hp) - names)
    if unknown:
        raise TSVError(f"unknown TSV setting(s) {unknown}; known: {sorted(names)}")
    sweep = hp.get("bound_sweep")
    if sweep is not None:
        if not isinstance(sweep, (list, tuple)):
            raise TSVError(f"bound_sweep must be a list of bounds like [6, 20], got {sweep!r}")
        hp["bound_sweep"] = tuple(sweep)
    st = TSVSettings(**{k: v for k, v in hp.items() if v is not None})
    if layer is not None:
        st.layer = int(layer)
    st.validate()
    return st


def train(handle, dataset, layer: int | None = None, progress: Progress | None = None, **hp):
    """Train a TSV on labelled (prompt, answer, label) rows; returns (SteeringVector, report).

    The rows are split by group (question / entity) into train and held-out
    test; ``exemplars`` training rows keep their labels, the rest are
    unlabelled (``supervised=True``: all keep them).  The report holds the
    per-epoch curves, pseudo-label counts, held-out ``auroc``, ``baselines``
    on the same split, and ``max_abs_delta_logit`` with and without the
    constraints (the twin run, ``compare=True``) with the top offending tokens.
    """
    progress = progress or (lambda _f, _m: None)
    st = _settings(layer, hp)
    arch = handle.arch
    st.layer = default_layer(arch.num_layers) if st.layer is None else st.layer
    if not 0 <= st.layer < arch.num_layers:
        raise TSVError(f"layer {st.layer} does not exist: the model has layers 0..{arch.num_layers - 1}")
    frame = rows_of(dataset)
    if st.max_rows:
        frame = subsample_groups(frame, st.max_rows, st.seed)
    labels = frame.label.tolist()
    if len(set(labels)) < 2:
        raise TSVError("the dataset has only one class; TSV needs truthful and hallucinated rows")
    texts = [format_text(p, a, st.template) for p, a in zip(frame.prompt, frame.completion)]
    train_rows, test_rows = _split(frame, st)
    exemplar_rows = train_rows if st.supervised else _pick_exemplars(train_rows, labels, st.exemplars, st.seed)
    unlabelled_rows = [i for i in train_rows if i not in set(exemplar_rows)]

    lam_raw = st.lam * handle.relative_scale(st.layer)
    progress(0.01, f"caching blocks 0..{st.layer} for {len(texts)} texts")

    def sub(lo, hi):
        return lambda f, m: progress(lo + (hi - lo) * f, m)

    def cache(rows, lo, hi, keep_final=False):
        batches = C.cache_prefix(handle, [texts[i] for i in rows], st.layer, batch_size=st.cache_batch,
                                 progress=sub(lo, hi), keep_final=keep_final)
        for b in batches:  # positions in `rows` -> dataset rows
            b.index = [rows[p] for p in b.index]
        return batches

    exemplar_batches = cache(exemplar_rows, 0.01, 0.05)
    unlabelled_batches = cache(unlabelled_rows, 0.05, 0.2) if unlabelled_rows else []
    test_batches = cache(test_rows, 0.2, 0.27, keep_final=True)
    targets = {i: F.one_hot(torch.tensor(labels[i]), 2).float() for i in train_rows}

    settings_to_run = [st.constrained] + ([not st.constrained] if st.compare else [])
    # validate() allows a sweep only with the logit penalty on, so the main run is constrained and has its bound
    bounds = [b for b in dict.fromkeys(float(b) for b in st.bound_sweep) if b != st.max_logit_change]
    runs: dict[bool, _Run] = {}
    span = 0.65 / (len(settings_to_run) + len(bounds))
    for n, constrained in enumerate(settings_to_run):
        runs[constrained] = _train_run(handle, st, st.layer, lam_raw, targets, exemplar_batches,
                                       unlabelled_batches, labels, constrained, progress,
                                       (0.27 + n * span, 0.27 + (n + 1) * span))
    swept: dict[float, _Run] = {}
    for n, bound in enumerate(bounds, start=len(settings_to_run)):
        progress(0.27 + n * span, f"bound sweep: |Δlogit| bound {bound:g}")
        swept[bound] = _train_run(handle, replace(st, max_logit_change=bound), st.layer, lam_raw, targets,
                                  exemplar_batches, unlabelled_batches, labels, True, progress,
                                  (0.27 + n * span, 0.27 + (n + 1) * span))
    progress(0.93, "scoring the held-out split")
    evals = {c: _evaluate(handle, test_batches, lam_raw * r.v, r.prototypes, st.kappa, labels)
             for c, r in runs.items()}
    swept_evals = {b: _evaluate(handle, test_batches, lam_raw * r.v, r.prototypes, st.kappa, labels)
                   for b, r in swept.items()}
    n_answer = {}
    for i in test_rows:
        full = len(handle.tokenizer(texts[i]).input_ids)
        pre = prefix_text(frame.prompt[i], st.template)
        n_answer[i] = full - (len(handle.tokenizer(pre).input_ids) if pre else 1)
    baselines = _baselines(handle, st, exemplar_batches + unlabelled_batches, test_batches, exemplar_rows, labels,
                           n_answer)
    main = runs[st.constrained]
    main_eval = evals[st.constrained]

    def run_report(e: dict, run: _Run) -> dict:
        return {"auroc": e["auroc"], "max_abs_delta_logit": e["delta"]["max_abs_delta_logit"],
                "median_max_abs_delta_logit": e["delta"]["median_max_abs_delta_logit"],
                "direct_max_abs_delta_logit": e["delta"]["direct_max_abs_delta_logit"],
                "mean_kl": e["delta"]["mean_kl"], "top_tokens": e["delta"]["top_tokens"],
                "vector_norm": float((lam_raw * run.v).norm()), "curves": run.curves,
                "pseudo_labels": run.pseudo}

    run_reports = {("constrained" if c else "unconstrained"): run_report(evals[c], r) for c, r in runs.items()}
    run_reports.update({f"constrained, bound {b:g}": run_report(swept_evals[b], r) for b, r in swept.items()})
    # AUROC against the bound, loosest last; the unconstrained run is the bound-free end (None)
    tradeoff = {**swept_evals, st.max_logit_change: evals[True]} if swept else {}
    if swept and False in evals:
        tradeoff[None] = evals[False]
    bound_sweep = [{"bound": b, "auroc": e["auroc"], "max_abs_delta_logit": e["delta"]["max_abs_delta_logit"],
                    "mean_kl": e["delta"]["mean_kl"]}
                   for b, e in sorted(tradeoff.items(), key=lambda kv: math.inf if kv[0] is None else kv[0])]

    report: dict[str, Any] = {
        "method": "tsv", "layer": st.layer, "lam": st.lam, "lam_raw": lam_raw,
        "rows": {"total": len(frame), "train": len(train_rows), "test": len(test_rows),
                 "exemplars": len(exemplar_rows), "unlabelled": len(unlabelled_rows),
                 "groups": int(frame.group.nunique())},
        "auroc": main_eval["auroc"],
        "curves": main.curves,
        "pseudo_labels": main.pseudo,
        "baselines": baselines,
        "max_abs_delta_logit": {
            "with_constraints": evals[True]["delta"]["max_abs_delta_logit"] if True in evals else None,
            "without_constraints": evals[False]["delta"]["max_abs_delta_logit"] if False in evals else None,
            "limit": st.max_logit_change,
        },
        "top_tokens": main_eval["delta"]["top_tokens"],
        "held_out": [{"prompt": frame.prompt[i], "answer": frame.completion[i], "label": labels[i],
                      "score": main_eval["scores"][i]} for i in test_rows],
        "runs": run_reports,
        "bound_sweep": bound_sweep,
        "settings": asdict(st),
    }
    direction = lam_raw * main.v
    rel = float(direction.norm()) / handle.relative_scale(st.layer)
    hyper = {**asdict(st), "lam_raw": lam_raw, "classes": list(CLASSES), "train_alpha_raw": 1.0}
    metrics = {"auroc": report["auroc"],
               "baselines": {k: v["auroc"] for k, v in baselines.items()},
               "max_abs_delta_logit": report["max_abs_delta_logit"],
               "rows": report["rows"]}
    vector = SteeringVector(
        directions={st.layer: direction}, hidden_size=arch.hidden_size, method="tsv", model_id=handle.model_id,
        model_type=handle.model_type, positions="all",
        name=f"tsv L{st.layer} ({'constrained' if st.constrained else 'unconstrained'})",
        hyperparameters=hyper,
        dataset_hash=dataset_hash(list(zip(texts, labels))), metrics=metrics,
        alpha_range=(0.0, round(2 * rel, 6) if rel > 0 else 1.0),
        extras={"prototypes": main.prototypes},
    )
    progress(1.0, f"TSV trained: held-out AUROC {report['auroc']}")
    return vector, report


# --------------------------------------------------------------- detection
def _check_tsv(handle, vector: SteeringVector) -> None:
    from ..steering import check_compatible

    if vector.method != "tsv" or "prototypes" not in vector.extras:
        raise VectorError(f"'{vector.name or vector.method}' is not a TSV vector (method={vector.method}, "
                       f"extras={sorted(vector.extras)}); train one with --method tsv")
    protos = vector.extras["prototypes"]
    if tuple(protos.shape) != (2, vector.hidden_size):
        raise VectorError(f"TSV prototypes have shape {tuple(protos.shape)}, expected (2, {vector.hidden_size})")
    check_compatible(handle, vector)


def score(handle, vector: SteeringVector, pairs: Sequence[tuple[str, str]], batch_size: int = 16) -> list[float]:
    """p(truthful) for each (prompt, answer) under the trained vector and prototypes (prompt may be '')."""
    _check_tsv(handle, vector)
    hp = vector.hyperparameters
    template = hp.get("template", PROMPT_TEMPLATE)
    kappa = float(hp.get("kappa", 10.0))
    layer = vector.layer
    texts = []
    for n, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TSVError(f"pair {n}: expected (prompt, answer), got {pair!r}")
        if not str(pair[1]).strip():
            raise TSVError(f"pair {n}: empty answer")
        texts.append(format_text(pair[0], pair[1], template))
    if not texts:
        return []
    # The hooked model, not the training cache: detection works from a saved file alone, and the unit
    # tests check that both paths give the same scores.
    steer = Steer(layer=layer, vector=vector.direction(layer), alpha=1.0, positions="all")
    prototypes = vector.extras["prototypes"]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    scores = [0.0] * len(texts)
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        ids, mask, pos = C.encode_batch(handle, [texts[i] for i in index])
        dev = handle.input_device
        with torch.inference_mode(), steering(handle, [steer], StepState(prompt_len=None)):
            out = handle.model.base_model(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                          position_ids=pos.to(dev), use_cache=False)
        reps = F.normalize(out.last_hidden_state[:, -1, :].float(), dim=-1).cpu()
        p = class_probs(reps, prototypes, kappa)
        for row, i in enumerate(index):
            scores[i] = float(p[row, 1])
    return scores


def detect(handle, vector: SteeringVector, dataset) -> dict:
    """Score every (prompt, answer) of ``dataset``; AUROC when it has both labels."""
    _check_tsv(handle, vector)
    frame = getattr(dataset, "frame", dataset)
    if isinstance(frame, pd.DataFrame):
        has_labels = "label" in {str(c).lower() for c in frame.columns}
    else:
        has_labels = bool(frame) and isinstance(frame[0], dict) and "label" in frame[0] or \
            bool(frame) and isinstance(frame[0], (list, tuple)) and len(frame[0]) >= 3
    if has_labels:
        rows = rows_of(dataset)
        labels = rows.label.tolist()
    else:
        rows = _unlabelled_rows(frame)
        labels = [None] * len(rows)
    scores = score(handle, vector, list(zip(rows.prompt, rows.completion)))
    result = {"auroc": auroc(labels, scores) if has_labels else None,
              "scores": [{"prompt": p, "answer": a, "score": s, "label": lab}
                         for p, a, s, lab in zip(rows.prompt, rows.completion, scores, labels)]}
    result["rows"] = len(scores)
    return result


def _unlabelled_rows(frame) -> pd.DataFrame:
    if isinstance(frame, (list, tuple)):
        return pd.DataFrame([{"prompt": p, "completion": a} for p, a in frame])
    cols = {c.lower(): c for c in frame.columns}
    answer_col = next((cols[c] for c in ("completion", "answer", "statement", "text") if c in cols), None)
    if answer_col is None:
        raise TSVError(f"detection needs a completion (or answer/statement) column; found {list(frame.columns)}")
    prompt_col = next((cols[c] for c in ("prompt", "question") if c in cols), None)
    return pd.DataFrame({"prompt": frame[prompt_col].fillna("").astype(str) if prompt_col else "",
                         "completion": frame[answer_col].fillna("").astype(str)})


# ------------------------------------------------------- generate and label
def _question_table(questions) -> pd.DataFrame:
    """(question, correct, incorrect) from a TruthfulQA-style frame or labelled (prompt, completion, label) rows."""
    from ..lexical import split_references

    frame = getattr(questions, "frame", questions)
    if isinstance(frame, (list, tuple)):
        if all(isinstance(q, str) for q in frame):
            raise TSVError("generate-and-label needs reference answers, not questions alone")
        frame = rows_of(frame)
    cols = {c.lower().replace("_", " "): c for c in frame.columns}
    if "question" in cols and ("correct answers" in cols or "best answer" in cols):
        out = []
        for _, r in frame.iterrows():
            correct = split_references(r[cols["correct answers"]]) if "correct answers" in cols else []
            if "best answer" in cols:
                correct = split_references(r[cols["best answer"]])[:1] + correct
            incorrect = split_references(r[cols["incorrect answers"]]) if "incorrect answers" in cols else []
            out.append({"question": str(r[cols["question"]]).strip(), "correct": correct, "incorrect": incorrect})
        return pd.DataFrame(out)
    rows = rows_of(frame)
    if (rows.prompt.str.strip() == "").all():
        raise TSVError("generate-and-label needs questions (a prompt/question column), not bare statements")
    out = []
    for q, g in rows.groupby("prompt", sort=False):
        out.append({"question": q, "correct": g.completion[g.label == 1].tolist(),
                    "incorrect": g.completion[g.label == 0].tolist()})
    return pd.DataFrame(out)


def clean_answer(text: str) -> str:
    """Cut a generated answer at the first newline or at a new 'Q:' (the model starting another question)."""
    text = text.split("\n")[0]
    for marker in ("Q:", "A:", "Answer the question"):
        if marker in text:
            text = text.split(marker)[0]
    return text.strip()


def generate_and_label(handle, questions_frame, progress: Progress | None = None, max_new_tokens: int = 32,
                       batch_size: int = 8, metric: str = "rouge_l", threshold: float = 0.5,
                       template: str = PROMPT_TEMPLATE, max_questions: int | None = None) -> pd.DataFrame:
    """Answer each question greedily with ``template`` and label the answer lexically against the references.

    Returns a frame with prompt (the question), completion (the answer),
    label (1 truthful), group, the similarity to the best correct and best
    incorrect reference, and the references used, ready for :func:`train`.
    """
    from ..lexical import label_answer

    progress = progress or (lambda _f, _m: None)
    table = _question_table(questions_frame)
    table = table[table.question.str.strip() != ""].reset_index(drop=True)
    if max_questions:
        table = table.iloc[:max_questions]
    if table.empty:
        raise TSVError("no questions to answer")
    if not any(len(c) for c in table.correct):
        raise TSVError("generate-and-label needs correct reference answers for the questions")
    tok = handle.tokenizer
    answers: list[str] = []
    eos = tok.eos_token_id
    for start in range(0, len(table), batch_size):
        qs = table.question.iloc[start:start + batch_size].tolist()
        prompts = [template.format(question=q) for q in qs]
        enc = tok(prompts, return_tensors="pt", padding=True).to(handle.input_device)
        with handle.lock, torch.inference_mode():
            out = handle.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                        pad_token_id=tok.pad_token_id, eos_token_id=eos,
                                        temperature=None, top_p=None, top_k=None)
        for row in out[:, enc.input_ids.shape[1]:]:
            answers.append(clean_answer(tok.decode(row, skip_special_tokens=True)))
        progress(min(1.0, (start + len(qs)) / len(table)), f"answered {start + len(qs)}/{len(table)} questions")
    labelled = [label_answer(a, c, i, metric=metric, threshold=threshold)
                for a, c, i in zip(answers, table.correct, table.incorrect)]
    result = pd.DataFrame({
        "prompt": table.question,
        "completion": answers,
        "label": [lab for lab, _, _ in labelled],
        "group": table.question,
        "similarity_correct": [sc for _, sc, _ in labelled],
        "similarity_incorrect": [si for _, _, si in labelled],
        "correct_answers": ["; ".join(c) for c in table.correct],
        "incorrect_answers": ["; ".join(i) for i in table.incorrect],
    })
    empty = result.completion.str.strip() == ""
    result.attrs["metric"] = metric
    result.attrs["empty_answers"] = int(empty.sum())
    return result[~empty].reset_index(drop=True)


# ------------------------------------------------------------------ the Method
@dataclass
class TSVMethodSettings(TSVSettings):
    ALIASES = {"epochs": ("init_epochs", "aug_epochs")}  # one count for both stages, as the form and CLI say
    generate: bool = False  # answer the questions with the model and label the answers first


class _TSV:
    name = "tsv"
    label = "TSV (truthfulness separator)"
    Settings = TSVMethodSettings
    steering = "static"

    def train(self, handle, dataset, settings, progress):
        from dataclasses import asdict

        hp = {k: v for k, v in asdict(settings).items() if k != "generate"}
        generated = None
        if settings.generate:
            generated = dataset = generate_and_label(handle, dataset)
        vector, report = train(handle, dataset, progress=progress, **hp)
        if generated is not None:
            report["generated"] = generated[["prompt", "completion", "label", "similarity_correct",
                                             "similarity_incorrect"]].to_dict("records")
        return vector, report

    def score(self, handle, vector, pairs):
        return score(handle, vector, pairs)

    def detect(self, handle, vector, dataset):
        return detect(handle, vector, dataset)

    def steers(self, handle, vector, alpha, *, layer=None, relative=False, positions=None):
        from .base import static_steers

        return static_steers(handle, vector, alpha, layer=layer, relative=relative, positions=positions)


METHOD = _TSV()


# ------------------------------------------------------- the README table
def table_markdown(report: dict) -> str:
    """The held-out AUROC table (TSV vs baselines) and the Δlogit check, as Markdown."""
    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    runs = report["runs"]
    lines = ["| detector | held-out AUROC |", "|---|---|"]
    for key, run in runs.items():  # constrained, unconstrained, then any bound-sweep runs
        lines.append(f"| TSV ({key}) | {fmt(run['auroc'])} |")
    for name, b in report["baselines"].items():
        lines.append(f"| {name.replace('_', ' ')} | {fmt(b['auroc'])} |")
    lines += ["", "| run | max abs Δlogit (held-out, last position) | median per row | mean KL |", "|---|---|---|---|"]
    for key, r in runs.items():
        lines.append(f"| {key} | {fmt(r['max_abs_delta_logit'])} | {fmt(r['median_max_abs_delta_logit'])} | "
                     f"{fmt(r['mean_kl'])} |")
    return "\n".join(lines)


def _mean_sd(values) -> str:
    """``mean ± sd`` of the values that are not None (sd 0 for one value), or n/a."""
    import statistics

    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def seeds_markdown(reports: Sequence[dict]) -> str:
    """Per-seed held-out AUROCs and max |Δlogit| with their mean ± standard deviation, as Markdown."""
    def cell(values):
        each = ", ".join(f"{v:.3f}" for v in values if v is not None)
        return _mean_sd(values), each or "n/a"

    rows = [("TSV (constrained)", [r["runs"].get("constrained", {}).get("auroc") for r in reports]),
            ("TSV (unconstrained)", [r["runs"].get("unconstrained", {}).get("auroc") for r in reports])]
    if all("constrained" in r["runs"] and "unconstrained" in r["runs"] for r in reports):
        drops = [r["runs"]["unconstrained"]["auroc"] - r["runs"]["constrained"]["auroc"] for r in reports]
        rows.append(("drop from the constraints", drops))
    for name in reports[0]["baselines"]:
        rows.append((name.replace("_", " "), [r["baselines"][name]["auroc"] for r in reports]))
    seeds = ", ".join(str(r["settings"]["seed"]) for r in reports)
    lines = [f"| detector | held-out AUROC, mean ± sd | per seed ({seeds}) |", "|---|---|---|"]
    lines += [f"| {name} | {' | '.join(cell(vals))} |" for name, vals in rows]
    lines += ["", f"| run | max abs Δlogit (held-out, last position), mean ± sd | per seed ({seeds}) |",
              "|---|---|---|"]
    for key in reports[0]["runs"]:
        lines.append(f"| {key} | {' | '.join(cell([r['runs'][key]['max_abs_delta_logit'] for r in reports]))} |")
    return "\n".join(lines)


def bounds_markdown(reports: Sequence[dict]) -> str:
    """The AUROC-against-bound table of ``bound_sweep`` runs (mean ± sd over the reports), as Markdown."""
    lines = ["| bound | held-out AUROC | held-out max abs Δlogit | mean KL |", "|---|---|---|---|"]
    for n, row in enumerate(reports[0].get("bound_sweep") or []):
        rows = [r["bound_sweep"][n] for r in reports]
        bound = "none" if row["bound"] is None else f"{row['bound']:g}"
        cells = [_mean_sd([x[key] for x in rows]) for key in ("auroc", "max_abs_delta_logit", "mean_kl")]
        lines.append(f"| {bound} | {' | '.join(cells)} |")
    return "\n".join(lines)


def parse_bounds(text: str | None) -> tuple[float, ...] | None:
    """``--bound-sweep 2,6,20`` → (2.0, 6.0, 20.0); a bad entry is a :class:`TSVError` naming it."""
    if not text:
        return None
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise TSVError(f"--bound-sweep takes comma-separated numbers like 2,6,20; "
                           f"{part.strip()!r} is not one") from None
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m steer_ui.methods.tsv --data FILE``: train on the embedded model and print the AUROC table."""
    import argparse
    import json
    import sys
    import time

    p = argparse.ArgumentParser(prog="python -m steer_ui.methods.tsv", description=main.__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--max-rows", type=int, default=None, help="subsample whole groups (questions) to this many rows")
    p.add_argument("--layer", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None, help="epochs of each stage (default 20)")
    p.add_argument("--exemplars", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds (e.g. 0,1,2): one run per seed (its own split, exemplars and "
                        "initialisation), reported as mean ± sd")
    p.add_argument("--max-logit-change", type=float, default=None, help="the |Δlogit| bound (default 2.0)")
    p.add_argument("--bound-sweep", default=None,
                   help="comma-separated extra |Δlogit| bounds (e.g. 6,20): one more constrained run per bound, "
                        "reported as AUROC against the bound")
    p.add_argument("--json", help="also write the full report here")
    args = p.parse_args(argv)
    from ..data import load_dataset
    from ..model.loading import load_model

    dataset = load_dataset(args.data)
    handle = load_model(args.model)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    reports = []
    for seed in seeds:
        hp = {"seed": seed, "max_rows": args.max_rows, "exemplars": args.exemplars,
              "max_logit_change": args.max_logit_change, "bound_sweep": parse_bounds(args.bound_sweep)}
        if args.epochs is not None:
            hp["epochs"] = args.epochs
        start = time.perf_counter()
        _vector, report = train(handle, dataset, layer=args.layer,
                                progress=lambda f, m: print(f"[{f:4.0%}] {m}", file=sys.stderr, flush=True),
                                **{k: v for k, v in hp.items() if v is not None})
        report["seconds"] = round(time.perf_counter() - start, 1)
        reports.append(report)
        print(f"seed {seed}:\n" if len(seeds) > 1 else "", end="")
        print(table_markdown(report))
        print(f"\nrows {report['rows']}, layer {report['layer']}, λ = {report['lam']} × mean norm = "
              f"{report['lam_raw']:.1f}, pseudo-labels {report['pseudo_labels'].get('counts')}, "
              f"{report['seconds']} s\n", flush=True)
    if len(reports) > 1:
        print(seeds_markdown(reports))
    if reports[0]["bound_sweep"]:
        print("\n" + bounds_markdown(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports[0] if len(reports) == 1 else reports, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
