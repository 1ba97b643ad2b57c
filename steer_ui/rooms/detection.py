"""Detection: p(truthful) per (prompt, answer) from a detector vector (TSV), or AUROC over a labelled file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..messages import UserError, said_of
from .common import Shared, expected_errors
from .datasets import Datasets
from .library import Library
from .models import Models
from .training import Training


@dataclass
class Detection:
    shared: Shared
    models: Models
    library: Library
    datasets: Datasets
    training: Training

    def _pairs(self, answers) -> list[tuple[str, str]]:
        """The typed (prompt, answer) rows with an answer, within the limits (each scored unsteered and steered)."""
        try:
            pairs = [(str(p or ""), str(a)) for p, a in (answers or []) if str(a or "").strip()]
        except (TypeError, ValueError):  # not (prompt, answer) pairs
            raise UserError("answers_table") from None
        if not pairs:
            raise UserError("no_answers")
        limit = self.shared.policy.max_detect_answers
        if len(pairs) > limit:
            raise UserError("too_many_answers", count=len(pairs), limit=limit)
        # each answer is scored after its prompt, unsteered and steered
        self.shared.guard.texts(self.models.handle, [p + a for p, a in pairs], "answer", rows=2)
        return pairs

    def detect(self, session: str | None, vector_name: str, answers: list[tuple[str, str]] | None = None,
               path: str | Path | None = None, schema: str | None = None) -> dict:
        """p(truthful) per (prompt, answer) from a detector vector (TSV); AUROC when a labelled file is given."""
        from ..methods.base import method_of

        vector = self.library.get_vector(session, vector_name)
        method = method_of(vector)
        if method is None or not hasattr(method, "score"):  # only detector methods can score answers
            raise UserError("not_tsv", name=vector_name, method=vector.method)
        s = self.shared.find(session)
        if path:  # a labelled file: read within the upload limits, at most max_train_rows rows
            dataset = self.datasets.read(Path(path), schema)
            self.shared.guard.dataset(self.models.handle, dataset)
        else:
            pairs = self._pairs(answers)
        handle = self.models.handle
        try:
            # one job at a time on the model: Cancel and the time limit reach it while it waits for the model;
            # scoring itself is bounded by policy.max_detect_answers
            with self.training.job(s, handle, kind="detect"):
                if path:
                    out = method.detect(handle, vector, dataset)
                else:
                    scores = method.score(handle, vector, pairs)
                    out = {"scores": [{"prompt": p, "answer": a, "score": float(sc)}
                                      for (p, a), sc in zip(pairs, list(scores))]}
        except UserError:
            raise
        except expected_errors() as exc:
            raise UserError("detect_failed", detail=said_of(exc)) from None
        return out
