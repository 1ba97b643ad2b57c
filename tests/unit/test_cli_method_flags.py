"""The train command's flags are generated from every method's settings; two methods that share a setting name
with different types, choices or bounds keep their own validation (issue #32)."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from steer_ui.cli import build_parser, main
from steer_ui.methods.base import all_methods, parse_settings, specs

DATA = Path(__file__).resolve().parents[2] / "assets" / "datasets"


def _values(spec) -> list:
    """Values a method's own settings parser accepts for ``spec``, written as a user would type them."""
    if spec.choices:
        return [str(c) for c in spec.choices]
    low = spec.minimum if spec.minimum is not None else 0
    high = spec.maximum if spec.maximum is not None else low + 2
    if spec.kind == "int":
        return [str(int(low)), str(int(high))]
    if spec.kind == "float":
        return [repr((low + high) / 2)]  # inside, as open bounds such as a fraction's (0, 1) ask
    return []


def _shared_with_differences():
    methods = {m.name: {s.name: s for s in specs(m.Settings)} for m in all_methods()}
    for (a, sa), (b, sb) in itertools.combinations(methods.items(), 2):
        for name in sorted(set(sa) & set(sb)):
            x, y = sa[name], sb[name]
            if (x.kind, x.choices, x.minimum, x.maximum) != (y.kind, y.choices, y.minimum, y.maximum):
                yield a, b, name


PAIRS = list(_shared_with_differences())


def test_some_methods_share_names_with_different_rules():
    assert ("iti", "l2s", "steer_positions") in PAIRS  # the collision that refused '--steer-positions generated'


@pytest.mark.parametrize("first, second, name", PAIRS)
def test_a_shared_setting_name_takes_each_method_s_own_values(first, second, name):
    parser = build_parser()
    for method in (first, second):
        spec = next(s for s in specs(next(m for m in all_methods() if m.name == method).Settings) if s.name == name)
        if spec.kind == "bool":
            continue
        for value in _values(spec):
            args = parser.parse_args(["train", "--model", "tiny:llama", "--data", "x.csv", "--out", "o",
                                      "--method", method, spec.cli_flag, value])
            given = {n: getattr(args, n) for n in args._settings if getattr(args, n) is not None}
            cls = next(m for m in all_methods() if m.name == method).Settings
            assert getattr(parse_settings(cls, given), name) == parse_settings(cls, {name: value}).__dict__[name]


def test_l2s_steers_generated_positions_with_a_later_context_layer(capsys, tmp_path):
    out = tmp_path / "l2s.safetensors"
    code = main(["train", "--model", "tiny:llama", "--data", str(DATA / "capitals_pairs.csv"), "--method", "l2s",
                 "--layer", "1", "--context-layer", "3", "--steer-positions", "generated", "--epochs", "2",
                 "--out", str(out), "--json"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert json.loads(printed)["positions"] == "generated"
    code = main(["generate", "--model", "tiny:llama", "--prompt", "The capital of France is", "--vector", str(out),
                 "--alpha", "4", "--max-new-tokens", "4", "--json"])
    steered = json.loads(capsys.readouterr().out)["steered"]["tokens"]
    assert code == 0 and any(abs(t["delta_logit"]) > 1e-4 for t in steered)  # generated positions are steered


def test_a_refusal_names_the_flag_the_cli_accepts(capsys):
    code = main(["train", "--model", "tiny:llama", "--data", str(DATA / "capitals_pairs.csv"), "--method", "l2s",
                 "--layer", "1", "--context-layer", "3", "--out", "unused.safetensors", "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and "--steer-positions='generated'" in error and "--context-layer" in error
    code = main(["train", "--model", "tiny:llama", "--data", str(DATA / "capitals_pairs.csv"), "--method", "iti",
                 "--steer-positions", "generated", "--out", "unused.safetensors", "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and "--steer-positions" in error and "generated" in error  # ITI's own choices refuse it
    code = main(["train", "--model", "tiny:llama", "--data", str(DATA / "capitals_pairs.csv"), "--method",
                 "mean-diff", "--context-layer", "3", "--out", "unused.safetensors", "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and "--context-layer" in error  # a flag of another method: refused by name
