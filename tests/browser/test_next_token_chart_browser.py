"""The next-token bars keep their token names readable (the screenshots of this session showed "excellent" as
"excelk": the names plotly stands upright ran under the legend): the figure ``plots.next_token_bars`` draws, in
plotly.js in a real Chromium, measured: every name drawn whole (a long one shortened with "…", whole in its
hover), inside the chart, and the legend below the lowest name."""
from __future__ import annotations

import pandas as pd
import pytest

from browser_kit import NEEDS_CHROMIUM, browser, drawn_figure  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM]
WORDS = (" excellent", " wonderful", " the", ",", " fantastic", " a", " beautiful", " amazing", " not",
         " unbelievably", " I", " extraordinarily", " good", " well")


def _measure(browser, words, width: int):
    from steer_ui import plots

    n = len(words)
    unsteered = pd.DataFrame({"token": list(words), "token_id": range(n),
                              "prob": [0.02 + 0.01 * (i % 5) for i in range(n)]})
    steered = pd.DataFrame({"token": list(words), "token_id": range(n), "prob": [0.1 - 0.005 * i for i in range(n)]})
    fig = plots.next_token_bars(unsteered, steered)
    with drawn_figure(browser, fig, width) as page:
        names = page.evaluate("() => Array.from(document.querySelectorAll('.xtick text')).map((t) => "
                              "{ const r = t.getBoundingClientRect(); return {text: t.textContent, bottom: r.bottom};"
                              " }).filter((b) => b.text)")
        legend = page.evaluate("() => document.querySelector('.legend').getBoundingClientRect().top")
        chart = page.evaluate("() => document.querySelector('.main-svg').getBoundingClientRect().bottom")
        return fig, names, legend, chart


@pytest.mark.parametrize("width", [1366, 700, 390])
def test_every_token_name_is_drawn_whole_above_the_legend(browser, width):
    fig, names, legend, chart = _measure(browser, WORDS, width)
    assert len(names) == len(WORDS)
    lowest = max(n["bottom"] for n in names)
    assert legend >= lowest - 0.5 and lowest <= chart, (legend, lowest, chart)
    shown = {n["text"] for n in names}
    assert "·excellent" in shown and "·unbelievably" in shown  # short enough to stay whole
    assert any(t.endswith("…") and t.startswith("·extraordin") for t in shown), shown
    # shortened on the axis, whole in the hover
    assert any(" extraordinarily" in str(c) or "·extraordinarily" in str(c) for c in fig.data[0].customdata)
