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

One module per concern: :mod:`.maths` (tensors only), :mod:`.data` (rows,
the safe prompt template, the split), :mod:`.settings`, :mod:`.training`
(the loop, baselines, the report), :mod:`.scoring` (checking a vector,
detection), :mod:`.labelling` (generate-and-label).  The docs/tsv.md tables and
their command live in :mod:`steer_ui.tools.tsv_tables`.
"""
from __future__ import annotations

from ...vector import SteeringVector
from ..base import Progress, StaticMethod, noop, parse_settings
from ..common import clean, sub_progress
from . import training
from .data import (CLASSES, PROMPT_TEMPLATE, TSVError, format_text, pick_exemplars, prefix_text, rows_of,
                   split_groups, subsample_groups, template_pieces)
from .labelling import (MAX_SHOTS, QA_PRIMER, answer_prompt, clean_answer, generate_and_label,
                        generate_answers, is_question_table, label_balance, labelling_rule, labelling_summary,
                        question_table)
from .maths import class_probs, ema_prototypes, select_confident, sinkhorn
from .scoring import check_vector, detect, score
from .settings import TSVSettings, default_layer

GENERATE_SHARE = 0.2  # of the progress bar, when the model answers the questions first


class TSVMethod(StaticMethod):
    """The registry's ``tsv``: a fixed direction at one layer, plus prototypes for detection."""

    name = "tsv"
    label = "TSV (truthfulness separator)"
    Settings = TSVSettings

    def train(self, handle, dataset, settings: TSVSettings,
              progress: Progress = noop, answers_cache=None) -> tuple[SteeringVector, dict]:
        """Train on ``dataset``; on TruthfulQA-shaped data (``generate="auto"``), on the model's own answers.

        ``answers_cache``: a folder for the generated answers (the report tools
        pass one under the cache root; the service keeps none on disk).
        """
        progress = progress or noop
        generated = None
        if generates(settings, dataset):
            generated = dataset = generate_and_label(handle, dataset, sub_progress(progress, 0.0, GENERATE_SHARE),
                                                     template=settings.template, cache_dir=answers_cache,
                                                     shots=settings.answer_shots)
            if generated.empty:
                raise TSVError.from_key("tsv_answers_empty", count=generated.attrs["empty_answers"])
            progress = sub_progress(progress, GENERATE_SHARE, 1.0)
        vector, report = training.train(handle, dataset, settings, progress)
        if generated is not None:
            report["labelling"] = labelling_summary(generated)
            report["generated"] = clean(generated[["prompt", "completion", "label", "similarity_correct",
                                                   "similarity_incorrect"]].to_dict("records"))
        else:
            report["labelling"] = {"answers": "the dataset's own labelled rows"}
        return vector, report

    def check(self, handle, vector: SteeringVector) -> None:
        """Refuse a vector this method cannot score with on ``handle``'s model (see :func:`.check_vector`)."""
        check_vector(handle, vector)

    # A detector: the service's and the CLI's ``detect`` look for these two.
    def score(self, handle, vector: SteeringVector, pairs) -> list[float]:
        return score(handle, vector, pairs)

    def detect(self, handle, vector: SteeringVector, dataset) -> dict:
        return detect(handle, vector, dataset)


METHOD = TSVMethod()


def generates(settings: TSVSettings, dataset) -> bool:
    """Whether training first answers the questions with the model (``generate``; auto: TruthfulQA-shaped data)."""
    if settings.generate == "auto":
        return is_question_table(dataset)
    return settings.generate == "yes"


def train(handle, dataset, settings: TSVSettings | None = None, progress: Progress | None = None,
          answers_cache=None, **values) -> tuple[SteeringVector, dict]:
    """Train a TSV; returns (SteeringVector, report).

    ``settings`` is a :class:`TSVSettings`, or give its fields (and the alias
    ``epochs``) as keywords: they go through
    :func:`~steer_ui.methods.base.parse_settings`, so bounds hold and unknown
    names are refused.  See :func:`.training.train` for the report.
    """
    if settings is None:
        settings = parse_settings(TSVSettings, values)
    elif values:
        raise TypeError("give a TSVSettings or keyword settings, not both")
    return METHOD.train(handle, dataset, settings, progress or noop, answers_cache=answers_cache)


__all__ = ["CLASSES", "MAX_SHOTS", "METHOD", "PROMPT_TEMPLATE", "QA_PRIMER", "answer_prompt", "TSVError", "TSVMethod", "TSVSettings", "check_vector",
           "class_probs", "clean_answer", "default_layer", "detect", "ema_prototypes", "format_text",
           "generate_and_label", "generate_answers", "generates", "is_question_table", "label_balance", "labelling_rule", "labelling_summary", "pick_exemplars", "prefix_text", "question_table", "rows_of", "score",
           "select_confident", "sinkhorn", "split_groups", "subsample_groups", "template_pieces", "train"]
