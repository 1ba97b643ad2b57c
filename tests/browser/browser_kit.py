"""What every browser test shares: where Chromium is, how to launch it, a free port, loading data in the page."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from app_process import free_port, served  # noqa: F401 (re-exported for the browser tests)

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[2]
NEEDS_CHROMIUM = pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed at /usr/bin/chromium "
                                                                  "(apt-get install -y chromium); browser tests skipped")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@contextmanager
def drawn_figure(browser, fig, width: int, height: int = 700):
    """A page ``width`` px wide with the plotly figure ``fig`` drawn by plotly.js as the app draws it (responsive),
    its legend in place; closed after."""
    page = browser.new_page(viewport={"width": width, "height": height})
    try:
        page.set_content(fig.to_html(include_plotlyjs=True, full_html=True, config={"responsive": True}))
        page.wait_for_selector(".legend", timeout=30_000)
        yield page
    finally:
        page.close()


def tiny_library_backend(folder, **service_kwargs):
    """A door on the tiny llama with a library in ``folder`` and the default view (a named vector, a calibrated α
    range), as the app starts; its stated 256 positions raised to 1,024, which long links and three chat turns
    of byte-level text outgrow (its rotary positions have no table, so nothing else limits them)."""
    from steer_ui.policy import Policy
    from steer_ui.service import Service
    from steer_ui.store import open_library

    policy = Policy()
    backend = Service(workdir=folder, policy=policy, default_view=True,
                      library=open_library(str(folder / "library.db"), policy), **service_kwargs)
    backend.load_model("tiny:llama")
    backend.handle.model.config.max_position_embeddings = 1024
    return backend


def upload_statements(page) -> None:
    """Data tab: upload the bundled capitals statements and wait for the summary."""
    page.get_by_role("tab", name="Data").click()
    page.locator("#data-file input[type=file]").set_input_files(str(ROOT / "assets/datasets/capitals_statements.csv"))
    page.wait_for_function("() => document.querySelector('#data-summary').innerText.includes('capitals_statements')",
                           timeout=30_000)

