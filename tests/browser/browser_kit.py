"""What every browser test shares: where Chromium is, how to launch it, a free port, loading data in the page."""
from __future__ import annotations

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


def upload_statements(page) -> None:
    """Data tab: upload the bundled capitals statements and wait for the summary."""
    page.get_by_role("tab", name="Data").click()
    page.locator("#data-file input[type=file]").set_input_files(str(ROOT / "assets/datasets/capitals_statements.csv"))
    page.wait_for_function("() => document.querySelector('#data-summary').innerText.includes('capitals_statements')",
                           timeout=30_000)

