"""Shared fixtures: tiny random models (fast, built here) and the embedded Gemma 3 270M (integration)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRUTHFULQA = SHARED / "data" / "truthfulqa" / "TruthfulQA.csv"
# TruthfulQA (Apache-2.0) stays outside the project: these tests use it where a checkout has ../shared beside
# it, and a clone of the project alone skips them (docs/tsv.md: where to get the file).
NEEDS_TRUTHFULQA = pytest.mark.skipif(not TRUTHFULQA.is_file(), reason=f"TruthfulQA.csv is not at {TRUTHFULQA} "
                                      "(it is not part of this repository; docs/tsv.md says where to get it)")
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
    """The embedded Gemma 3 270M (CPU, default weights: int8 on its own GGUF codes), loaded once per test session."""
    from steer_ui.model.loading import load_model

    return load_model()


# ------------------------------------------------------------------ the app a hostile client meets (tests/security)
# One app for the hostile-client suites: ``python app.py`` in its own process, on the embedded model, over HTTP,
# exactly as a lab would start it (default policy, the queue closed to direct POSTs), but for one setting: every
# client of the whole suite comes from 127.0.0.1, and a session used in the last minute counts as holding work,
# so a fast run reached one address's default share (64) and the suites after it were refused "busy" (CI, stop
# 39).  A room of colleagues comes from many addresses; the default share is tested on an app of its own
# (test_session_flood.py).  A sampler records its peak resident memory for the whole run
# (tests/security/test_peak_memory.py checks it last).  Defined here, not in a conftest of its own: two conftest
# modules would both be importable as ``conftest``.
@pytest.fixture(scope="session")
def server(tmp_path_factory):
    from app_process import running

    with running(["--model", "embedded", "--wait", "--sessions-per-address", "256"],
                 tmp_path_factory.mktemp("server") / "app.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def honest(server):
    """The honest session: call it after an attack to check its numbers and generation are exactly as before
    (``honest(full=False)``: the numbers only); checked in full once more when the module's tests are done."""
    from hostile_kit import watch

    unchanged = watch(server)
    yield unchanged
    unchanged()


@pytest.fixture
def queued_event():
    """A context manager: inside, code runs as a queued gradio event's handler does (gradio's LocalContext holds
    the app and an event id), where a toast reaches the page; an event outside the queue has neither
    (ui/common.toast_reaches_page).  gradio finds no such job and drops the toast's message."""
    from contextlib import contextmanager

    @contextmanager
    def queued(event_id: str = "event-1"):
        import gradio as gr
        from gradio.context import LocalContext

        blocks, event = LocalContext.blocks.set(gr.Blocks()), LocalContext.event_id.set(event_id)
        try:
            yield
        finally:
            LocalContext.blocks.reset(blocks)
            LocalContext.event_id.reset(event)

    return queued
