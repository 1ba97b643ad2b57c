"""The per-token Δlogit chart keeps its token names readable at any length (a browser review found the names of
64 tokens running into each other on a wide chart, and into the legend under them): the figure
``plots.per_token_delta`` draws, in plotly.js in a real Chromium, measured: no two shown names overlap, and the
legend starts below the lowest name."""
from __future__ import annotations

import pandas as pd
import pytest

from browser_kit import NEEDS_CHROMIUM, browser, drawn_figure  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM]
WORDS = ("The weather in Paris today is sunny and warm with a light breeze from the south west while people walk "
         "along the river enjoying the afternoon").split()


def _boxes(browser, tokens: int, width: int) -> tuple[list[dict], dict]:
    from steer_ui import plots

    frame = pd.DataFrame({"position": range(tokens), "token": [" " + WORDS[i % len(WORDS)] for i in range(tokens)],
                          "delta_logit": [((i * 7) % 11) - 5.0 for i in range(tokens)],
                          "direct_delta_logit": [((i * 5) % 7) - 3.0 for i in range(tokens)]})
    with drawn_figure(browser, plots.per_token_delta(frame), width) as page:
        names = page.evaluate("() => Array.from(document.querySelectorAll('.xtick text')).map((t) => "
                              "{ const r = t.getBoundingClientRect(); return {text: t.textContent, left: r.left, "
                              "right: r.right, top: r.top, bottom: r.bottom}; }).filter((b) => b.text)")
        legend = page.evaluate("() => { const r = document.querySelector('.legend').getBoundingClientRect(); "
                               "return {top: r.top, bottom: r.bottom}; }")
        return names, legend


def _overlapping(names: list[dict]) -> list[tuple[str, str]]:
    """Pairs of names whose glyphs overlap: rotated text's box is its bounding rectangle, so two neighbours at -45°
    overlap when each one's box reaches into the other's by more than a slanted line's slack; compare the boxes'
    centres' distance with the text's height instead."""
    out = []
    for a, b in zip(names, names[1:]):
        a_mid, b_mid = (a["left"] + a["right"]) / 2, (b["left"] + b["right"]) / 2
        upright = a["bottom"] - a["top"] > a["right"] - a["left"]
        # upright names stand side by side: their boxes must not meet; slanted ones are apart by the centres'
        # horizontal distance times sin 45°, which must exceed the line's height (~12 px)
        if upright and a["right"] > b["left"] + 0.5 or not upright and (b_mid - a_mid) * 0.707 < 11.5:
            out.append((a["text"], b["text"]))
    return out


@pytest.mark.parametrize("tokens, width", [(8, 700), (64, 1366), (64, 700), (128, 1366), (32, 390)])
def test_token_names_never_overlap_each_other_or_the_legend(browser, tokens, width):
    names, legend = _boxes(browser, tokens, width)
    assert names, "no token names drawn"
    assert _overlapping(names) == []
    assert legend["top"] >= max(n["bottom"] for n in names) - 0.5, (legend, max(n["bottom"] for n in names))
