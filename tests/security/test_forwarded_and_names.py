"""A client cannot choose its address, names show what they are, refusals say so whole (issue #46, findings 5, 6).

* uvicorn, left to itself, takes X-Forwarded-For from loopback: behind a same-host proxy or tunnel that passes
  a client's header through, a fresh header was a fresh address, so the per-address session cap and the pause
  after 30 unknown ids a minute counted nothing (200 misses, none paused).  By default no peer is trusted;
  ``--forwarded-allow-ips`` names the proxies that are (each case on an app of its own: a flood uses up its
  address's share for the idle lifetime, and a pause lasts a minute).
* A vector or dataset name holding a bidirectional control or another invisible character is refused in one
  line that writes the character out, over HTTP, from Python and from the CLI.
* A bad settings JSON is answered in plain words, in the visitor's language; a field is named by its whole label.
After each case the honest session's numbers are exactly what they were.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from gradio_client import handle_file

from app_process import ROOT, running
from hostile_kit import HIDDEN, TINY_APP, TINY_LAYER, client, refused, save_native, watch
from raw_http import joined_calls

SHARE, FLOOD = 8, 24  # sessions one address keeps; fresh sessions the flood asks for
PROXY = "127.0.0.1"  # the peer a same-host proxy or tunnel connects from
NO_SUCH_ID = "no shared vector or saved result"
PAUSED = "Too many ids"
# characters that hide or reorder text: right-to-left override, zero-width space, the isolates, the Arabic
# letter mark, right-to-left mark, zero-width no-break space (BOM), soft hyphen, escape (a line or paragraph
# separator is white space: a name's white space runs become one space, so it stays on one line)
HIDDEN_CHARS = ("\u202e", "\u200b", "\u2066", "\u2067", "\u2068", "\u2069", "\u061c", "\u200f", "\ufeff",
                "\u00ad", "\x1b")


def forwarded_from(i: int) -> str:
    return f"203.0.113.{i % 250 + 1}, 198.51.{i // 250}.{i % 250 + 1}"  # a fresh claimed address each call


def join_as(server, forwarded: str | None, peer: str = PROXY) -> tuple:
    """A fresh session's /bundled_dataset from ``peer``, with ``forwarded`` as its X-Forwarded-For."""
    import httpx

    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    with httpx.Client(transport=httpx.HTTPTransport(local_address=peer), headers=headers, timeout=300) as http:
        return joined_calls(http, server.url, "bundled_dataset", ["capitals_statements.csv", "auto"], None, None,
                            count=1)[0]


def flood(server, forwarded) -> Counter:
    """FLOOD fresh sessions from the proxy's address, the i-th claiming ``forwarded(i)``: how many were kept."""
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda i: join_as(server, forwarded(i)), range(FLOOD)))
    counts = Counter("ok" if o[0] == "ok" else ("busy" if "busy" in str(o[-1]).lower() or
                                                "too many new sessions" in str(o[-1]).lower() else str(o)[:160])
                     for o in outcomes)
    assert set(counts) <= {"ok", "busy"}, counts
    return counts


def guesses(server, count: int, forwarded, peer: str = PROXY) -> list[str]:
    """``count`` lookups of ids that do not exist from ``peer``, the i-th claiming ``forwarded(i)``."""
    import httpx

    with httpx.Client(transport=httpx.HTTPTransport(local_address=peer), timeout=30) as http:
        answers = [http.post(server.url + "gradio_api/run/result", json={"data": [secrets.token_urlsafe(16)]},
                             headers={"x-forwarded-for": forwarded(i)}) for i in range(count)]
    texts = [a.text for a in answers]
    assert all(NO_SUCH_ID in t or PAUSED in t for t in texts), texts[-1]
    return texts


# ------------------------------------------------------------------------------------- the client's address
class TestByDefaultNoPeerIsTrusted:
    @pytest.fixture(scope="class")
    def app(self, tmp_path_factory):
        with running([*TINY_APP, "--wait", "--sessions-per-address", str(SHARE)],
                     tmp_path_factory.mktemp("trust_none") / "app.log") as srv:
            yield srv, watch(srv, TINY_LAYER)

    def test_a_fresh_forwarded_header_is_not_a_fresh_address_for_the_session_cap(self, app):
        server, honest = app
        counts = flood(server, forwarded_from)
        assert counts["ok"] <= SHARE and counts["busy"] >= FLOOD - SHARE, counts  # one address: its share
        assert join_as(server, None, peer="127.0.0.3")[0] == "ok"  # a visitor from elsewhere still gets one
        honest()

    def test_a_fresh_forwarded_header_does_not_escape_the_pause_after_unknown_ids(self, app):
        server, honest = app
        texts = guesses(server, 60, forwarded_from)
        assert sum(PAUSED in t for t in texts) >= 25, texts[-1]  # paused after 30, whatever the header says
        assert NO_SUCH_ID in guesses(server, 1, forwarded_from, peer="127.0.0.4")[0]  # others are not paused
        honest(full=False)


def test_forwarded_allow_ips_honours_the_header_from_the_named_proxies_only(tmp_path):
    with running([*TINY_APP, "--wait", "--sessions-per-address", str(SHARE), "--forwarded-allow-ips", PROXY],
                 tmp_path / "app.log") as server:
        honest = watch(server, TINY_LAYER)
        assert flood(server, forwarded_from)["ok"] == FLOOD  # each claimed address keeps its own share
        assert not any(PAUSED in t for t in guesses(server, 40, forwarded_from))  # each its own count
        # a peer that is not named cannot name itself: all of its guesses count against its own address
        assert sum(PAUSED in t for t in guesses(server, 40, forwarded_from, peer="127.0.0.5")) >= 5
        # behind a proxy that appends the address it saw, what the client wrote before it counts for nothing
        assert sum(PAUSED in t for t in guesses(server, 40, lambda i: f"{forwarded_from(i)}, 192.0.2.9")) >= 5
        honest()


@pytest.mark.parametrize("value", ["10.0.0.1/8", "proxy.local", "127.0.0.1;", "*"])
def test_forwarded_allow_ips_refuses_what_is_not_an_address_in_one_line(value):
    done = subprocess.run([sys.executable, str(ROOT / "app.py"), "--forwarded-allow-ips", value], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--forwarded-allow-ips" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------------------- names
def _hidden_in(names) -> list[str]:
    from steer_ui.names import first_hidden

    return [n for n in names if first_hidden(str(n))]


@pytest.mark.parametrize("ch", HIDDEN_CHARS, ids=lambda ch: f"U+{ord(ch):04X}")
def test_a_vector_named_with_a_hidden_character_is_refused_over_http(server, honest, tmp_path, ch):
    path = save_native(tmp_path / "named.safetensors", {6: torch.randn(HIDDEN)}, {}, {"name": f"a{ch}live"})
    c = client(server)
    message = refused(lambda: c.predict(handle_file(str(path)), api_name="/import_vector"),
                      f"'a[U+{ord(ch):04X}]live'", "name")
    assert ch not in message and "&lt;" not in message  # written out, not shown, in plain text
    assert not _hidden_in(r["name"] for r in c.predict(api_name="/vectors"))
    honest(full=False)


def test_names_that_show_what_they_are_are_kept_exactly(server, honest, tmp_path):
    name = "向量 café ❤ (v2) ΔL"
    path = save_native(tmp_path / "named.safetensors", {6: torch.randn(HIDDEN)}, {}, {"name": name})
    c = client(server)
    *_, picker, _, _ = c.predict(handle_file(str(path)), api_name="/import_vector")
    assert (picker["value"] if isinstance(picker, dict) else picker) == name
    assert name in [r["name"] for r in c.predict(api_name="/vectors")]
    honest(full=False)


def _tiny_file(tiny, folder, file_name: str, name: str):
    from steer_ui.vector import SteeringVector

    hidden = tiny("llama").arch.hidden_size
    SteeringVector(directions={1: torch.randn(hidden)}, hidden_size=hidden, method="mean_diff",
                   name=name).save(folder / file_name)
    return folder / file_name


def test_names_with_hidden_characters_are_refused_from_python(tiny, tmp_path):
    from steer_ui.messages import UserError
    from steer_ui.service import Service

    service = Service(handle=tiny("llama"), workdir=tmp_path / "work")
    session = "names-python-session"
    calls = {
        "metadata": lambda: service.import_vector(session, _tiny_file(tiny, tmp_path, "v1.safetensors", "a\u202elive")),
        "file name": lambda: service.import_vector(session, _tiny_file(tiny, tmp_path, "b\u200bc.safetensors", "")),
        "argument": lambda: service.import_vector(session, _tiny_file(tiny, tmp_path, "v2.safetensors", "ok"),
                                                  name="x\u2066y\u2069"),
        "dataset": lambda: service.upload_dataset(session, _csv(tmp_path / "d\u061cata.csv")),
        "training": lambda: service.train(session, "mean-diff", 1, name="t\u2067r"),
    }
    service.upload_dataset(session, _csv(tmp_path / "pairs.csv"))
    for what, call in calls.items():
        with pytest.raises(UserError) as info:
            call()
        assert info.value.key == "name_hidden_character", (what, info.value)
        assert len(str(info.value).splitlines()) == 1 and "[U+" in str(info.value), str(info.value)
    assert not service.session(session).vectors and not _hidden_in(service.vector_names(session))
    assert service.dataset_summary(session)["name"] == "pairs.csv"


def _csv(path):
    rows = ["prompt,positive,negative"] + [f"Q{i}?,yes {i},no {i}" for i in range(8)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_names_with_hidden_characters_are_refused_from_the_cli(tiny, tmp_path):
    evil = _tiny_file(tiny, tmp_path, "evil.safetensors", "a\u202elive")
    runs = [["compare", "--vector", str(evil), "--prompts", "hi"],
            ["library", "add", str(_tiny_file(tiny, tmp_path, "fine.safetensors", "fine")), "--name", "x\u2068y",
             "--store", str(tmp_path / "library.db")]]
    for args in runs:
        done = subprocess.run([sys.executable, "-m", "steer_ui", *args, "--model", "tiny:llama", "--json"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr[-2000:]
        out = json.loads(done.stdout)
        assert set(out) == {"error"} and "[U+" in out["error"] and "\n" not in out["error"], out
        assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------ plain words, whole field names
def test_a_bad_settings_json_is_answered_in_plain_words_in_the_visitors_language(server, honest):
    c = client(server)
    message = refused(lambda: c.predict("mean-diff", 6, False, "{oops", api_name="/train"), "line 1, column 2",
                      "double quotes")
    assert "Expecting" not in message and "char 1" not in message
    assert c.predict("zh-CN", api_name="/set_language") == "zh-CN"
    message = refused(lambda: c.predict("mean-diff", 6, False, "{'epochs': 3}", api_name="/train"),
                      "第 1 行", "双引号")
    assert "Expecting" not in message
    honest(full=False)


def _labels(tiny, tmp_path) -> dict[str, list]:
    """Every input's label on the page, per language, longest first, with its component."""
    from steer_ui.service import Service
    from steer_ui.ui.app import build_demo
    from steer_ui.ui.request_guard import field_label

    demo = build_demo(Service(handle=tiny("llama"), workdir=tmp_path))
    blocks = [b for b in demo.blocks.values() if getattr(b, "label", None) and hasattr(b, "preprocess")]
    return {lang: sorted(((field_label(b, lang), b) for b in blocks), key=lambda lb: -len(lb[0]))
            for lang in ("en", "zh-CN")}


def test_every_message_names_its_field_by_the_whole_label(tiny, tmp_path):
    import gradio as gr

    from steer_ui.messages import ENGLISH, UserError, english
    from steer_ui.ui import i18n
    from steer_ui.ui.request_guard import check_value

    labels = _labels(tiny, tmp_path)
    keys = [k for k, template in ENGLISH.items() if "what" in i18n.placeholders(template)]
    assert len(keys) >= 10, keys
    assert len(labels["en"][0][0]) > 60, labels["en"][0][0]  # longer than the old cuts (40 and 60 characters)
    for lang, ranked in labels.items():
        longest = ranked[0][0]
        for label, block in ranked:  # every number field refusing NaN, as the request guard does
            if isinstance(block, (gr.Number, gr.Slider)):
                with pytest.raises(UserError) as info:
                    check_value(block, float("nan"), label)
                assert label in i18n.message(lang, info.value.key, **info.value.params), (lang, label)
        for key in keys:
            params = {name: "1" for name in i18n.placeholders(i18n.MESSAGES[lang].get(key) or ENGLISH[key])}
            params["what"] = longest
            assert longest in i18n.message(lang, key, **params), (lang, key)
            if lang == "en":
                assert longest in english(key, **params), key


def test_a_refused_value_names_the_longest_field_whole_over_http(server, honest):
    """The bound of the explosion fix is the page's longest numeric label; refused, it is named whole."""
    from steer_ui.ui import i18n

    c = client(server)
    for lang in ("en", "zh-CN"):
        assert c.predict(lang, api_name="/set_language") == lang
        label = i18n.label(lang, "concepts.explosion.bound")
        refused(lambda: c.predict(-5, 10, api_name="/concepts_fix"), label)
    honest(full=False)
