"""A panel's key is the page's element for the page and data for an API client (issue #47: API answers carry
data, the page renders it)."""
from __future__ import annotations

import json

import gradio as gr

from steer_ui.ui import panel_keys
from steer_ui.ui.common import handler

VALUES = {"prompt": "<b>hi</b>", "vector": "random direction", "layer": 1, "alpha": 0.25, "relative": True,
          "vector_seed": 0, "whole_vocabulary": False}


class _Request(gr.Request):
    """A request from the page (``x-gradio-user: app``) or from gradio_client (``api``)."""

    def __init__(self, user: str):
        super().__init__()
        self.__dict__["_user"] = user

    @property
    def headers(self):
        return {"x-gradio-user": self._user}


def test_the_page_gets_the_element_and_an_api_client_the_key_as_data():
    element = panel_keys.made_for("en", "bars", VALUES)
    assert element.startswith('<div class="made-for"') and "&lt;b&gt;" in element
    page = panel_keys.for_caller((element, 1.0), page=True)
    assert page[0] is element
    api = panel_keys.for_caller((element, 1.0), page=False)
    assert "<" not in api[0].replace("<b>hi</b>", "") and api[1] == 1.0
    assert json.loads(api[0]) == {"panel": "bars", "made_for": panel_keys.key_of("bars", VALUES)}


class _Backend:
    @staticmethod
    def language(_session):
        return "en"


def test_handlers_answer_each_caller_in_its_form():
    @handler(_Backend())
    def answer(request: gr.Request = None):
        return panel_keys.made_for("en", "bars", VALUES), {"kl": 0.0}

    @handler(_Backend())
    def stream(request: gr.Request = None):
        yield panel_keys.made_for("en", "dose", VALUES), "first"

    page, api = _Request("app"), _Request("api")
    assert answer(request=page)[0].startswith("<div") and answer(request=page)[1] == {"kl": 0.0}
    assert json.loads(answer(request=api)[0])["panel"] == "bars"
    assert json.loads(next(stream(request=api))[0])["panel"] == "dose"
    assert next(stream(request=page))[0].startswith("<div")
