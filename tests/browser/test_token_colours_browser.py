"""The steered tokens' colours keep their text readable (a browser review found dark text on the strongest red at
3.95:1): gr.HighlightedText, as Explore configures it, given the strongest scores ``explore_tab.shade`` gives, in
a real Chromium, measured by the page-wide contrast check."""
from __future__ import annotations

import pytest

from browser_kit import NEEDS_CHROMIUM, browser, free_port  # noqa: F401 (fixture)
from contrast_kit import low_contrast

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM]
TOKENS = {"promoted", "suppressed", "mild", "none"}  # the page's own footer is not under test (the app styles it)


def _page_with(browser, tokens):
    import gradio as gr

    with gr.Blocks() as demo:
        gr.HighlightedText(value=tokens, show_legend=False, combine_adjacent=False, elem_id="steered-text")
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    page = browser.new_page(viewport={"width": 900, "height": 600})
    page.goto(f"http://127.0.0.1:{port}/")
    page.wait_for_selector("#steered-text", timeout=30_000)
    return demo, page


def test_the_strongest_promoted_and_suppressed_tokens_stay_readable(browser):
    from steer_ui.ui.explore_tab import COLOUR_SCALE, shade

    strongest = [(" promoted", shade(100.0)), (" suppressed", shade(-100.0)), (" mild", shade(COLOUR_SCALE / 3)),
                 (" none", shade(None))]
    assert 0 < strongest[0][1] < 1 and -1 < strongest[1][1] < 0
    demo, page = _page_with(browser, strongest)
    try:
        assert [f for f in low_contrast(page) if f["text"] in TOKENS] == []
    finally:
        page.close()
        demo.close()
    # and the full strength the colours had before is what the check refuses
    demo, page = _page_with(browser, [(" promoted", 1.0), (" suppressed", -1.0)])
    try:
        assert {f["text"] for f in low_contrast(page)} >= {"promoted", "suppressed"}  # the check can fail
    finally:
        page.close()
        demo.close()
