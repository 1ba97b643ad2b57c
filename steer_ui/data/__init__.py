"""Datasets (reading, validation, splits) and batched activation extraction."""
from .datasets import (
    KINDS,
    MAX_BYTES,
    MAX_ROWS,
    SCHEMAS,
    Dataset,
    DatasetError,
    detect_schema,
    group_split,
    load_dataset,
    split_by_group,
    split_indices,
)

__all__ = ["KINDS", "MAX_BYTES", "MAX_ROWS", "SCHEMAS", "Dataset", "DatasetError", "detect_schema", "group_split", "load_dataset",
           "split_by_group", "split_indices"]
