"""A new method is one module plus one registry line: a toy method registered here shows up in the CLI's
``train --method``, in the service/API and in the Train form, with its settings validated everywhere."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from steer_ui.methods import base
from steer_ui.methods.base import SettingsError, StaticMethod, parse_settings, register, setting, unregister
from steer_ui.vector import SteeringVector


@dataclass
class ToySettings:
    layer: int | None = setting(None, "block to steer; empty: the first", minimum=0, maximum=1023)
    scale: float = setting(1.0, "length of the vector", minimum=0.0, maximum=10.0)
    flip: bool = setting(False, "point the other way")
    shape: str = setting("ones", "what the vector looks like", choices=("ones", "alternating"))


class Toy(StaticMethod):
    """A constant vector of the chosen shape and length: the maths is beside the point, the plumbing is not."""

    name = "toy"
    label = "Toy method (test)"
    Settings = ToySettings

    def train(self, handle, dataset, settings, progress):
        hidden = handle.arch.hidden_size
        vec = torch.ones(hidden) if settings.shape == "ones" else torch.tensor([(-1.0) ** i for i in range(hidden)])
        vec = vec / vec.norm() * settings.scale * (-1 if settings.flip else 1)
        progress(1.0, "toy done")
        layer = settings.layer or 0
        return (SteeringVector(directions={layer: vec}, hidden_size=hidden, method=self.name,
                               model_id=handle.model_id), {"rows": len(dataset.frame), "scale": settings.scale})


@pytest.fixture
def toy():
    register(Toy())
    try:
        yield
    finally:
        unregister("toy")


def test_settings_are_validated_by_name_type_and_bounds(toy):
    assert parse_settings(ToySettings, {"scale": "2.5", "flip": "true"}).scale == 2.5
    for bad, word in [({"scale": 11}, "scale must be at most 10"), ({"scale": float("nan")}, "finite"),
                      ({"shape": "cube"}, "shape must be one of"), ({"flip": "maybe"}, "flip must be true or false"),
                      ({"nope": 1}, "unknown setting(s) nope"), ({"layer": 1.5}, "whole number")]:
        with pytest.raises(SettingsError, match=word.replace("(", r"\(").replace(")", r"\)")):
            parse_settings(ToySettings, bad)
    assert "toy" in base.names()


def test_toy_method_appears_in_the_cli_and_trains(toy, tmp_path, capsys):
    from steer_ui.cli import build_parser, main

    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "toy" in help_text and "--scale" in help_text and "--flip" in help_text
    out = tmp_path / "toy.safetensors"
    code = main(["train", "--model", "tiny:llama", "--method", "toy", "--scale", "3", "--flip", "--layer", "2",
                 "--data", "assets/datasets/capitals_statements.csv", "--out", str(out), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    assert result["method"] == "toy" and result["layers"] == [2] and result["report"]["scale"] == 3.0
    vector = SteeringVector.load(out)
    assert torch.allclose(vector.direction().norm(), torch.tensor(3.0)) and vector.direction()[0] < 0
    code = main(["train", "--model", "tiny:llama", "--method", "toy", "--scale", "99", "--data",
                 "assets/datasets/capitals_statements.csv", "--out", str(out), "--json"])
    assert code == 2 and "scale must be at most 10" in json.loads(capsys.readouterr().out)["error"]


def test_toy_method_appears_in_the_service_and_the_train_form(toy, tiny):
    from steer_ui.service import Service, UserError
    from steer_ui.ui.app import build_demo

    service = Service(tiny("llama"))
    schema = {m["name"]: m for m in service.methods_schema()}
    assert [s["name"] for s in schema["toy"]["settings"]] == ["layer", "scale", "flip", "shape"]
    service.upload_dataset("s1", None, bundled="capitals_statements.csv")
    name, report = service.train("s1", "toy", layer=1, settings={"scale": 2})
    assert report["scale"] == 2.0 and name in service.vector_names("s1")
    before = service.vector_names("s1")
    with pytest.raises(UserError, match="scale must be at most 10"):
        service.train("s1", "toy", settings={"scale": 1e9})
    assert service.vector_names("s1") == before
    demo = build_demo(service)
    labels = {getattr(block, "label", None) for block in demo.blocks.values()}
    assert "scale" in labels and "flip" in labels and "shape" in labels
    radio = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "train-method")
    assert "toy" in [c[1] for c in radio.choices]


def test_every_empty_table_shows_the_columns_it_will_have(tiny):
    """An empty gr.Dataframe without headers shows gradio's placeholder columns "1 2 3" (issue #32)."""
    import gradio as gr

    from steer_ui.service import Service
    from steer_ui.ui.app import build_demo

    tables = [b for b in build_demo(Service(tiny("llama"))).blocks.values() if isinstance(b, gr.Dataframe)]
    assert len(tables) >= 7
    placeholder = [getattr(t, "label", None) or t.elem_id for t in tables if t.value["headers"] == ["1", "2", "3"]]
    assert placeholder == []


def test_no_event_sends_a_tab_or_the_tabs_an_update(tiny):
    """A tab that has ever been an event's output makes gradio's page walk and copy every component under it on
    each later status change of any event (app.JS_TAB_LABELS): tabs are labelled and opened by the page's own
    script instead."""
    import gradio as gr

    from steer_ui.service import Service
    from steer_ui.ui.app import TABS, build_demo

    demo = build_demo(Service(tiny("llama")))
    tabs = {b._id for b in demo.blocks.values() if isinstance(b, (gr.Tab, gr.Tabs))}
    assert len(tabs) == len(TABS) + 1
    sending = [dep.api_name or dep.fn for dep in demo.fns.values()
               if tabs & {getattr(out, "_id", out) for out in dep.outputs}]
    assert sending == []
