"""The figure builders are pure functions of frames: check the numbers land where the reader looks."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import pytest

from steer_ui import plots


def _top(tokens, ids, probs):
    return pd.DataFrame({"rank": range(1, len(ids) + 1), "token": tokens, "token_id": ids, "prob": probs,
                         "logit": [0.0] * len(ids)})


def test_next_token_bars_cover_the_union_with_both_probabilities():
    unsteered = _top(["a", "b", "c"], [1, 2, 3], [0.5, 0.3, 0.1])
    steered = _top(["d", "a", "b"], [4, 1, 2], [0.6, 0.2, 0.1])
    fig = plots.next_token_bars(unsteered, steered)
    assert isinstance(fig, go.Figure) and fig.layout.barmode == "group"
    u, s = fig.data
    assert list(u.x) == list(s.x) == ["d", "a", "b", "c"]  # sorted by the steered probability
    assert list(s.y) == [0.6, 0.2, 0.1, 0.0]  # 'c' fell out of the steered top-k
    assert list(u.y) == [0.0, 0.5, 0.3, 0.1]
    assert fig.layout.xaxis.dtick == 1  # every bar named: a phone's chart showed every other token


def test_next_token_bars_keep_same_text_tokens_apart_and_show_whitespace():
    unsteered = _top([" ", "x"], [10, 11], [0.5, 0.4])
    steered = _top(["x", "x"], [11, 12], [0.7, 0.2])
    fig = plots.next_token_bars(unsteered, steered)
    labels = list(fig.data[0].x)
    assert len(set(labels)) == 3
    assert "x #11" in labels and "x #12" in labels
    assert "·" in labels  # a bare space is drawn visibly


def test_delta_logit_bars_flag_the_explosion_when_told_and_state_their_rule():
    promoted = pd.DataFrame({"token": ["up"], "token_id": [1], "delta_logit": [3.0]})
    suppressed = pd.DataFrame({"token": ["down"], "token_id": [2], "delta_logit": [-2.0]})
    calm = plots.delta_logit_bars(promoted, suppressed, 3.0, "up", labels={"exploded": "BOOM"},
                                  rule="max centred |Δlogit|, likely tokens")
    assert "BOOM" not in calm.layout.title.text and "likely tokens = 3.00" in calm.layout.title.text
    wild = plots.delta_logit_bars(promoted.assign(delta_logit=[250.0]), suppressed, 250.0, "up",
                                  labels={"exploded": "BOOM"}, exploding=True)
    assert "BOOM" in wild.layout.title.text
    bar = wild.data[0]
    assert list(bar.x) == [-2.0, 250.0]  # ascending, so the biggest push is on top
    assert bar.marker.color[0] == plots.DOWN_COLOR and bar.marker.color[1] == plots.UP_COLOR


def test_per_token_delta_has_actual_and_direct_series():
    frame = pd.DataFrame({"position": [0, 1], "token": ["Hi", " there"], "delta_logit": [1.5, -0.5],
                          "direct_delta_logit": [1.0, 0.2]})
    fig = plots.per_token_delta(frame, labels={"actual": "A", "direct": "D"})
    assert [t.name for t in fig.data] == ["A", "D"]
    assert list(fig.data[0].y) == [1.5, -0.5] and list(fig.data[1].y) == [1.0, 0.2]
    assert fig.data[0].x[1] == "1:·there"


def test_dose_response_marks_current_alpha_and_uses_second_axis_for_max_delta():
    frame = pd.DataFrame({"alpha": [-1.0, 0.0, 1.0], "kl": [0.3, 0.0, 0.4], "entropy": [2.0, 2.1, 1.5],
                          "max_abs_delta_logit": [5.0, 0.0, 5.0], "target_token": ["x"] * 3,
                          "target_prob": [0.1, 0.2, 0.6]})
    fig = plots.dose_response(frame, current_alpha=0.5)
    names = [t.name for t in fig.data]
    assert len(names) == 4 and any("'x'" in n for n in names)
    assert list([t for t in fig.data if t.yaxis == "y2"][0].y) == [5.0, 0.0, 5.0]
    shapes = [s for s in fig.layout.shapes if s.type == "line"]
    assert shapes and shapes[0].x0 == 0.5
    without_target = plots.dose_response(frame.drop(columns=["target_prob", "target_token"]), None)
    # without a current α only the readable-zone band is drawn, no α line
    assert len(without_target.data) == 3 and not [s for s in without_target.layout.shapes if s.type == "line"]


def test_probe_layers_and_training_curves_and_balance():
    probe = pd.DataFrame({"layer": [0, 1, 2], "auroc": [0.5, 0.9, 0.8], "accuracy": [0.5, 0.85, 0.7]})
    fig = plots.probe_layers(probe, best_layer=1)
    assert {t.name for t in fig.data} == {"auroc", "accuracy"}
    assert fig.layout.shapes[0].x0 == 1
    curves = pd.DataFrame({"epoch": [1, 2, 1, 2], "loss": [1.0, 0.5, 0.8, 0.4], "stage": ["1", "1", "2", "2"]})
    assert len(plots.training_curves(curves).data) == 2
    # stages over epochs that keep counting (TSV's): one line a measure, a dotted mark where stage 2 starts
    curves = pd.DataFrame({"epoch": [1, 2, 3, 4], "stage": [1, 1, 2, 2], "loss": [1.0, 0.5, 0.4, 0.3],
                           "exemplar_accuracy": [0.5, 0.6, 0.7, 0.8], "steering_scale": [None] * 4})
    fig = plots.training_curves(curves, labels={"loss": "损失", "stage": "阶段 {stage}"})
    assert [t.name for t in fig.data] == ["损失", "exemplar_accuracy"] and list(fig.data[0].x) == [1, 2, 3, 4]
    assert [s.x0 for s in fig.layout.shapes] == [2.5] and fig.layout.annotations[-1].text == "阶段 2"
    counts = pd.DataFrame({"label": ["0", "1", "0", "1"], "count": [10, 12, 3, 4], "split": ["train"] * 2 + ["test"] * 2})
    fig = plots.class_balance(counts)
    assert [t.name for t in fig.data] == ["train", "test"] and list(fig.data[1].y) == [3, 4]


def test_layer_norms_detection_vocab_and_empty():
    fig = plots.layer_norms(pd.DataFrame({"layer": [0, 1], "norm": [10.0, 30.0]}))
    assert list(fig.data[0].y) == [10.0, 30.0]
    scores = pd.DataFrame({"score": [0.1, 0.9, 0.8], "label": [0, 1, 1]})
    assert len(plots.detection_scores(scores).data) == 2
    assert len(plots.detection_scores(scores.drop(columns=["label"])).data) == 1
    proj = pd.DataFrame({"direction": ["+", "-"], "token": ["a", "b"], "token_id": [1, 2], "projection": [2.0, -1.0]})
    assert list(plots.vocab_projection(proj).data[0].x) == [-1.0, 2.0]
    empty = plots.empty_figure("nothing yet")
    assert empty.layout.annotations[0].text == "nothing yet"


@pytest.mark.parametrize("token, shown", [("a", "a"), (" ", "·"), ("\n", "\\n"), (" the", "·the")])
def test_whitespace_is_visible(token, shown):
    assert plots._show_token(token) == shown


def test_head_heatmap_from_an_iti_report():
    import math

    from steer_ui import plots
    from steer_ui.ui.train_tab import find_head_heatmap

    report = {"heatmap": [[0.5, 0.9], [float("nan"), 0.7], [0.6, 0.55]]}
    frame = find_head_heatmap(report)
    assert frame.shape == (3, 2)
    fig = plots.head_heatmap(frame, labels={"title": "T"})
    z = fig.data[0].z
    assert z[0][1] == 0.9 and math.isnan(z[1][0]) and fig.layout.title.text == "T"
    assert find_head_heatmap({"curves": []}) is None


def test_unprintable_tokens_are_shown_escaped_not_as_boxes():
    from steer_ui.plots import _show_token

    assert _show_token("\u2581x") == "\\u2581x"
    assert _show_token("a\x00b") == "a\\x00b"
    assert _show_token("\ue000") == "\\ue000"  # private use: no glyph in any chart font
    assert _show_token("\n") == "\\n" and _show_token(" the") == "·the" and _show_token("中文") == "中文"


def test_a_long_delta_title_breaks_onto_a_second_line():
    import pandas as pd

    from steer_ui.plots import delta_logit_bars

    frame = pd.DataFrame({"token": ["a"], "token_id": [1], "delta_logit": [12.0]})
    fig = delta_logit_bars(frame, frame.assign(delta_logit=-12.0), 12.0, "xia")
    assert "<br>" in fig.layout.title.text and fig.layout.margin.t > 45


def test_the_dose_response_chart_shades_the_readable_zone():
    import pandas as pd

    from steer_ui.plots import dose_response, readable_zone

    frame = pd.DataFrame({"alpha": [-2, -1, 0, 1, 2, 3], "kl": [9.0, 4.0, 0.0, 3.0, 5.0, 12.0],
                          "entropy": [1.0] * 6, "max_abs_delta_logit": [1.0] * 6})
    assert readable_zone(frame) == (-1.0, 2.0)
    shapes = dose_response(frame, current_alpha=1.0).layout.shapes
    assert any(s.type == "rect" and (s.x0, s.x1) == (-1.0, 2.0) for s in shapes)
    # its label on a backing of its own: a curve near the chart's top ran through its words
    (label,) = [a for a in dose_response(frame).layout.annotations if "KL" in a.text]
    assert label.bgcolor and label.bgcolor != "rgba(0,0,0,0)"
    assert readable_zone(frame.assign(kl=[9.0, 9.0, 6.0, 9.0, 9.0, 9.0])) is None


def test_loss_curve_draws_both_losses_and_marks_the_kept_epoch():
    curve = pd.DataFrame({"epoch": [0, 1, 2, 3], "train_loss": [None, 0.9, 0.7, 0.5],
                          "validation_loss": [1.0, 0.8, 0.75, 0.9]})
    fig = plots.loss_curve(curve, best_epoch=2, labels={"title": "T"})
    train, val = fig.data
    assert train.name == "train loss" and val.name == "validation loss"
    assert list(val.x) == [0, 1, 2, 3] and list(val.y) == [1.0, 0.8, 0.75, 0.9]
    assert train.y[0] is None or train.y[0] != train.y[0]  # no train loss before the first epoch: a gap
    (line,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert line.x0 == line.x1 == 2
    assert fig.layout.title.text == "T"
    assert not plots.loss_curve(curve).layout.shapes  # no kept epoch given, no marker


def test_promoted_and_suppressed_have_the_colours_of_the_coloured_steered_text():
    """One colour language (issue #36): the Δlogit bars use the colours gradio's HighlightedText, which shows the
    steered text, gives positive and negative scores (read from the installed gradio, so an upgrade that changes
    them fails here)."""
    import re
    from pathlib import Path

    import gradio

    assets = Path(gradio.__file__).parent / "templates/frontend/assets"
    source = next(text for text in (p.read_text(errors="ignore") for p in assets.glob("Index-*.js"))
                  if "class_or_confidence" in text and "rgba(239" in text)
    negative, positive = re.search(r"e<0\?`rgba\((\d+, \d+, \d+), \$\{-e\}\)`:`rgba\((\d+, \d+, \d+), ", source).groups()
    rgb = lambda hex_: ", ".join(str(int(hex_[i:i + 2], 16)) for i in (1, 3, 5))  # noqa: E731
    assert rgb(plots.UP_COLOR) == positive and rgb(plots.DOWN_COLOR) == negative


def test_wrap_title_keeps_lines_inside_a_half_width_chart_in_both_scripts():
    import unicodedata

    def columns(line):
        return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)

    english = "Δlogit: most promoted (red) and suppressed (purple) likely tokens (p ≥ 0.1 % before or after)"
    chinese = "Δlogit：提升（红）和压低（紫）最多的可能词元（引导前或后 p ≥ 0.1%）"
    for text in (english, chinese):
        lines = plots.wrap_title(text, 46).split("<br>")
        assert len(lines) >= 2 and all(columns(line) <= 46 for line in lines), lines
        assert "".join(lines).replace(" ", "") == text.replace(" ", "")  # nothing lost, only breaks added
        assert not any(line.endswith(("（", "(")) for line in lines)
    assert plots.wrap_title("short title") == "short title"


def test_charts_carry_plotly_whites_look_without_its_defaults_for_other_traces():
    """The app's template keeps plotly_white's ground, grid and colours; a chart's JSON is a quarter of what the
    full template made it (steer_ui.tools.chart_cost also times the build)."""
    import plotly.io as pio

    from steer_ui.tools.chart_cost import measure

    white = pio.templates["plotly_white"].layout
    for name in ("paper_bgcolor", "plot_bgcolor", "colorway"):
        assert plots.TEMPLATE.layout[name] == white[name]
    assert plots.TEMPLATE.layout.xaxis.gridcolor == white.xaxis.gridcolor
    (app, _, app_bytes), (full, _, full_bytes) = measure(repeats=1)
    assert app.startswith("app") and full == "plotly_white"
    assert app_bytes * 3 < full_bytes


def test_delta_logit_bars_with_no_token_moved_is_an_empty_chart_not_an_error():
    """A push too small to move any likely token (the slider at α = 1e-8) leaves both frames empty."""
    empty = pd.DataFrame({"token": [], "token_id": [], "delta_logit": []})
    fig = plots.delta_logit_bars(empty, empty, 0.0, None, rule="max centred |Δlogit|, likely tokens")
    assert len(fig.data[0].x) == 0 and "likely tokens = 0.00" in fig.layout.title.text
