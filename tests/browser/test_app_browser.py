"""A real Chromium drives the app (tiny model): drag α, upload data, export, both languages.

Needs Debian's Chromium at /usr/bin/chromium (``apt-get install -y chromium``;
CJK glyphs need a font such as ``fonts-wqy-microhei`` only for screenshots).
"""
from __future__ import annotations

import re
import time

import pytest

from browser_kit import NEEDS_CHROMIUM, ROOT, browser, free_port, upload_statements  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from steer_ui.service import Service
    from steer_ui.tiny import tiny_handle
    from steer_ui.ui.app import build_demo, launch_kwargs

    backend = Service(handle=tiny_handle("llama"), workdir=tmp_path_factory.mktemp("browser"))
    demo = build_demo(backend)
    demo.queue()
    port = free_port()
    demo.launch(**launch_kwargs(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True))
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def open_page(browser, url, locale="en-US"):
    page = browser.new_page(locale=locale, viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector("#next-token-bars .js-plotly-plot", timeout=60_000)
    return page


def bar_heights(page) -> list[list[float]]:
    return page.evaluate("() => document.querySelector('#next-token-bars .js-plotly-plot')._fullData"
                         ".map(t => Array.from(t.y))")


def test_dragging_alpha_updates_the_bars_then_release_regenerates(browser, url):
    page = open_page(browser, url)
    before = bar_heights(page)
    assert before[0] == before[1]  # α = 0: unsteered and steered bars coincide
    box = page.locator("#alpha-slider input[type=range]").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    for step in range(1, 11):
        page.mouse.move(x + step * box["width"] * 0.045, y)
        time.sleep(0.05)
    # still holding the mouse: the bars follow the drag (slider .input), no release needed
    page.wait_for_function("(b) => JSON.stringify(document.querySelector('#next-token-bars .js-plotly-plot')"
                           "._fullData.map(t => Array.from(t.y))) !== b", arg=str(before).replace("'", '"'),
                           timeout=30_000)
    during = bar_heights(page)
    assert during[0] != during[1]
    page.mouse.up()
    page.wait_for_function("() => document.querySelector('#steered-text').innerText.trim().length > 0",
                           timeout=30_000)
    value = float(page.locator("#alpha-slider input[type=number]").input_value())
    assert value > 0.2
    page.close()


def test_a_delta_logit_limit_typed_in_the_sampling_settings_reaches_the_token_table(browser, url):
    """The field is wired to /generate: with a limit the steered tokens come back with the limit's columns."""
    page = open_page(browser, url)
    page.get_by_text("Sampling", exact=True).click()
    limit = page.locator("#delta-limit input")
    limit.fill("0.05")
    limit.press("Tab")
    page.locator("#generate-btn").click()
    page.get_by_text("Raw numbers", exact=True).click()  # the token table lives there
    page.wait_for_function("() => { const t = document.querySelector('#token-table');"
                           " return t !== null && t.innerText.includes('change_kept'); }", timeout=120_000)
    page.close()


def test_upload_dataset_shows_the_preview(browser, url):
    page = open_page(browser, url)
    upload_statements(page)
    preview = page.locator("#data-preview").inner_text()
    assert "completion" in preview and "label" in preview
    page.close()


def test_export_gives_a_file(browser, url, tmp_path):
    page = open_page(browser, url)
    page.get_by_role("tab", name="Export / Import").click()
    page.locator("#export-btn").click()
    link = page.locator("#export-files a").first
    link.wait_for(timeout=30_000)
    with page.expect_download() as info:
        link.click()
    target = tmp_path / info.value.suggested_filename
    info.value.save_as(target)
    assert target.suffix == ".safetensors" and target.stat().st_size > 64
    page.close()


def test_cancel_stops_a_tsv_training_within_two_seconds_and_keeps_the_vectors(browser, url):
    page = open_page(browser, url)
    upload_statements(page)
    page.get_by_role("tab", name="Explore").click()
    page.locator("#explore-vector").click()
    before = sorted(page.locator("ul[role=listbox] li").all_inner_texts())
    page.keyboard.press("Escape")
    page.get_by_role("tab", name="Train").click()
    page.locator("#train-method label", has_text="tsv").click()
    page.locator("#train-tsv-init-epochs input[type=number]").fill("200")  # every setting is its own control
    page.locator("#train-tsv-advanced").get_by_text("Advanced settings").click()
    page.locator("#train-tsv-compare input[type=checkbox]").uncheck()
    page.locator("#train-btn").click()
    time.sleep(2.0)  # well into training
    page.locator("#train-cancel").click()
    clicked = time.monotonic()
    page.get_by_text("Cancelled").first.wait_for(timeout=10_000)
    assert time.monotonic() - clicked < 2.5  # the toast shows within a step (plus the page's own latency)
    page.get_by_role("tab", name="Explore").click()
    page.locator("#explore-vector").click()
    assert sorted(page.locator("ul[role=listbox] li").all_inner_texts()) == before
    page.close()


def _visible_text_of_every_tab(page) -> str:
    texts = []
    for tab in page.locator("button[role=tab]").all():
        tab.click()
        time.sleep(0.3)
        texts.append(page.locator("body").inner_text())
    return "\n".join(texts)


@pytest.mark.parametrize("locale, lang", [("zh-CN", "zh-CN"), ("en-US", "en")])
def test_every_visible_label_is_in_the_browser_language(browser, url, locale, lang):
    from steer_ui.ui import i18n

    page = open_page(browser, url, locale=locale)
    text = _visible_text_of_every_tab(page)
    assert "__i18n__" not in text
    raw_keys = [k for k in i18n.TRANSLATIONS["en"] if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", text)]
    assert raw_keys == [], f"untranslated keys shown: {raw_keys}"
    other = "en" if lang == "zh-CN" else "zh-CN"
    for key, foreign in i18n.TRANSLATIONS[other].items():
        mine = i18n.TRANSLATIONS[lang][key]
        shown = foreign.lstrip("# ").strip()
        if foreign == mine or len(shown) < 4 or shown in mine:
            continue
        assert shown not in text, f"{key}: {shown!r} shown in the {lang} page"
    page.close()


def test_language_switch_changes_labels_and_tabs(browser, url):
    page = open_page(browser, url)
    page.locator("#lang-switch label", has_text="简体中文").click()
    page.wait_for_function("() => [...document.querySelectorAll('button[role=tab]')].map(b => b.innerText)"
                           ".join('|').includes('导出')", timeout=20_000)
    assert "模型" in page.locator("button[role=tab]").all_inner_texts()
    page.locator("#lang-switch label", has_text="English").click()
    page.wait_for_function("() => [...document.querySelectorAll('button[role=tab]')].map(b => b.innerText)"
                           ".join('|').includes('Export')", timeout=20_000)
    page.close()


def test_markup_in_a_link_is_shown_as_text_in_the_banner(browser, url):
    """``/?layer=<a href=x>`` once rendered a live link around the notice (issue #34)."""
    page = browser.new_page(locale="en-US", viewport={"width": 1400, "height": 1000})
    page.goto(url + "?layer=%3Ca%20href%3Dx%3Eclick%3C%2Fa%3E&vector=%5BLog%20in%5D(http%3A%2F%2Fevil)")
    page.wait_for_function("() => document.querySelector('#model-banner')?.innerText.includes('does not exist')",
                           timeout=60_000)
    banner = page.locator("#model-banner")
    assert banner.locator("a, img").count() == 0
    text = banner.inner_text()
    assert "<a href=x>" in text and "[Log in](http://evil)" in text
    page.close()
