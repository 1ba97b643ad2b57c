"""English and Simplified Chinese text for the whole app, and the functions that pick and fill it.

The strings are data, one file per language: ``steer_ui/locales/en.json`` and
``steer_ui/locales/zh-CN.json`` (UTF-8 JSON, keys sorted), each with the same
namespaces and keys (but for ``method_settings``, below).  The core (:mod:`steer_ui.messages`) reads the English
file for its messages; this module (the UI's) reads every language.

Kinds of text:

* **Labels** (``TRANSLATIONS``, namespace ``ui``): component labels, buttons,
  tab names and static Markdown.  The UI passes ``gr.I18n`` keys, so the
  *browser* translates them: it picks the language from
  ``navigator.language``, and the header's language switch (or gradio's own
  footer Settings → Language) changes it on the fly without a round trip.
* **Messages** (``MESSAGES``, namespace ``messages``), chart text (``PLOTS``,
  ``plots``) and field names (``FIELD_NAMES``, ``fields``): made on the server
  (errors, status lines, plot titles) in the session's language, which the
  switch also sends to the server (:meth:`Service.set_language`).
* **Train settings** (namespace ``method_settings``, other languages only):
  the label and help of each method's generated setting; the English is
  the method's own SettingSpec (:mod:`steer_ui.ui.settings_zh` reads them).

Numbers and token strings are inserted as they are, never translated.

To add text (e.g. a new tab): add the same key to every language's file.
Text made at run time (the Train form's generated settings) goes through
:func:`extend`, which refuses to redefine a key differently.

``tests/unit/test_locales.py`` fails when a key is missing in one language,
a message's ``{placeholders}`` differ between them, or a key is used nowhere.
"""
from __future__ import annotations

import re
import string
from typing import Any

from ..messages import EN_LOCALE, ENGLISH, FIELDS, Said, field_name, locale, normalise_lang  # noqa: F401 (re-exported)

LANGS = ("en", "zh-CN")

# Every string lives in steer_ui/locales/<lang>.json (steer_ui.messages.locale); English is read once, by the core,
# and shared (so MESSAGES["en"] is steer_ui.messages.ENGLISH and FIELD_NAMES["en"] is FIELDS).
LOCALES: dict[str, dict[str, dict]] = {"en": EN_LOCALE, **{lang: locale(lang) for lang in LANGS if lang != "en"}}

# page labels (browser-side, gr.I18n keys), by language
TRANSLATIONS: dict[str, dict[str, str]] = {lang: data["ui"] for lang, data in LOCALES.items()}
# server-side messages, by language
MESSAGES: dict[str, dict[str, str]] = {lang: data["messages"] for lang, data in LOCALES.items()}
# chart text, by language and chart
PLOTS: dict[str, dict[str, dict[str, str]]] = {lang: data["plots"] for lang, data in LOCALES.items()}
# Field names in messages ({what}), by language
FIELD_NAMES: dict[str, dict[str, str]] = {lang: data["fields"] for lang, data in LOCALES.items()}


def say(lang: str | None, text: Any) -> Any:
    """``text`` in ``lang`` when the core said it by key (a :class:`~steer_ui.messages.Said`: a job's progress,
    a refused file's detail, an export's note); anything else as it is."""
    return message(lang, text.key, **text.params) if isinstance(text, Said) else text


def message(lang: str | None, key: str, **params: Any) -> str:
    """A server-side message in ``lang`` (English when the key has no translation); a parameter that the core
    said by key is said in ``lang`` too."""
    lang = normalise_lang(lang)
    params = {k: say(lang, v) for k, v in params.items()}
    if "what" in params:  # a field's name, in the same language as the message around it
        params = {**params, "what": field_name(params["what"], FIELD_NAMES[lang])}
    template = MESSAGES[lang].get(key) or MESSAGES["en"].get(key)
    if template is None:
        return key if not params else f"{key}: {params}"
    try:
        return template.format(**params)
    except (KeyError, IndexError, ValueError):
        return MESSAGES["en"].get(key, key).format_map({k: params.get(k, "?") for k in placeholders(template)})


# Markdown's specials that make links, images, code, emphasis, tables or quotes (an underscore inside a word
# makes no emphasis, so file names keep theirs as they are)
MARKDOWN_SPECIALS = "\\`*{}[]()#+!|~>"
# where an autolink starts: a scheme's "://", "www." and an e-mail's "@"
AUTOLINK = re.compile(r"(?<=[A-Za-z0-9]):(?=//)|(?<=\bwww)\.|@", re.IGNORECASE)


def plain(text: Any) -> str:
    """``text`` (from a file, a link, a vector's name or the vocabulary) as Markdown that shows it literally:
    HTML's ``&`` and ``<`` as entities, Markdown's specials and autolink starts backslash-escaped, so no link,
    image, autolink or tag."""
    escaped = str(text).replace("&", "&amp;").replace("<", "&lt;")
    escaped = "".join("\\" + ch if ch in MARKDOWN_SPECIALS else ch for ch in escaped)
    escaped = re.sub(r"(?:^|(?<=\s))_|_(?=\s|$)", r"\\_", escaped)  # an underscore at a word's edge
    return AUTOLINK.sub(lambda m: "\\" + m.group(0), escaped)


def markdown(lang: str | None, key: str, **params: Any) -> str:
    """:func:`message` for a Markdown component: every text parameter is shown as :func:`plain` text."""
    return message(lang, key, **{k: plain(say(lang, v)) if isinstance(v, str) else v for k, v in params.items()})


def label(lang: str | None, key: str) -> str:
    """A label's text in ``lang`` (for server-side use and tests)."""
    lang = normalise_lang(lang)
    return TRANSLATIONS[lang].get(key) or TRANSLATIONS["en"][key]


def plot_labels(lang: str | None, plot: str) -> dict[str, str]:
    lang = normalise_lang(lang)
    return {**PLOTS["en"].get(plot, {}), **PLOTS[lang].get(plot, {})}


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def extend(labels: dict[str, dict[str, str]] | None = None, messages: dict[str, dict[str, str]] | None = None,
           plots: dict[str, dict[str, dict[str, str]]] | None = None) -> None:
    """Add keys (per language) before the app is built; existing keys may not be redefined differently."""
    for target, extra in ((TRANSLATIONS, labels), (MESSAGES, messages), (PLOTS, plots)):
        for lang, entries in (extra or {}).items():
            lang = normalise_lang(lang)
            for key, text in entries.items():
                if key in target[lang] and target[lang][key] != text:
                    raise ValueError(f"i18n key '{key}' ({lang}) is already defined with different text")
                target[lang][key] = text


class _LazyI18n:
    """``GR_I18N(key)`` -> gr.I18n key object; the gr.I18n itself is made when the app is built."""

    def __call__(self, key: str):
        from gradio.i18n import I18nData

        return I18nData(key)


GR_I18N = _LazyI18n()


def gr_i18n():
    """The gr.I18n for ``launch(i18n=...)``: English, Simplified Chinese (also under 'zh' for bare-'zh' browsers)."""
    import gradio as gr

    zh = {**TRANSLATIONS["en"], **TRANSLATIONS["zh-CN"]}
    return gr.I18n(en=dict(TRANSLATIONS["en"]), **{"zh-CN": zh, "zh": zh})

