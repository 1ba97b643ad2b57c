"""Pure functions: pandas frames in, plotly figures out.

Nothing here touches a model or gradio, so every chart the app shows can be
built (and tested) from the same frames the CLI prints.  Titles and axis
labels come in through ``labels`` so the UI can pass translated strings;
numbers and token strings are never translated.
"""
from __future__ import annotations

import html
import textwrap
from typing import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

UNSTEERED_COLOR = "#7f8c9a"
STEERED_COLOR = "#e8590c"
# One colour language (issue #36): red = promoted, purple = suppressed, the colours gradio's HighlightedText gives
# positive and negative scores, so the coloured steered text and every Δlogit chart read the same way.
UP_COLOR = "#ef443c"
DOWN_COLOR = "#805ad5"
READABLE_COLOR = "#2f9e44"  # the dose-response chart's "readable" zone
DIRECT_COLOR = "#1c7ed6"


def _label(labels: Mapping[str, str] | None, key: str, default: str) -> str:
    return (labels or {}).get(key, default)


def _text(value) -> str:
    """A string from a file, a link or the vocabulary as chart text: plotly renders tags in labels and titles
    (``<b>``, ``<a href>``), so every ``<`` and ``&`` is escaped and shows as itself."""
    return html.escape(str(value), quote=False)


def _show_token(token: str, limit: int | None = None) -> str:
    """Make whitespace and unprintable characters visible: a bar labelled ' ', '\\n' or a box is unreadable.

    Control and other unprintable characters are shown escaped (``\\n``, ``\\u2581``); edge spaces as ``·``;
    past ``limit`` characters the name is cut with "…"; the result is chart text (:func:`_text`).
    """
    if token.strip() == "":
        text = repr(token)[1:-1]
    else:
        text = "".join(ch if _glyph(ch) else (repr(ch)[1:-1] if not ch.isprintable() else f"\\u{ord(ch):04x}")
                       for ch in token)
    text = text.replace(" ", "·") if text.strip() != text else text
    return _text(text if limit is None or len(text) <= limit else text[:limit - 1] + "…")


def _glyph(ch: str) -> bool:
    """Whether ``ch`` draws as itself in a chart font (not a box): printable, not private-use or a marker such
    as SentencePiece's ▁ or the replacement character."""
    import unicodedata

    return ch.isprintable() and ch not in "\u2581\ufffd" and unicodedata.category(ch) not in ("Co", "Cn", "Cs")


def wrap_title(text: str, width: int = 46) -> str:
    """``text`` broken into lines of at most ``width`` columns with ``<br>`` (plotly does not wrap titles: a long
    one ran off a half-width chart).  CJK characters count two columns and may break anywhere; other words break
    at spaces."""
    import re
    import unicodedata

    lines, line, used = [], "", 0
    for piece in re.findall(r"[\u2e80-\u9fff\uff00-\uffef]|[^\s\u2e80-\u9fff\uff00-\uffef]+|\s+", text):
        cols = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in piece)
        if piece.isspace():
            if line:
                line, used = line + " ", used + 1
            continue
        if line and used + cols > width:
            carry = line[-1] if line[-1] in "（(「【" else ""  # an opening bracket starts the next line
            lines.append(line[: len(line) - len(carry)].rstrip())
            line, used = carry, 2 * len(carry)
        line, used = line + piece, used + cols
    return "<br>".join(lines + [line.rstrip()] if line else lines)


def _white_template() -> go.layout.Template:
    """plotly_white's layout (white ground, light grid, its colours and fonts) without its defaults for some 25
    trace types, polar, ternary, geo and 3-D scenes: plotly validates and deep-copies a template into every figure,
    and a slider move builds two charts.  The next-token bars took 65 ms to build and 7.7 kB to send with the
    full one, 39 ms and 1.9 kB with this (python -m steer_ui.tools.chart_cost, two runs on two cores)."""
    import plotly.io as pio

    full = pio.templates["plotly_white"].layout.to_plotly_json()
    keep = ("font", "paper_bgcolor", "plot_bgcolor", "xaxis", "yaxis", "colorway", "hovermode", "hoverlabel", "title",
            "shapedefaults", "annotationdefaults", "autotypenumbers")
    return go.layout.Template(layout={k: full[k] for k in keep if k in full})


TEMPLATE = _white_template()
MODEBAR_PX = 30  # plotly's toolbar row at the top: titles start below it, so it never covers their words


def _layout(fig: go.Figure, title: str, height: int = 320, **kwargs) -> go.Figure:
    if "<br>" not in title:  # plotly does not wrap: a long title was cut at a half-width chart's edge (issue #52)
        title = wrap_title(title)
    # plotly lifts a title with a <sup> line about 10 px above its anchor, under the chart's own label: lowered
    below = MODEBAR_PX + (12 if "<sup>" in title else 0)
    top = below + 40 + 18 * title.count("<br>")  # room for the toolbar and every title line
    # the legend goes under the chart: at the top right it sat under the toolbar and over long titles
    fig.update_layout(title=dict(text=title, font=dict(size=14), yref="container", y=1 - below / height,
                                 yanchor="top"),
                      height=height, margin=dict(l=50, r=20, t=top, b=40), template=TEMPLATE,
                      legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0.0), **kwargs)
    return fig


def empty_figure(message: str = "", height: int = 260) -> go.Figure:
    """A blank chart with a centred note (used before there is anything to show)."""
    fig = go.Figure()
    # plotly does not wrap annotations: a long note ran off both edges of a narrow chart
    message = "<br>".join(textwrap.wrap(message, 44)) if message else message
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=13, color="#868e96"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, "", height=height)


BAR_NAME_CHARS = 14  # a longer token is cut with "…" under its bars (whole in their hover)


def next_token_bars(unsteered: pd.DataFrame, steered: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Grouped bars of next-token probability over the union of both top-k lists.

    ``unsteered`` / ``steered``: frames with ``token``, ``token_id`` and ``prob``
    (``analysis.NextTokenView``).  A token in one top-k but not the other gets
    its probability from the other frame when present, else 0 (outside top-k).
    """
    u = unsteered.set_index("token_id")
    s = steered.set_index("token_id")
    ids = list(dict.fromkeys(list(u.index) + list(s.index)))
    names = {**dict(zip(s.index, s.token)), **dict(zip(u.index, u.token))}
    frame = pd.DataFrame({
        "token_id": ids,
        "token": [_show_token(names[i], BAR_NAME_CHARS) for i in ids],
        "whole": [_show_token(names[i]) for i in ids],
        "unsteered": [float(u.prob.get(i, 0.0)) for i in ids],
        "steered": [float(s.prob.get(i, 0.0)) for i in ids],
    })
    frame = frame.sort_values("steered", ascending=False, kind="stable")
    # Two tokens can decode to the same text; keep bars apart by suffixing the id.
    dup = frame.token.duplicated(keep=False)
    frame.loc[dup, "token"] = frame.loc[dup, "token"] + " #" + frame.loc[dup, "token_id"].astype(str)
    fig = go.Figure([
        go.Bar(name=_label(labels, side, side), x=frame.token, y=frame[side], customdata=frame.whole,
               marker_color=color, hovertemplate="%{customdata}: %{y:.4f}<extra></extra>")
        for side, color in (("unsteered", UNSTEERED_COLOR), ("steered", STEERED_COLOR))])
    fig.update_yaxes(title_text=_label(labels, "probability", "probability"), rangemode="tozero")
    # every bar its token (dtick 1): on a phone's chart plotly showed every other label and left half the bars
    # unnamed
    fig.update_xaxes(type="category", dtick=1)  # no tickangle: plotly's own choice, upright when slanted collide
    # the names stand upright on a half-width chart, and with the legend at a share of the plot's height under
    # them a longer one ran under it ("excellent" read "excelk"): room under the axis for the longest name
    # standing, then the legend, measured from the chart's bottom
    names_px = int(7 * max((len(html.unescape(t)) for t in frame.token), default=1)) + 12
    _layout(fig, _label(labels, "title", "Next token: unsteered vs steered"), height=300 + names_px, barmode="group")
    fig.update_layout(margin=dict(b=names_px + 40), legend=dict(yref="container", y=0.0, yanchor="bottom"))
    return fig


def delta_logit_bars(promoted: pd.DataFrame, suppressed: pd.DataFrame, max_abs_delta_logit: float | None = None,
                     max_delta_token: str | None = None, labels: Mapping[str, str] | None = None,
                     exploding: bool = False, rule: str | None = None) -> go.Figure:
    """Horizontal bars: the tokens steering pushes up most and down most (Δlogit).

    ``max_abs_delta_logit`` (on ``max_delta_token``) is shown under the title with ``rule``, the words that
    say what it was measured over; ``exploding`` (the caller's verdict, analysis.NextTokenView.exploding)
    flags the title: that is the logit explosion, where one token swamps the distribution.
    """
    frame = pd.concat([promoted.assign(kind="up"), suppressed.assign(kind="down")], ignore_index=True)
    frame = frame.sort_values("delta_logit", kind="stable")
    # text even when no token moved (a push too small to change any likely token left both frames empty, and an
    # empty column of floats refused the " #id" added below: the slider at α = 1e-8 failed, a hostile probe)
    frame["label"] = pd.Series([_show_token(t) + ("" if k == "up" else " ") for t, k in zip(frame.token, frame.kind)],
                               index=frame.index, dtype=object)
    dup = frame.label.duplicated(keep=False)
    frame.loc[dup, "label"] = frame.loc[dup, "label"] + " #" + frame.loc[dup, "token_id"].astype(str)
    colors = [UP_COLOR if d >= 0 else DOWN_COLOR for d in frame.delta_logit]
    if "prob_steered" in frame:  # each bar's probability before → after, in the hover (and for tests, customdata)
        fig = go.Figure(go.Bar(x=frame.delta_logit, y=frame.label, orientation="h", marker_color=colors,
                               customdata=frame[["prob_unsteered", "prob_steered"]].to_numpy(),
                               hovertemplate="%{y}: Δlogit %{x:.3f}, p %{customdata[0]:.2%} → "
                                             "%{customdata[1]:.2%}<extra></extra>"))
    else:
        fig = go.Figure(go.Bar(x=frame.delta_logit, y=frame.label, orientation="h", marker_color=colors,
                               hovertemplate="%{y}: Δlogit %{x:.3f}<extra></extra>"))
    title = wrap_title(_label(labels, "title", "Δlogit: most promoted and suppressed tokens"))
    if max_abs_delta_logit is not None:  # on a second line, so a narrow chart does not cut it off
        detail = f"{rule or 'max |Δlogit|'} = {max_abs_delta_logit:.2f}"
        if max_delta_token is not None:  # plotly titles take HTML: '<pad>' must stay text
            detail += f" {_label(labels, 'on_token', 'on')} {repr(_show_token(max_delta_token))}"
        if exploding:
            title = "⚠ " + title
            detail += " — " + _label(labels, "exploded", "logits exploding")
        title += f"<br><sup>{detail}</sup>"
    fig.update_xaxes(title_text="Δlogit", zeroline=True, zerolinecolor="#495057")
    # every bar labelled: plotly drops every other category label when they crowd, so each gets its own tick and
    # its own 18 px
    fig.update_yaxes(type="category", tickmode="array", tickvals=list(frame.label), ticktext=list(frame.label),
                     automargin=True)
    height = max(320, 18 * len(frame) + 110)
    return _layout(fig, title, height=height)


def per_token_delta(tokens: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Δlogit of each steered token along the generation: actual vs direct-effect estimate.

    ``tokens``: ``position``, ``token``, ``delta_logit`` (steered logit minus the
    unsteered model's logit on the same prefix) and ``direct_delta_logit``
    (the part that flows straight along the residual stream to the logits:
    the steering's additions put on the unsteered final residual, through
    the final norm and the unembedding; see
    :func:`steer_ui.model.generation.direct_delta_logit`).
    """
    x = [f"{p}:{_show_token(t)}" for p, t in zip(tokens.position, tokens.token)]
    fig = go.Figure([
        go.Scatter(x=x, y=tokens.delta_logit, mode="lines+markers", name=_label(labels, "actual", "actual Δlogit"),
                   line=dict(color=STEERED_COLOR)),
        go.Scatter(x=x, y=tokens.direct_delta_logit, mode="lines+markers",
                   name=_label(labels, "direct", "direct effect (skip path, through the final norm)"), line=dict(color=DIRECT_COLOR, dash="dot")),
    ])
    # Upright names where there are many: at -45° the names of 64 tokens on a wide chart ran into each other (a
    # browser review), and standing they need no more room than a line's height each.  The margin under the axis
    # holds the longest name, then the legend, measured from the chart's bottom (where the legend sat at a fixed
    # share of the plot's height, longer names ran into it).
    upright = len(x) > 20
    longest = max((len(name) for name in x), default=0)
    names_px = int(6 * longest * (1.0 if upright else 0.71)) + 12
    fig.update_xaxes(type="category", tickangle=-90 if upright else -45)
    fig.update_yaxes(title_text="Δlogit", zeroline=True)
    _layout(fig, _label(labels, "title", "Per-token Δlogit of the steered generation"), height=260 + names_px + 50)
    fig.update_layout(margin=dict(b=names_px + 50), legend=dict(yref="container", y=0.0, yanchor="bottom"))
    return fig


DOSE_METRICS = ("kl", "entropy", "max_abs_delta_logit", "target_prob")


READABLE_KL = 5.0  # nats; the same bound that calibrates the α slider (steer_ui.default_view.KL_AT_MAX)


def readable_zone(frame: pd.DataFrame, alpha_column: str = "alpha") -> tuple[float, float] | None:
    """The contiguous α interval around the smallest |α| whose KL stays at or under :data:`READABLE_KL`."""
    ordered = frame.sort_values(alpha_column)
    alphas, kl = ordered[alpha_column].to_numpy(dtype=float), ordered["kl"].to_numpy(dtype=float)
    if not len(alphas):
        return None
    centre = int(abs(alphas).argmin())
    if not kl[centre] <= READABLE_KL:
        return None
    lo = hi = centre
    while lo > 0 and kl[lo - 1] <= READABLE_KL:
        lo -= 1
    while hi < len(alphas) - 1 and kl[hi + 1] <= READABLE_KL:
        hi += 1
    return float(alphas[lo]), float(alphas[hi])


def dose_response(frame: pd.DataFrame, current_alpha: float | None = None, alpha_column: str = "alpha",
                  labels: Mapping[str, str] | None = None) -> go.Figure:
    """KL, entropy, max |Δlogit| (and the target token's probability) against α, current α marked.

    Max |Δlogit| lives on a second y-axis: it grows linearly and would flatten
    the other curves.
    """
    fig = go.Figure()
    x = frame[alpha_column]
    fig.add_trace(go.Scatter(x=x, y=frame.kl, name=_label(labels, "kl", "KL(unsteered‖steered)"), mode="lines+markers"))
    fig.add_trace(go.Scatter(x=x, y=frame.entropy, name=_label(labels, "entropy", "entropy (nats)"), mode="lines+markers"))
    if "target_prob" in frame:
        token = str(frame.get("target_token", pd.Series([""])).iloc[0])
        fig.add_trace(go.Scatter(x=x, y=frame.target_prob, mode="lines+markers",
                                 name=_label(labels, "target", "p(target)") + f" {_show_token(token)!r}"))
    fig.add_trace(go.Scatter(x=x, y=frame.max_abs_delta_logit, name=_label(labels, "max_delta", "max |Δlogit|"),
                             mode="lines", line=dict(dash="dash", color="#868e96"), yaxis="y2"))
    zone = readable_zone(frame, alpha_column)
    if zone is not None:  # where the text stays readable: the slider's calibrated range lives here
        fig.add_vrect(x0=zone[0], x1=zone[1], fillcolor=READABLE_COLOR, opacity=0.08, line_width=0, layer="below",
                      annotation_text=_label(labels, "readable", f"KL ≤ {READABLE_KL:g} nats"),
                      # inside the plot, under its top edge: the α marker's label sits above that edge, so the
                      # two never share a line (at the top they overlapped whenever α was near the zone's edge); on a
                      # backing of its own, since a curve near the top ran through its words (a browser review)
                      annotation_position="inside top left", annotation_bgcolor="rgba(255, 255, 255, 0.85)")
    if current_alpha is not None:
        fig.add_vline(x=float(current_alpha), line=dict(color=STEERED_COLOR, width=2),
                      annotation_text=f"α = {float(current_alpha):.4g}", annotation_position="top")
    fig.update_xaxes(title_text="α")
    return _layout(fig, _label(labels, "title", "Dose-response"),
                   yaxis2=dict(overlaying="y", side="right", title=_label(labels, "max_delta", "max |Δlogit|"),
                               showgrid=False))


def layer_norms(norms: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Mean residual norm per layer (``layer``, ``norm``): what relative α = 1 means at each layer."""
    fig = go.Figure(go.Bar(x=norms.layer, y=norms.norm, marker_color=DIRECT_COLOR,
                           hovertemplate="layer %{x}: %{y:.1f}<extra></extra>"))
    fig.update_xaxes(title_text=_label(labels, "layer", "layer"), dtick=1)
    fig.update_yaxes(title_text=_label(labels, "norm", "mean ‖h‖"))
    return _layout(fig, _label(labels, "title", "Residual-stream norm per layer"))


def probe_layers(frame: pd.DataFrame, best_layer: int | None = None, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Held-out probe AUROC (and accuracy, and any other numeric column) per layer; best layer marked."""
    fig = go.Figure()
    for column in [c for c in frame.columns if c != "layer" and pd.api.types.is_numeric_dtype(frame[c])]:
        fig.add_trace(go.Scatter(x=frame.layer, y=frame[column], mode="lines+markers", name=column))
    if best_layer is not None:
        fig.add_vline(x=best_layer, line=dict(color=STEERED_COLOR, dash="dot"),
                      annotation_text=_label(labels, "best", "best") + f" = {best_layer}")
    fig.update_xaxes(title_text=_label(labels, "layer", "layer"), dtick=1)
    fig.update_yaxes(range=[0, 1.02])
    return _layout(fig, _label(labels, "title", "Per-layer probe (held-out)"))


def margin_curves(alphas: Sequence[float], margins: Sequence[Sequence[float]], alpha: float | None = None,
                  labels: Mapping[str, str] | None = None) -> go.Figure:
    """Every prompt's margin log p(positive) − log p(negative) over α (thin lines) and their mean (thick)."""
    fig = go.Figure()
    for i, row in enumerate(margins):
        fig.add_trace(go.Scatter(x=list(alphas), y=list(row), mode="lines", line=dict(color=UNSTEERED_COLOR, width=1),
                                 opacity=0.45, showlegend=i == 0, name=_label(labels, "prompt", "one prompt"),
                                 hovertemplate="α %{x:.4g}: %{y:.3f}<extra></extra>"))
    if len(margins):
        mean = [float(sum(col) / len(col)) for col in zip(*margins)]
        fig.add_trace(go.Scatter(x=list(alphas), y=mean, mode="lines+markers", line=dict(color=STEERED_COLOR, width=4),
                                 name=_label(labels, "mean", "mean")))
    fig.add_hline(y=0, line=dict(color="#495057", width=1))
    if alpha is not None:
        fig.add_vline(x=float(alpha), line=dict(color=STEERED_COLOR, dash="dot"),
                      annotation_text=f"α = {float(alpha):.4g}", annotation_position="top")
    fig.update_xaxes(title_text="α")
    fig.update_yaxes(title_text=_label(labels, "margin", "log p(positive) − log p(negative)"))
    return _layout(fig, _label(labels, "title", "Margin over α, per prompt"), height=360)


def slope_histogram(slopes: Sequence[float], labels: Mapping[str, str] | None = None) -> go.Figure:
    """How many prompts steer the intended way (slope > 0, right of the line) and how many against it."""
    # one colour: a bar may hold prompts on both sides of 0; the line at 0 splits intended from anti-steerable
    fig = go.Figure(go.Histogram(x=list(slopes), nbinsx=max(5, min(30, len(slopes))), marker_color=STEERED_COLOR))
    fig.add_vline(x=0, line=dict(color="#495057", width=2))
    fig.update_xaxes(title_text=_label(labels, "slope", "steerability (margin per unit α)"))
    fig.update_yaxes(title_text=_label(labels, "count", "prompts"))
    return _layout(fig, _label(labels, "title", "Steerability of each prompt"), height=360)


def training_curves(curves: pd.DataFrame, x: str = "epoch", labels: Mapping[str, str] | None = None) -> go.Figure:
    """One line per numeric column against ``x`` (loss, accuracy, ...).  A ``stage`` column over ``x`` that keeps
    counting (TSV's two stages, epochs 1-5 then 6-10) keeps one line per column with a dotted mark where each later
    stage starts; where ``x`` starts again each stage has lines of its own."""
    fig = go.Figure()
    metrics = [c for c in curves.columns if c not in (x, "stage") and pd.api.types.is_numeric_dtype(curves[c])]
    staged = "stage" in curves
    continued = staged and curves[x].is_monotonic_increasing and curves[x].is_unique
    groups = curves.groupby("stage", sort=False) if staged and not continued else [(None, curves)]
    for stage, part in groups:
        for column in metrics:
            shown = _label(labels, column, column)  # a column's name in words where the labels have one
            name = shown if stage is None else f"{shown} ({stage})"
            fig.add_trace(go.Scatter(x=part[x], y=part[column], mode="lines+markers", name=name))
    if continued:  # one line per measure: eight legend entries for TSV's four left its chart a sliver (a review)
        for stage, part in list(curves.groupby("stage", sort=False))[1:]:
            fig.add_vline(x=float(part[x].iloc[0]) - 0.5, line_dash="dot", line_color=UNSTEERED_COLOR,
                          annotation_text=_text(_label(labels, "stage", "stage {stage}").format(stage=stage)),
                          annotation_position="top")
    fig.update_xaxes(title_text=_label(labels, "x_title", _label(labels, x, x)))
    height = 320 + 20 * max(0, len(fig.data) - 2)  # the legend lists the lines under the chart, one a row
    _layout(fig, _label(labels, "title", "Training curves"), height=height)
    # the legend below the axis title, measured from the chart's bottom: placed within the plot area it ran over
    # the axis title and scrolled inside the chart
    fig.update_layout(margin=dict(b=60 + 20 * len(fig.data)),
                      legend=dict(yref="container", y=0.0, yanchor="bottom"))
    return fig


def loss_curve(curve: pd.DataFrame, best_epoch: int | None = None,
               labels: Mapping[str, str] | None = None) -> go.Figure:
    """Train and validation loss per epoch (columns ``epoch``, ``train_loss``, ``validation_loss``; a missing
    value leaves a gap, e.g. no train loss at epoch 0), with a dashed line at the epoch early stopping kept."""
    fig = go.Figure()
    for column, name, color in (("train_loss", _label(labels, "train", "train loss"), STEERED_COLOR),
                                ("validation_loss", _label(labels, "validation", "validation loss"), DIRECT_COLOR)):
        if column in curve:
            fig.add_trace(go.Scatter(x=curve["epoch"], y=curve[column], mode="lines+markers", name=name,
                                     line=dict(color=color), marker=dict(size=4)))
    if best_epoch is not None:
        fig.add_vline(x=best_epoch, line_dash="dash", line_color=UNSTEERED_COLOR,
                      annotation_text=_label(labels, "kept", "kept: epoch {epoch}").format(epoch=best_epoch))
    fig.update_xaxes(title_text=_label(labels, "x_title", "epoch"))
    fig.update_yaxes(title_text=_label(labels, "loss", "loss"))
    return _layout(fig, _label(labels, "title", "Training curves"))


def head_heatmap(accuracy: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """ITI's layer × head probe accuracy (rows = layers, columns = heads); NaN cells stay blank."""
    fig = go.Figure(go.Heatmap(
        z=accuracy.to_numpy(dtype=float), x=[str(c) for c in accuracy.columns], y=[str(i) for i in accuracy.index],
        colorscale="Viridis", colorbar={"title": _label(labels, "accuracy", "accuracy")},
        hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>",
    ))
    fig.update_xaxes(title_text=_label(labels, "head", "head"))
    fig.update_yaxes(title_text=_label(labels, "layer", "layer"), autorange="reversed")
    return _layout(fig, _label(labels, "title", "ITI: per-head probe accuracy"), height=360)


def class_balance(counts: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Bars of ``count`` per ``label``, optionally split by ``split`` (train/test)."""
    if "split" in counts:  # the split's name in the chart's language (the data's own labels stay as they are)
        names = {"train": _label(labels, "split_train", "train"), "test": _label(labels, "split_test", "test")}
        fig = go.Figure([go.Bar(name=names.get(split, _text(split)), x=[_text(v) for v in part.label],
                                y=part["count"]) for split, part in counts.groupby("split", sort=False)])
    else:
        fig = go.Figure(go.Bar(x=[_text(v) for v in counts.label], y=counts["count"], marker_color=DIRECT_COLOR))
    fig.update_xaxes(type="category")
    return _layout(fig, _label(labels, "title", "Class balance"), barmode="group", height=280)


def detection_scores(scores: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Histogram of p(truthful) (``score``), split by ``label`` when the answers are labelled."""
    fig = go.Figure()
    if "label" in scores and scores.label.notna().any():
        for label, part in scores.groupby("label", sort=True):
            fig.add_trace(go.Histogram(x=part.score, name=_text(label), opacity=0.7, xbins=dict(start=0, end=1, size=0.05)))
        fig.update_layout(barmode="overlay")
    else:
        fig.add_trace(go.Histogram(x=scores.score, xbins=dict(start=0, end=1, size=0.05), marker_color=DIRECT_COLOR))
    fig.update_xaxes(title_text=_label(labels, "score", "p(truthful)"), range=[0, 1])
    return _layout(fig, _label(labels, "title", "Detection scores"))


def vocab_projection(frame: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """v·W_Uᵀ extremes (``direction`` +/-, ``token``, ``projection``): what the vector says through lm_head alone."""
    part = frame.sort_values("projection", kind="stable")
    text = [_show_token(t) for t in part.token]
    colors = [UP_COLOR if p >= 0 else DOWN_COLOR for p in part.projection]
    fig = go.Figure(go.Bar(x=part.projection, y=[f"{t} #{i}" for t, i in zip(text, part.token_id)], orientation="h",
                           marker_color=colors))
    fig.update_yaxes(type="category")
    return _layout(fig, _label(labels, "title", "Vector through the unembedding (v·W_U)"),
                   height=max(320, 16 * len(part) + 90))
