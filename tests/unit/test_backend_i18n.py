"""Every label and message exists in English and Simplified Chinese, with the same placeholders."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from steer_ui.service import UserError
from steer_ui.ui import i18n

ROOT = Path(__file__).resolve().parents[2]
UI_SOURCES = sorted((ROOT / "steer_ui" / "ui").glob("*.py"))
CODE = {p: p.read_text(encoding="utf-8") for p in UI_SOURCES + [ROOT / "steer_ui" / "service.py"]}
HAN = re.compile(r"[\u4e00-\u9fff]")


def _used(pattern: str) -> set[str]:
    return {key for text in CODE.values() for key in re.findall(pattern, text)}


def test_both_languages_have_the_same_label_keys():
    en, zh = i18n.TRANSLATIONS["en"], i18n.TRANSLATIONS["zh-CN"]
    assert set(en) - set(zh) == set(), "labels missing a Chinese translation"
    assert set(zh) - set(en) == set(), "Chinese labels without English"


def test_every_label_used_by_the_ui_is_defined():
    used = _used(r'\bT\("([^"]+)"\)')
    assert len(used) > 80
    assert used - set(i18n.TRANSLATIONS["en"]) == set()


def test_chinese_text_is_actually_chinese():
    # Keys whose text is the same in both languages on purpose (names, symbols).
    same = {k for k, v in i18n.TRANSLATIONS["en"].items() if i18n.TRANSLATIONS["zh-CN"][k] == v}
    assert same <= {"explore.top_p", "explore.details", "detect.details"}
    for key, text in i18n.TRANSLATIONS["zh-CN"].items():
        if key not in same:
            assert HAN.search(text), f"{key} has no Chinese characters: {text!r}"


def test_messages_match_across_languages():
    en, zh = i18n.MESSAGES["en"], i18n.MESSAGES["zh-CN"]
    assert set(en) == set(zh)
    for key in en:
        assert i18n.placeholders(en[key]) == i18n.placeholders(zh[key]), key
    for plot in i18n.PLOTS["en"]:
        assert set(i18n.PLOTS["en"][plot]) == set(i18n.PLOTS["zh-CN"][plot]), plot


def test_every_error_key_raised_has_a_message():
    raised = _used(r'UserError\("([a-z_]+)"') | _used(r'message\([^,]+, "([a-z_]+)"') | \
        _used(r'msg\(backend, request, "([a-z_]+)"')
    assert len(raised) > 30
    assert raised - set(i18n.MESSAGES["en"]) == set()


def test_user_error_text_in_both_languages():
    err = UserError("bad_layer", layer=40, last=17)
    assert str(err) == "Layer 40 does not exist: this model has layers 0 to 17."
    zh = i18n.message("zh-CN", err.key, **err.params)
    assert "40" in zh and "17" in zh and HAN.search(zh)


@pytest.mark.parametrize("browser, lang", [("zh-CN", "zh-CN"), ("zh", "zh-CN"), ("zh-Hans-CN", "zh-CN"),
                                           ("en-US", "en"), ("fr", "en"), (None, "en")])
def test_browser_languages_map_to_ours(browser, lang):
    assert i18n.normalise_lang(browser) == lang


def test_extend_adds_keys_and_refuses_conflicts():
    i18n.extend(labels={"en": {"test.extra": "Extra"}, "zh-CN": {"test.extra": "额外"}})
    try:
        assert i18n.label("zh-CN", "test.extra") == "额外"
        with pytest.raises(ValueError, match="already defined"):
            i18n.extend(labels={"en": {"test.extra": "Different"}})
    finally:
        i18n.TRANSLATIONS["en"].pop("test.extra")
        i18n.TRANSLATIONS["zh-CN"].pop("test.extra")


def test_gr_i18n_carries_both_languages():
    translations = i18n.gr_i18n().translations_dict
    assert {"en", "zh-CN"} <= set(translations)
    assert translations["zh-CN"]["tab.explore"] == "探索"


def test_every_method_setting_has_a_chinese_label_and_help():
    """Issue #36: the Train form is generated from each method's settings; each has Chinese text, none left over."""
    import steer_ui.methods  # noqa: F401 (registers the methods)
    from steer_ui.methods.base import get, names, specs
    from steer_ui.ui.settings_zh import ZH

    wanted = {f"{m}.{s.name}" for m in names() for s in specs(get(m).Settings) if s.name != "layer"}
    assert set(ZH) == wanted
    for key, (label, help_text) in ZH.items():
        assert label.strip() and help_text.strip(), key
        assert any("\u4e00" <= ch <= "\u9fff" for ch in label + help_text), key
