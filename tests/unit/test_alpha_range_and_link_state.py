"""Issue #52's pure parts: the α slider's range and the α-max box, the page held to the slider (not an API client),
the dose-response's two labels, and how a long prompt travels in a link."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from steer_ui.default_view import DefaultView
from steer_ui.ui.common import AlphaSlider, SliderAlpha, handler
from steer_ui.ui.explore_tab import EXTEND, alpha_controls, alpha_slider
from steer_ui.ui import url_state


@pytest.mark.parametrize("top", [0.3122, 0.0962, 0.0999, 0.101, 1.0, 4.0, 7.3, 123.4, 1.2e-3])
def test_the_alpha_max_box_is_the_slider_s_end_and_extend_scales_it_exactly(top):
    box, update = alpha_controls(top)
    end, step = alpha_slider(top)
    assert box == end >= top and update["maximum"] == box and update["minimum"] == -box
    assert alpha_controls(box)[0] == box  # the box's own value gives the same slider (no drift on each pass)
    extended = alpha_controls(top, extended=True)[1]
    assert extended["maximum"] == float(f"{box * EXTEND:.12g}") and extended["step"] == float(f"{step * EXTEND:.12g}")
    assert abs(extended["maximum"] / extended["step"] - round(extended["maximum"] / extended["step"])) < 1e-9


@pytest.mark.parametrize("top, box", [(1e-4, 0.001), (1e-9, 0.001), (5e6, 1e6), (1e30, 1e6)])
def test_a_range_outside_the_alpha_max_box_s_bounds_sets_the_box_to_its_nearest_bound(top, box):
    """A vector's stored α range is only checked to be finite and in order: one past the box's bounds set the box
    to a value its input check refused, in an unqueued event (a wordless "Error" pill on the sliders)."""
    from steer_ui.ui.explore_tab import ALPHA_MAX_BOUNDS

    shown, update = alpha_controls(top)
    assert shown == box and ALPHA_MAX_BOUNDS[0] <= shown <= ALPHA_MAX_BOUNDS[1] and update["maximum"] == shown


def test_the_reviewers_range_0_3122_shows_as_0_315():
    assert alpha_controls(0.3122)[0] == 0.315 and alpha_slider(0.315, extended=True) == (1.575, 0.025)


@pytest.mark.parametrize("alpha, top", [(0.1405, 0.3122), (0.0449, 0.0962), (0.9, 1.0), (2.19, 7.3), (0.4, 0.3122)])
def test_the_default_view_s_alpha_sits_on_the_grid_of_the_slider_the_page_draws(alpha, top):
    view = DefaultView(layer=8, alpha=alpha, alpha_max=top)  # also what a cached view.json is read into
    box, update = alpha_controls(top)
    steps = view.alpha / update["step"]
    assert abs(steps - round(steps)) < 1e-9 and abs(view.alpha) <= box
    assert abs(view.alpha - alpha) <= update["step"] / 2 + 1e-12 or abs(alpha) > box


def test_the_reviewers_default_alpha_0_1405_shows_as_0_14():
    assert DefaultView(layer=8, alpha=0.1405, alpha_max=0.3122).alpha == 0.14


def test_alpha_is_clamped_only_when_the_range_leaves_it_outside():
    assert "value" not in alpha_controls(1.0, 0.5)[1]  # inside: left alone (a page load sets both at once)
    assert alpha_controls(1.0, 3.0)[1]["value"] == 1.0 and alpha_controls(1.0, -3.0)[1]["value"] == -1.0
    assert alpha_controls(1.0, 0.5, set_alpha=True)[1]["value"] == 0.5


def _request(page: bool):
    return SimpleNamespace(headers={"x-gradio-user": "app" if page else "api"}, session_hash=None)


def test_the_page_is_held_to_the_slider_s_range_and_an_api_client_is_not(monkeypatch, queued_event):
    import gradio as gr

    ran = []
    backend = SimpleNamespace(language=lambda _sid: "en")
    monkeypatch.setattr(gr, "Request", SimpleNamespace)  # the handler finds the request by its type

    @handler(backend)
    def run(alpha, request=None):
        ran.append((type(alpha), alpha))
        return "ran"

    slider = AlphaSlider(-0.315, 0.315, value=0.0, step=0.005)
    outside, inside = slider.preprocess(5), slider.preprocess(0.2)
    assert isinstance(outside, SliderAlpha) and not outside.inside() and inside.inside()
    assert slider.preprocess(0.315).inside()  # the end itself is on the slider
    warnings = []
    monkeypatch.setattr(gr, "Warning", lambda text, title=None, **_: warnings.append(text))
    with queued_event():  # the slider's events are queued: their toasts reach the page
        assert run(outside, request=_request(page=True)) != "ran" and ran == []
    assert warnings == ["α must be between -0.315 and 0.315; tick Extend range or raise the α range for more."]
    assert run(outside, request=_request(page=False)) == "ran" and ran == [(float, 5.0)]  # a plain float for the API
    assert run(inside, request=_request(page=True)) == "ran" and ran[-1] == (float, 0.2)
    assert slider.preprocess("abc") == "abc"  # left for the backend's "must be a number" line


def test_the_dose_response_s_readable_label_and_alpha_label_are_on_either_side_of_the_top_edge():
    from steer_ui import plots

    frame = pd.DataFrame({"alpha": [-1.0, -0.5, 0.0, 0.5, 1.0], "kl": [9.0, 2.0, 0.0, 2.0, 9.0],
                          "entropy": [1.0] * 5, "max_abs_delta_logit": [1.0] * 5})
    fig = plots.dose_response(frame, current_alpha=-0.5)  # α at the zone's left edge, where they met
    (readable,) = [a for a in fig.layout.annotations if "KL" in a.text]
    (marker,) = [a for a in fig.layout.annotations if a.text.startswith("α =")]
    assert readable.x == marker.x  # the same place across ...
    assert (readable.y, readable.yanchor) == (1, "top") and (marker.y, marker.yanchor) == (1, "bottom")  # ... apart


@pytest.mark.parametrize("prompt", ["The weather today is", "a~b*c-d._e f!", "这是一个很长的提示。", "emoji 🙂 ok"])
def test_a_prompt_s_encoded_length_is_the_page_s(prompt):
    # URLSearchParams leaves letters, digits and *-._ as they are and writes a space as +, the rest as UTF-8 %XX
    by_hand = "".join(c if c.isascii() and (c.isalnum() or c in "*-._") else "+" if c == " " else
                      "".join(f"%{b:02X}" for b in c.encode()) for c in prompt)
    assert url_state.encoded_chars(prompt) == len(by_hand)


def test_a_prompt_ref_holds_only_for_its_own_prompt():
    ref = url_state.prompt_ref("abc123", "a long prompt")
    assert url_state.ref_holds(ref, "a long prompt")
    assert not url_state.ref_holds(ref, "a long prompt!") and not url_state.ref_holds("", "x")
    assert not url_state.ref_holds("not json", "x") and not url_state.ref_holds(json.dumps({"prompt": "x"}), "x")
    assert url_state.PROMPT_IN_LINK + 500 <= url_state.MAX_LINK_CHARS  # room for the other fields
