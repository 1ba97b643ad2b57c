"""Shared fixtures: tiny random models (fast, built here) and the embedded Gemma 3 270M (integration)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRUTHFULQA = SHARED / "data" / "truthfulqa" / "TruthfulQA.csv"
DATASETS = ROOT / "assets" / "datasets"

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny():
    """Factory: tiny(family) -> ModelHandle of a random-initialised 4-layer model (cached per family)."""
    from steer_ui.tiny import tiny_handle

    made = {}

    def make(family: str = "llama"):
        if family not in made:
            made[family] = tiny_handle(family)
        return made[family]

    return make


@pytest.fixture(scope="session")
def gemma():
    """The embedded Gemma 3 270M (float32, CPU), loaded once per test session."""
    from steer_ui.model.loading import load_model

    return load_model()
