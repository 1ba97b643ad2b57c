"""Issue #52, long jobs, in a real Chromium (tiny model): a job waiting for another says what it waits for and its
place; Cancel answers at once, on a waiting job and on a running one; one progress line per job; the Train tab's
status line and layer slider follow the data and the trained vector; Many prompts reports rows as they finish.

"Another visitor's job" is a real job in the server's line, started from Python and held until the test lets it
go, so what the page waits for is known and lasts exactly as long as the test needs.
"""
from __future__ import annotations

import re
import threading
import time
import uuid
from contextlib import contextmanager

import pytest

from browser_kit import NEEDS_CHROMIUM, browser, served, upload_statements  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM]

WAITING = "Waiting for another job (Concepts: Explode, then fix) to finish — 1st in line"
# gradio's own progress indicators (its status tracker): a long job's event shows none of them
GRADIO_PROGRESS = ".progress-text, .eta-bar, .progress-level, .meta-text, .meta-text-center"


def _serve(handle, workdir):
    """(backend, url) of the app on ``handle`` while the fixture that yields from this runs."""
    from steer_ui.service import Service

    backend = Service(handle=handle, workdir=workdir)
    with served(backend) as url:
        yield backend, url


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from steer_ui.tiny import tiny_handle

    yield from _serve(tiny_handle("llama"), tmp_path_factory.mktemp("jobs"))


@pytest.fixture
def wide_app(tmp_path_factory):
    """The app on a random model wide enough (4 blocks of width 256) that a comparison's decode lasts seconds on
    any CPU: on the width-64 model 12 prompts of 128 tokens ended in 0.3 s in CI, within the page's first poll."""
    from steer_ui.tiny import tiny_handle

    yield from _serve(tiny_handle("llama", layers=4, hidden=256), tmp_path_factory.mktemp("wide"))


def open_page(browser, url):
    page = browser.new_page(locale="en-US", viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector("#next-token-bars .js-plotly-plot", timeout=60_000)
    return page


@contextmanager
def another_visitors_job(backend, kind: str = "concepts_explode"):
    """A job of another session that runs in the server's line until the block ends."""
    release, started = threading.Event(), threading.Event()
    session = backend.session("other-visitor-" + uuid.uuid4().hex[:8])

    def hold():
        with backend.training.job(session, backend.handle, kind=kind) as report:
            started.set()
            while not release.wait(0.05):
                report(0.5, "holding the line")

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert started.wait(10), "the other visitor's job did not start"
    try:
        yield
    finally:
        release.set()
        holder.join(timeout=10)


def status_text(page, selector: str) -> str:
    return page.locator(selector).inner_text()


def wait_status(page, selector: str, pattern: str, timeout: float = 30_000) -> None:
    page.wait_for_function("([sel, pat]) => new RegExp(pat).test(document.querySelector(sel).innerText)",
                           arg=[selector, pattern], timeout=timeout)


def vector_names(page) -> list[str]:
    page.get_by_role("tab", name="Explore").click()
    page.locator("#explore-vector").click()
    names = sorted(page.locator("ul[role=listbox] li").all_inner_texts())
    page.keyboard.press("Escape")
    return names


def visible_gradio_progress(page) -> int:
    return page.evaluate("(sel) => Array.from(document.querySelectorAll(sel)).filter(e => e.offsetParent !== null"
                         " && e.innerText.trim() !== '').length", GRADIO_PROGRESS)


def progress_lines(page) -> int:
    """Elements showing a job's progress bar (▰▱): the one line per job."""
    return page.evaluate("() => Array.from(document.querySelectorAll('body *')).filter(e => e.offsetParent"
                         " !== null && /[▰▱]{10}/.test(e.innerText) && !Array.from(e.children).some(c =>"
                         " /[▰▱]{10}/.test(c.innerText))).length")


def test_a_waiting_job_says_what_it_waits_for_and_cancel_takes_it_out_of_the_line(browser, app):
    backend, url = app
    page = open_page(browser, url)
    upload_statements(page)
    before = vector_names(page)
    page.get_by_role("tab", name="Train").click()
    with another_visitors_job(backend):
        for button, status in (("#train-btn", "#train-status"), ("#train-probe", "#train-status")):
            page.locator(button).click()
            wait_status(page, status, re.escape(WAITING), timeout=10_000)
            assert visible_gradio_progress(page) == 0  # gradio's "queue: 1/1" is gone: the line says it
            page.locator("#train-cancel").click()
            clicked = time.monotonic()
            wait_status(page, status, "Cancelled before it started", timeout=5_000)
            assert time.monotonic() - clicked < 2.0, "Cancel on a waiting job answers at once"
    time.sleep(1.0)  # the other job is over: a cancelled job must not run now that its turn would have come
    assert "Cancelled before it started" in status_text(page, "#train-status")
    assert vector_names(page) == before
    page.close()


def test_cancel_on_a_running_job_answers_at_once_and_the_job_shows_one_progress_line(browser, app):
    _backend, url = app
    page = open_page(browser, url)
    upload_statements(page)
    before = vector_names(page)
    page.get_by_role("tab", name="Train").click()
    # Cancel with nothing running says so in the job's line (it said nothing: a toast from outside the queue)
    page.locator("#train-cancel").click()
    wait_status(page, "#train-status", "Nothing is running in this session", 5_000)
    # idle, Cancel is a red outline on white, not a filled red alarm (a browser review); its text stays readable
    page.mouse.move(0, 0)  # not under the pointer, which tints it (the tint fades out)
    page.wait_for_function("() => getComputedStyle(document.querySelector('#train-cancel')).backgroundColor"
                           " === 'rgb(255, 255, 255)'", timeout=5_000)
    idle = page.locator("#train-cancel").evaluate(
        "e => { const s = getComputedStyle(e); return [s.backgroundColor, s.color, s.borderWidth] }")
    assert idle == ["rgb(255, 255, 255)", "rgb(185, 28, 28)", "1px"], idle
    page.locator("#train-method label", has_text="tsv").click()
    page.locator("#train-tsv-init-epochs input[type=number]").fill("200")
    page.locator("#train-tsv-advanced").get_by_text("Advanced settings").click()
    page.locator("#train-tsv-compare input[type=checkbox]").uncheck()
    page.locator("#train-btn").click()
    wait_status(page, "#train-status", r"[▰▱]{10} \d+% · Train \(tsv\) · \d+ s · TSV \w+: epoch \d+/", 60_000)
    assert visible_gradio_progress(page) == 0, "no output of the job draws a progress bar of its own"
    assert progress_lines(page) == 1, "one progress line for the job"
    page.locator("#train-cancel").click()
    clicked = time.monotonic()
    wait_status(page, "#train-status", "Stopping|Cancelled", timeout=5_000)
    assert time.monotonic() - clicked < 1.5, "Cancel answers at once"
    wait_status(page, "#train-status", "Cancelled", timeout=10_000)
    assert "Stopping" not in status_text(page, "#train-status")  # the line ends with how the job ended
    assert vector_names(page) == before
    page.close()


def set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_the_train_tab_follows_the_data_and_the_trained_vector(browser, app):
    backend, url = app
    # the layer mean difference chooses by itself on this data (the same on every run: a fixed split and seed)
    finder = "layer-finder-" + uuid.uuid4().hex[:8]
    backend.upload_dataset(finder, None, bundled="capitals_statements.csv")
    chosen = backend.train(finder, "mean-diff")[1]["layer"]
    page = open_page(browser, url)
    page.get_by_role("tab", name="Train").click()
    assert "Load a dataset" in status_text(page, "#train-status")
    upload_statements(page)
    page.get_by_role("tab", name="Train").click()
    wait_status(page, "#train-status", r"capitals\\?_statements.* is loaded", timeout=10_000)
    # the slider away from the layer the method will choose, then the choice left to the method
    page.locator("#train-auto-layer input[type=checkbox]").uncheck()
    away = 0 if chosen != 0 else 1
    set_slider(page, "train-layer", away)
    page.wait_for_function("(v) => document.querySelector('#train-layer input[type=number]').value == v",
                           arg=str(away), timeout=5_000)
    page.locator("#train-auto-layer input[type=checkbox]").check()
    page.locator("#train-btn").click()
    wait_status(page, "#train-status", f"Trained mean-diff L{chosen}", timeout=60_000)
    page.wait_for_function("(v) => document.querySelector('#train-layer input[type=number]').value == v",
                           arg=str(chosen), timeout=5_000)  # the slider reads the trained vector's layer
    page.close()


def test_many_prompts_reports_rows_as_they_finish(browser, wide_app):
    _backend, url = wide_app
    page = open_page(browser, url)
    page.get_by_role("tab", name="Many prompts").click()
    # every text the summary line shows while the comparison runs
    page.evaluate("""() => { window.__lines = []; const el = document.querySelector('#compare-summary');
        new MutationObserver(() => window.__lines.push(el.innerText)).observe(el, {subtree: true, childList: true,
        characterData: true}); }""")
    prompts = "\n".join(f"Prompt number {i} tells a long story about the sea and the town" for i in range(12))
    page.locator("#compare-prompts textarea").fill(prompts)
    # the longest answers the tab allows, so that the last 4 rows decode for many of the page's polls
    tokens = page.locator("#compare-max-tokens input[type=number]")
    tokens.fill("128")
    tokens.press("Tab")
    page.wait_for_timeout(300)
    # 12 prompts, 8 at once in the decode batch (policy.compare_in_flight): the first 8 end before the last 4
    started = time.monotonic()
    page.locator("#compare-run").click()
    page.wait_for_selector(".made-for[data-panel=compare]", state="attached", timeout=120_000)
    took = time.monotonic() - started
    lines = page.evaluate("() => window.__lines")
    partial = [line for line in lines if (m := re.search(r"(\d+) of (\d+) prompts", line))
               and 0 < int(m.group(1)) < int(m.group(2))]
    assert partial, (f"no line said how many prompts were done before the end of a {took:.1f} s comparison: "
                     f"{sorted(set(lines))[:8]}")
    percents = [int(m.group(1)) for line in partial if (m := re.search(r"(\d+)%", line))]
    assert percents and max(percents) > 0, "the progress advanced before the end"
    page.close()
