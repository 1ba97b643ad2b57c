"""Server-side messages in plain English, by key: the core raises errors that carry a key and parameters.

The texts live in ``steer_ui/locales/en.json`` (namespace ``messages``; field
names under ``fields``), not in code.  The core (service, CLI) never imports
the UI; the UI's translations (:mod:`steer_ui.ui.i18n`) read the other
languages' files, which have the same keys and ``{placeholders}``.
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

LOCALES = "locales"  # steer_ui/locales/<lang>.json: one file of strings per language


def locale(lang: str) -> dict[str, dict[str, Any]]:
    """Every string of one language, from ``steer_ui/locales/<lang>.json`` (UTF-8 JSON, keys sorted), by namespace:
    ``messages`` (server messages by key; the UI's own messages too), ``fields`` (what a message's ``{what}``
    names), ``ui`` (the page's labels, used by :mod:`steer_ui.ui.i18n` only) and ``plots`` (chart text by chart).
    Every language's file has the same keys with the same ``{placeholders}`` (tests/unit/test_locales.py)."""
    path = resources.files("steer_ui") / LOCALES / f"{lang}.json"
    return json.loads(path.read_text(encoding="utf-8"))


EN_LOCALE = locale("en")  # read once; steer_ui.ui.i18n shares these dicts (its English is this)
ENGLISH: dict[str, str] = EN_LOCALE["messages"]


class UserError(Exception):
    """A failure to show the user as is: ``key`` names the message (the UI translates it), ``params`` fill it."""

    def __init__(self, key: str, **params: Any):
        self.key, self.params = key, params
        super().__init__(english(key, **params))


class KeyedError(ValueError):
    """A core refusal that may name its message: ``key`` and ``params`` say it in the visitor's language at the
    front; the English text is the exception's own (VectorError, DatasetError and SteeringError share this)."""

    def __init__(self, message: str, key: str | None = None, **params: Any):
        super().__init__(message)
        self.key, self.params = key, params

    @classmethod
    def from_key(cls, key: str, **params: Any):
        """The error whose message is ``key``, in English here."""
        return cls(english(key, **params), key, **params)


# What a message's {what} names: the fields of requests, as a visitor sees them (the UI translates them too).
FIELDS: dict[str, str] = EN_LOCALE["fields"]


MAX_FIELD_CHARS = 200  # a field named by its label is named whole (the page's longest label is far shorter)


def field_name(what: str, names: dict[str, str] | None = None) -> str:
    """The name of field ``what`` as a visitor sees it (``names`` in another language, English by default)."""
    return (names or {}).get(what) or FIELDS.get(what) or str(what)[:MAX_FIELD_CHARS]


def normalise_lang(lang: str | None) -> str:
    """Any Chinese locale (zh, zh-CN, zh-Hans-CN, ...) -> 'zh-CN'; everything else -> 'en'."""
    return "zh-CN" if str(lang or "").lower().startswith("zh") else "en"


def english(key: str, **params: Any) -> str:
    """The English text of message ``key`` with ``params`` filled in (missing ones shown as '?')."""
    template = ENGLISH.get(key)
    if template is None:
        return key if not params else f"{key}: {params}"
    if "what" in params:
        params = {**params, "what": field_name(params["what"])}
    try:
        return template.format(**params)
    except (KeyError, IndexError, ValueError):
        return key


class Said(str):
    """Words the core says by key: the English text of message ``key`` (so every caller that reads a string reads
    what it read before: the CLI, logs, tests, JSON), with ``key`` and ``params`` beside it, so that a front says
    them in the visitor's language (:func:`steer_ui.ui.i18n.say`).  A job's progress, a refused file's detail
    and an export's note are said this way; a parameter may itself be Said."""

    key: str
    params: dict[str, Any]

    def __new__(cls, key: str, **params: Any) -> "Said":
        said = super().__new__(cls, english(key, **params))
        said.key, said.params = key, params
        return said

    def __reduce__(self):  # a copy or a pickle keeps the key (str's own would keep the English only)
        return _said, (self.key, self.params)


def _said(key: str, params: dict[str, Any]) -> Said:
    return Said(key, **params)


def encodable(text: str) -> str:
    """``text`` as UTF-8 can carry it: a message that echoes a client's value may hold a lone surrogate, which no
    UTF-8 answer (JSON, gradio's events) can encode (the answer itself then failed); such characters are written
    as backslash escapes, everything else as it is."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def first_line(exc: BaseException) -> str:
    """``exc``'s message, first line only (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def said_of(exc: BaseException) -> str:
    """``exc``'s one line as a detail: by its key when it has one (a front then says it in the visitor's language),
    else its English first line."""
    key = getattr(exc, "key", None)
    return Said(key, **exc.params) if key else first_line(exc)
