"""Pure functions for the Concepts tab: frames from :mod:`steer_ui.concepts` in, plotly figures out.

Same conventions as :mod:`steer_ui.plots`: titles and axis names arrive
through ``labels`` (translated by the UI); numbers and token strings are
shown as they are.
"""
from __future__ import annotations

from typing import Mapping

import pandas as pd
import plotly.graph_objects as go

from .plots import DIRECT_COLOR, READABLE_COLOR, STEERED_COLOR, UNSTEERED_COLOR, _label, _layout, _show_token, \
    wrap_title

FIXED_COLOR = READABLE_COLOR
WARN_COLOR = "#c92a2a"  # an exploded logit, the slow path: not a Δlogit sign, so not the promoted/suppressed pair


def _tokens(frame: pd.DataFrame) -> list[str]:
    """Display names for tokens, suffixed with the id where two decode to the same text."""
    names = [_show_token(t) for t in frame["token"]]
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    return [f"{n} #{i}" if seen[n] > 1 else n for n, i in zip(names, frame["token_id"])]


# ------------------------------------------------------------------- lm_head
def row_norm_histogram(histogram: pd.DataFrame, stats: Mapping[str, float] | None = None,
                       labels: Mapping[str, str] | None = None) -> go.Figure:
    """Histogram of ‖W_U[t]‖ over the vocabulary (``concepts.row_norms``), mean marked."""
    centres = (histogram["bin_start"] + histogram["bin_end"]) / 2
    width = float((histogram["bin_end"] - histogram["bin_start"]).iloc[0]) if len(histogram) else 1.0
    fig = go.Figure(go.Bar(x=centres, y=histogram["count"], width=width or None, marker_color=DIRECT_COLOR,
                           customdata=histogram[["bin_start", "bin_end"]].values,
                           hovertemplate="[%{customdata[0]:.4f}, %{customdata[1]:.4f}): %{y}<extra></extra>"))
    if stats:
        fig.add_vline(x=float(stats["mean"]), line_dash="dash", line_color=STEERED_COLOR,
                      annotation_text=f"{_label(labels, 'mean', 'mean')} {float(stats['mean']):.4g}")
    fig.update_xaxes(title_text=_label(labels, "norm", "row norm ‖W_U[t]‖"))
    fig.update_yaxes(title_text=_label(labels, "tokens", "tokens"), rangemode="tozero")
    return _layout(fig, _label(labels, "title", "Norms of the lm_head rows"), bargap=0.02)


# ------------------------------------------------------------------ sampling
def sampling_bars(frame: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Probability before (temperature 1, no filters) and after the sampler's filters, per token.

    Tokens a filter removed keep their grey bar and get no coloured one;
    their tick label is struck through with ✗.
    """
    names = _tokens(frame)
    kept = frame["kept_top_p"].tolist()
    ticks = [n if k else f"✗ {n}" for n, k in zip(names, kept)]
    fig = go.Figure([
        go.Bar(name=_label(labels, "raw", "softmax(logits)"), x=ticks, y=frame["prob"], marker_color=UNSTEERED_COLOR,
               hovertemplate="%{x}: %{y:.4f}<extra></extra>"),
        go.Bar(name=_label(labels, "tempered", "after penalty and temperature"), x=ticks, y=frame["prob_tempered"],
               marker_color=DIRECT_COLOR, hovertemplate="%{x}: %{y:.4f}<extra></extra>"),
        go.Bar(name=_label(labels, "final", "after top-k and top-p (sampled from)"), x=ticks, y=frame["final_prob"],
               marker_color=STEERED_COLOR, hovertemplate="%{x}: %{y:.4f}<extra></extra>"),
    ])
    fig.update_xaxes(type="category", tickangle=-35)
    fig.update_yaxes(title_text=_label(labels, "probability", "probability"), rangemode="tozero")
    return _layout(fig, _label(labels, "title", "Next token: logits → probabilities → filters"), height=360,
                   barmode="group")


def sample_bars(frame: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Sampled frequency next to the probability it was drawn from (``concepts.sample_many``)."""
    names = _tokens(frame)
    n = frame.attrs.get("n")
    title = _label(labels, "title", "Sampled {n} times: frequency vs probability").replace("{n}", str(n or ""))
    fig = go.Figure([
        go.Bar(name=_label(labels, "probability", "probability"), x=names, y=frame["probability"],
               marker_color=STEERED_COLOR, hovertemplate="%{x}: %{y:.4f}<extra></extra>"),
        go.Bar(name=_label(labels, "frequency", "frequency"), x=names, y=frame["frequency"],
               marker_color=DIRECT_COLOR, customdata=frame["count"],
               hovertemplate="%{x}: %{y:.3f} (%{customdata})<extra></extra>"),
    ])
    fig.update_xaxes(type="category", tickangle=-35)
    fig.update_yaxes(title_text=_label(labels, "share", "share"), rangemode="tozero")
    return _layout(fig, title, height=340, barmode="group")


# -------------------------------------------------------- logit explosion
def explosion_bars(exploded: Mapping[str, float], fixed: Mapping[str, float] | None, bound: float | None = None,
                   labels: Mapping[str, str] | None = None) -> go.Figure:
    """|Δlogit| measures for the aligned vector and its constrained version, log scale, bound marked.

    ``exploded`` / ``fixed``: ``SteeredRun.as_dict()`` (keys ``naive_direct``,
    ``direct``, ``delta_logit``, ``max_abs_centred_delta_logit``).  The last bar is the centred change (Δlogit
    minus its vocabulary mean), the quantity the bound limits.
    """
    keys = ["naive_direct", "direct", "delta_logit", "max_abs_centred_delta_logit"]
    defaults = {"naive_direct": "α·v·W_U[t]", "direct": "direct path Δlogit(t)", "delta_logit": "Δlogit(t)",
                "max_abs_centred_delta_logit": "max |centred Δlogit|"}
    # each name on lines of its own under its bars: slanted, the longer names ran out of a half-width chart
    x = [wrap_title(_label(labels, k, defaults[k]), width=14) for k in keys]
    floor = 1e-3  # a log axis cannot show 0

    def values(run):
        return [max(abs(float(run[k])), floor) for k in keys]

    # each bar's value stands upright over it: side by side, two bars' values ran into one ("0.09180.0918")
    shown = dict(textposition="outside", textangle=-90, cliponaxis=False)
    traces = [go.Bar(name=_label(labels, "exploded", "aligned vector"), x=x, y=values(exploded),
                     marker_color=WARN_COLOR, text=[f"{float(exploded[k]):.3g}" for k in keys], **shown)]
    if fixed:
        traces.append(go.Bar(name=_label(labels, "fixed", "after the constraint"), x=x, y=values(fixed),
                             marker_color=FIXED_COLOR, text=[f"{float(fixed[k]):.3g}" for k in keys], **shown))
    fig = go.Figure(traces)
    fig.update_xaxes(tickangle=0)
    if bound:
        fig.add_hline(y=float(bound), line_dash="dash", line_color="#495057",
                      annotation_text=f"{_label(labels, 'bound', 'bound')} {float(bound):g}")
    fig.update_yaxes(type="log", title_text=_label(labels, "abs_logit", "|Δlogit| (log scale)"))
    return _layout(fig, _label(labels, "title", "The logit explosion and its fix"), height=360, barmode="group")


def constraint_curve(curve: pd.DataFrame, bound: float | None = None,
                     labels: Mapping[str, str] | None = None) -> go.Figure:
    """max |centred Δlogit| (left, log; what the bound is on) and cosine to the original vector (right) per step."""
    fig = go.Figure()
    if len(curve):
        fig.add_trace(go.Scatter(x=curve["step"], y=curve["max_abs_delta_logit"].clip(lower=1e-3), mode="lines",
                                 name=_label(labels, "max_delta", "max |Δlogit|"), line=dict(color=WARN_COLOR)))
        fig.add_trace(go.Scatter(x=curve["step"], y=curve["cosine"], mode="lines", yaxis="y2",
                                 name=_label(labels, "cosine", "cosine to the original"),
                                 line=dict(color=DIRECT_COLOR, dash="dot")))
    if bound:
        fig.add_hline(y=float(bound), line_dash="dash", line_color="#495057")
    fig.update_xaxes(title_text=_label(labels, "step", "step"))
    fig.update_yaxes(type="log", title_text=_label(labels, "max_delta", "max |Δlogit|"))
    return _layout(fig, _label(labels, "title", "Constrained optimisation"), height=320,
                   yaxis2=dict(overlaying="y", side="right", range=[-1.05, 1.05],
                               title=_label(labels, "cosine", "cosine to the original")))


# ---------------------------------------------------------------- KV cache
def bytes_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def kv_cache_chart(table: pd.DataFrame, current: int | None = None,
                   labels: Mapping[str, str] | None = None) -> go.Figure:
    """Cache size vs sequence length (log-log): this model's KV heads, full multi-head, sliding windows."""
    attrs = table.attrs
    series = [("bytes", _label(labels, "this", "this model ({kv} KV heads)").replace("{kv}", str(attrs.get("kv_heads", "?"))),
               STEERED_COLOR, "solid"),
              ("bytes_mha", _label(labels, "mha", "full multi-head ({h} KV heads)").replace(
                  "{h}", str(attrs.get("attention_heads", "?"))), UNSTEERED_COLOR, "dash")]
    if "bytes_sliding" in table:
        series.append(("bytes_sliding", _label(labels, "sliding", "with sliding-window layers"), FIXED_COLOR, "dot"))
    fig = go.Figure()
    for column, name, colour, dash in series:
        fig.add_trace(go.Scatter(x=table["seq_len"], y=table[column], mode="lines+markers", name=name,
                                 line=dict(color=colour, dash=dash),
                                 customdata=[bytes_text(v) for v in table[column]],
                                 hovertemplate="%{x}: %{customdata}<extra></extra>"))
    if current:
        fig.add_vline(x=int(current), line_dash="dot", line_color="#495057")
    fig.update_xaxes(type="log", title_text=_label(labels, "seq_len", "sequence length (tokens)"))
    fig.update_yaxes(type="log", title_text=_label(labels, "bytes", "cache bytes"))
    return _layout(fig, _label(labels, "title", "KV cache size vs sequence length"), height=340)


def cache_timing_chart(steps: pd.DataFrame, labels: Mapping[str, str] | None = None) -> go.Figure:
    """Seconds per generated token with and without the KV cache (``concepts.time_cache``)."""
    fig = go.Figure([
        go.Scatter(x=steps["step"], y=steps["with_cache_s"] * 1000, mode="lines+markers",
                   name=_label(labels, "with", "with cache"), line=dict(color=FIXED_COLOR)),
        go.Scatter(x=steps["step"], y=steps["without_cache_s"] * 1000, mode="lines+markers",
                   name=_label(labels, "without", "without cache"), line=dict(color=WARN_COLOR)),
    ])
    fig.update_xaxes(title_text=_label(labels, "step", "generated token"))
    fig.update_yaxes(title_text=_label(labels, "ms", "milliseconds per token"), rangemode="tozero")
    return _layout(fig, _label(labels, "title", "Time per token with and without the KV cache"), height=320)
