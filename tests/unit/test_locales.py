"""The strings are data (issue #47): one file per language in steer_ui/locales/, every key in every language with
the same {placeholders}, and no key that nothing uses.

"Used" means the key appears as a quoted literal ("key" or 'key') in the Python code of steer_ui/ or in app.py, or
is made at run time by one of the few dynamic patterns listed in DYNAMIC below (each with the code that makes it
and the only suffixes it can produce).  The namespaces whose English is in code (ENGLISH_IN_CODE: the generated
Train settings) are in the other languages only, checked against the registered settings.  The checks are
functions of the data, so the tests at the end plant a violation and see it caught.
"""
from __future__ import annotations

import ast
import copy
import json
import string
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCALES = ROOT / "steer_ui" / "locales"
LANGS = ("en", "zh-CN")
NAMESPACES = ("fields", "messages", "plots", "ui")
# Namespaces only the other languages have, because their English is in code: namespace -> why.
ENGLISH_IN_CODE = {
    "method_settings": "the Train form's settings are generated from each method's SettingSpec, whose label and "
                       "help are the English (the CLI's --help and the API show them too); the other languages give "
                       "'<method>.<setting>': {label, help} for every registered setting but the layer",
}


def _code() -> str:
    files = sorted((ROOT / "steer_ui").rglob("*.py")) + [ROOT / "app.py"]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def _method_settings() -> set[str]:
    import steer_ui.methods  # noqa: F401 (registers the methods)
    from steer_ui.methods.base import get, names, specs

    return {s.name for m in names() for s in specs(get(m).Settings)}


def _number_problems() -> set[str]:
    from steer_ui import numbers

    return {numbers.NOT_A_NUMBER, numbers.NOT_FINITE, numbers.NOT_WHOLE, numbers.TOO_SMALL, numbers.TOO_LARGE}


def _concept_units() -> set[str]:
    from steer_ui.steerability import DELTA_P_TRUTHFUL, SD

    return {SD, DELTA_P_TRUTHFUL, "none"}


def _weights() -> set[str]:
    from steer_ui.policy import WEIGHTS

    return {w for w in WEIGHTS if w != "int8"} | {"int8_exact", "int8_rounded"}


# Keys made at run time, so no literal names them: (namespace, prefix) -> (file, the code that makes the key,
# the suffixes it can make, why).  A key with such a prefix counts as used only when its suffix is one of these.
DYNAMIC = {
    ("messages", "number_"): (
        "steer_ui/guards.py", '"number_" + exc.problem', _number_problems,
        "a refused number raises UserError('number_' + problem), problem one of steer_ui/numbers.py's constants"),
    ("messages", "concept_units_"): (
        "steer_ui/ui/compare_tab.py", 'f"concept_units_{', _concept_units,
        "the comparison's concept score names its units: steerability's SD or DELTA_P_TRUTHFUL, or none"),
    ("messages", "weights_"): (
        "steer_ui/ui/model_tab.py", 'f"weights_{weights}"', _weights,
        "the model facts name the weights' precision (policy.WEIGHTS; int8 as 'weights_int8_' + exact/rounded)"),
    ("ui", "train."): (
        "steer_ui/ui/train_tab.py", 'f"train.{spec.name}"', _method_settings,
        "a generated Train setting takes the shared label 'train.<setting>' when one exists"),
}


def load() -> dict[str, dict]:
    return {lang: json.loads((LOCALES / f"{lang}.json").read_text(encoding="utf-8")) for lang in LANGS}


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def flat(data: dict) -> dict[tuple, str]:
    """(namespace, key[, sub-key]) -> text, for one language."""
    out = {}
    for ns, table in data.items():
        for key, value in table.items():
            if isinstance(value, dict):
                out.update({(ns, key, sub): text for sub, text in value.items()})
            else:
                out[(ns, key)] = value
    return out


def language_problems(locales: dict[str, dict]) -> list[str]:
    """Keys missing in a language, texts that are not text, and {placeholders} that differ from English's."""
    problems = []
    english = flat(locales["en"])
    for lang, data in locales.items():
        wanted = set(NAMESPACES) | (set() if lang == "en" else set(ENGLISH_IN_CODE))
        if set(data) != wanted:
            problems.append(f"{lang}: namespaces {sorted(data)}, not {sorted(wanted)}")
        mine = flat({ns: table for ns, table in data.items() if ns not in ENGLISH_IN_CODE})
        problems += [f"{lang}: no {'/'.join(k)}" for k in sorted(set(english) - set(mine))]
        problems += [f"{lang}: {'/'.join(k)} has no English" for k in sorted(set(mine) - set(english))]
        for key in sorted(set(english) & set(mine)):
            text = mine[key]
            if not isinstance(text, str) or not text.strip():
                problems.append(f"{lang}: {'/'.join(key)} is not text: {text!r}")
            elif placeholders(text) != placeholders(english[key]):
                problems.append(f"{lang}: {'/'.join(key)} has {sorted(placeholders(text))}, "
                                f"English {sorted(placeholders(english[key]))}")
    return problems


def unused_keys(data: dict, code: str) -> list[str]:
    """Keys (and plot sub-keys) that no code names as a literal and no DYNAMIC pattern makes."""
    def literal(word: str) -> bool:
        return f'"{word}"' in code or f"'{word}'" in code

    def dynamic(ns: str, key: str) -> bool:
        for (space, prefix), (_, _, suffixes, _) in DYNAMIC.items():
            if space == ns and key.startswith(prefix) and key[len(prefix):] in suffixes():
                return True
        return False

    unused = []
    for ns, table in data.items():
        for key, value in table.items():
            if not literal(key) and not dynamic(ns, key):
                unused.append(f"{ns}/{key}")
            if isinstance(value, dict):  # a chart's texts, read as labels["title"] etc.
                unused += [f"{ns}/{key}/{sub}" for sub in value if not literal(sub)]
    return sorted(unused)


def test_one_file_per_language_in_a_stable_order():
    for lang in LANGS:
        text = (LOCALES / f"{lang}.json").read_text(encoding="utf-8")
        data = json.loads(text)
        assert text == json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n", \
            f"{lang}.json is not in its canonical form (sorted keys, indent 1, UTF-8 characters as they are)"


def test_every_key_has_every_language_with_the_same_placeholders():
    assert language_problems(load()) == []


def method_settings_problems(locales: dict[str, dict]) -> list[str]:
    """The namespace whose English is in code: exactly the registered settings (none missing, none left over)."""
    import steer_ui.methods  # noqa: F401 (registers the methods)
    from steer_ui.methods.base import get, names, specs

    wanted = {f"{m}.{s.name}" for m in names() for s in specs(get(m).Settings) if s.name != "layer"}
    problems = []
    for lang, data in locales.items():
        if lang == "en":
            continue
        table = data.get("method_settings", {})
        problems += [f"{lang}: no method_settings/{k}" for k in sorted(wanted - set(table))]
        problems += [f"{lang}: method_settings/{k} is no setting" for k in sorted(set(table) - wanted)]
        problems += [f"{lang}: method_settings/{k} is not a label and a help" for k, entry in table.items()
                     if not (isinstance(entry, dict) and set(entry) == {"label", "help"} and
                             all(isinstance(v, str) and v.strip() for v in entry.values()))]
    return problems


def test_every_method_setting_has_its_text_in_every_other_language():
    assert method_settings_problems(load()) == []


def test_no_string_is_unused():
    assert unused_keys(load()["en"], _code()) == []


def test_every_dynamic_pattern_is_still_in_the_code():
    for (ns, prefix), (path, snippet, suffixes, why) in DYNAMIC.items():
        assert snippet in (ROOT / path).read_text(encoding="utf-8"), f"{prefix}: {why}; not found in {path}"
        assert suffixes(), prefix


def test_the_app_reads_these_files():
    from steer_ui import messages
    from steer_ui.ui import i18n

    data = load()
    assert messages.ENGLISH == data["en"]["messages"] and messages.FIELDS == data["en"]["fields"]
    assert i18n.MESSAGES["en"] is messages.ENGLISH and i18n.FIELD_NAMES["en"] is messages.FIELDS
    for lang in LANGS:
        assert i18n.TRANSLATIONS[lang].keys() >= data[lang]["ui"].keys()
        assert i18n.PLOTS[lang] == data[lang]["plots"]
        assert i18n.FIELD_NAMES[lang] == data[lang]["fields"]


def test_the_core_strings_need_no_ui():
    tree = ast.parse((ROOT / "steer_ui" / "messages.py").read_text(encoding="utf-8"))
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | \
        {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {m for m in imported if m.startswith(("steer_ui.ui", "ui", "gradio"))}, imported


# ---------------------------------------------------------------------------------------------- planted violations
@pytest.mark.parametrize("plant, expected", [
    (lambda d: d["zh-CN"]["messages"].pop("bad_layer"), "zh-CN: no messages/bad_layer"),
    (lambda d: d["en"]["ui"].pop("tab.model"), "zh-CN: ui/tab.model has no English"),
    (lambda d: d["zh-CN"]["plots"]["bars"].pop("title"), "zh-CN: no plots/bars/title"),
    (lambda d: d["zh-CN"]["messages"].update(bad_layer="第 {layer} 层不存在"), "zh-CN: messages/bad_layer has"),
    (lambda d: d["zh-CN"]["fields"].update(alpha=""), "zh-CN: fields/alpha is not text"),
    (lambda d: d["zh-CN"].pop("method_settings"), "zh-CN: namespaces"),
    (lambda d: d["en"].update(method_settings={}), "en: namespaces"),
])
def test_a_missing_or_different_key_is_caught(plant, expected):
    locales = copy.deepcopy(load())
    plant(locales)
    problems = language_problems(locales)
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize("ns, key", [("messages", "never_said_anywhere"), ("ui", "tab.nowhere"),
                                     ("messages", "number_not_a_problem"), ("ui", "train.no_such_setting"),
                                     ("messages", "weights_float64")])
def test_an_unused_key_is_caught(ns, key):
    data = copy.deepcopy(load()["en"])
    data[ns][key] = "text"
    assert unused_keys(data, _code()) == [f"{ns}/{key}"]


def test_an_unused_plot_text_is_caught():
    data = copy.deepcopy(load()["en"])
    data["plots"]["bars"]["never_drawn_label"] = "text"
    assert unused_keys(data, _code()) == ["plots/bars/never_drawn_label"]


@pytest.mark.parametrize("plant, expected", [
    (lambda d: d["zh-CN"]["method_settings"].pop("probe.C"), "zh-CN: no method_settings/probe.C"),
    (lambda d: d["zh-CN"]["method_settings"].update({"probe.gone": {"label": "x", "help": "y"}}),
     "zh-CN: method_settings/probe.gone is no setting"),
    (lambda d: d["zh-CN"]["method_settings"]["probe.C"].pop("help"), "zh-CN: method_settings/probe.C is not"),
])
def test_a_missing_method_setting_is_caught(plant, expected):
    locales = copy.deepcopy(load())
    plant(locales)
    assert any(p.startswith(expected) for p in method_settings_problems(locales))
