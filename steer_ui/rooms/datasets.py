"""A session's dataset: the bundled ones, uploads read within the limits, summaries and splits."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import names
from ..messages import Said, UserError
from ..sessions import frame_bytes
from .common import Shared, dataset_refusal, expected_errors, said_of

DATASETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "datasets"
DATASET_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")


def bundled_datasets() -> list[str]:
    if not DATASETS_DIR.is_dir():
        return []
    return sorted(p.name for p in DATASETS_DIR.iterdir() if p.suffix.lower() in DATASET_SUFFIXES)


@dataclass
class Datasets:
    shared: Shared

    def _loaded(self, session: str | None):
        """The session and its dataset; refused when it has none."""
        s = self.shared.find(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        return s

    def read(self, path: Path, schema: str | None = None):
        """A dataset file read and validated within the upload limits (one line when refused)."""
        from ..data import load_dataset

        try:
            return load_dataset(path, schema=None if schema in (None, "", "auto") else schema,
                                max_bytes=self.shared.max_file_bytes,
                                max_cell_chars=self.shared.policy.max_prompt_chars)
        except expected_errors() + (UnicodeDecodeError,) as exc:
            raise dataset_refusal(path.name, exc) from None

    def upload(self, session: str | None, path: str | Path | None, schema: str | None = None,
               bundled: str | None = None) -> dict:
        """Read and validate a dataset; on success it replaces the session's data, on failure nothing changes."""
        if bundled:
            if bundled not in bundled_datasets():
                raise UserError("unknown_bundled", name=bundled, known=", ".join(bundled_datasets()) or "none")
            path = DATASETS_DIR / bundled
        if not path:
            raise UserError("no_file")
        path = Path(path)
        names.checked(path.name)  # the dataset's name, shown as it is
        if not path.is_file():
            raise UserError("file_missing", name=path.name)
        size, limit = path.stat().st_size, self.shared.max_file_bytes
        if size > limit:
            raise UserError("file_too_large", name=path.name, size=size >> 20, limit=limit >> 20)
        from ..data import load_dataset
        try:
            dataset = load_dataset(path, schema=None if schema in (None, "", "auto") else schema,
                                   max_bytes=limit, max_cell_chars=self.shared.policy.max_prompt_chars)
        except expected_errors() + (UnicodeDecodeError,) as exc:
            raise dataset_refusal(path.name, exc) from None
        s = self.shared.find(session)
        held = frame_bytes(s.dataset)  # the dataset this one replaces does not count
        self.shared.sessions.check_bytes(s, frame_bytes(dataset) - held)
        self.shared.keeper.keep_dataset(s, path, path.name)  # bundled ones too: stored once, however many keep them
        s.dataset, s.dataset_name, s.probe = dataset, path.name, None
        return self.summary(session)

    def summary(self, session: str | None) -> dict:
        s = self._loaded(session)
        dataset = s.dataset
        summary = dataset.summary() if hasattr(dataset, "summary") else {}
        out = {"name": s.dataset_name, "kind": getattr(dataset, "kind", ""), "rows": int(len(dataset.frame)),
               "columns": [str(c) for c in dataset.frame.columns],
               "warnings": [w if isinstance(w, Said) else str(w) for w in getattr(dataset, "warnings", [])]}
        if isinstance(summary, dict):
            out["summary"] = summary
        return out

    def preview(self, session: str | None, rows: int = 50) -> pd.DataFrame:
        return self._loaded(session).dataset.frame.head(rows).copy()

    def class_balance(self, session: str | None) -> pd.DataFrame:
        """Counts per label, and per train/test split when the data module can split by group."""
        s = self._loaded(session)
        frame = s.dataset.frame
        try:
            from ..data import split_by_group

            parts = [("train", p.frame) for p in split_by_group(s.dataset, seed=0)[:1]] + \
                    [("test", p.frame) for p in split_by_group(s.dataset, seed=0)[1:]]
        except Exception:  # e.g. too few groups to split: plain counts still help
            parts = [(None, frame)]
        counts = []
        for name, part in parts:
            if "label" in part:
                c = part["label"].value_counts().sort_index()
                counts.append(pd.DataFrame({"label": c.index.astype(str), "count": c.values}))
            else:  # contrastive pairs: one bar of pairs per split
                counts.append(pd.DataFrame({"label": ["pairs"], "count": [len(part)]}))
            if name is not None:
                counts[-1]["split"] = name
        return pd.concat(counts, ignore_index=True)

    def held_out_pairs(self, session: str | None) -> list:
        """The loaded dataset's contrastive pairs in the held-out groups (the split training uses)."""
        from ..data.datasets import group_split
        from ..methods.l2s.pairs import as_pairs

        s = self._loaded(session)
        try:
            pairs = as_pairs(s.dataset)
            _train, test = group_split([pair.group for pair in pairs])
        except expected_errors() as exc:
            raise UserError("compare_needs_pairs", detail=said_of(exc)) from None
        return [pairs[i] for i in test]
