"""The library in Chromium (issue #30): a trained vector survives a reload in every tab's list, and a shared link
opens it in a fresh browser with the owner's next-token numbers."""
from __future__ import annotations

import time

import pytest

from browser_kit import NEEDS_CHROMIUM, browser, free_port  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from steer_ui.policy import Policy
    from steer_ui.service import Service
    from steer_ui.store import open_library
    from steer_ui.tiny import tiny_handle
    from steer_ui.ui.app import build_demo, launch_kwargs

    folder = tmp_path_factory.mktemp("library")
    policy = Policy()
    backend = Service(handle=tiny_handle("llama"), workdir=folder, policy=policy,
                      library=open_library(str(folder / "library.db"), policy))
    demo = build_demo(backend)
    demo.queue()
    port = free_port()
    demo.launch(**launch_kwargs(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True))
    yield f"http://127.0.0.1:{port}/", backend
    demo.close()


def _ready(page) -> None:
    """The first view is drawn: its readout has numbers, or says there is no steering at α = 0."""
    page.wait_for_selector("#next-token-bars .js-plotly-plot", timeout=60_000)
    page.wait_for_function("() => /KL|α = 0/.test(document.querySelector('#explore-readout')?.innerText || '')",
                           timeout=60_000)


def _fresh(browser, url: str, ready: bool = True):
    """A new browser context (its own local storage: a stranger, or an owner's first visit) on ``url``."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-US").new_page()
    page.goto(url)
    if ready:
        _ready(page)
    return page


def _choices(page, picker: str) -> list[str]:
    page.locator(f"{picker} input").click()
    page.wait_for_selector("ul[role=listbox] li", timeout=10_000)
    items = page.locator("ul[role=listbox] li").all_inner_texts()
    page.keyboard.press("Escape")
    return [i.replace("✓", "").strip() for i in items]  # the chosen one is ticked


def test_a_trained_vector_survives_a_reload_and_a_shared_link_opens_it_for_a_stranger(browser, url):
    url, backend = url
    owner = _fresh(browser, url)
    owner.get_by_role("tab", name="Data").click()
    owner.locator("#data-file input[type=file]").set_input_files(
        str(__import__("pathlib").Path(__file__).resolve().parents[2] / "assets/datasets/capitals_statements.csv"))
    owner.wait_for_function("() => document.querySelector('#data-summary').innerText.includes('capitals')",
                            timeout=30_000)
    owner.get_by_role("tab", name="Train").click()
    owner.locator("#train-btn").click()
    owner.wait_for_function("() => document.querySelector('#train-status').innerText.includes('Trained')",
                            timeout=60_000)
    name = owner.locator("#train-status strong").first.inner_text()

    owner.reload()  # a new gradio session: the vector comes back from the library, by the browser's owner token
    _ready(owner)
    for tab, picker in (("Explore", "#explore-vector"), ("Detect", "#detect-vector"), ("Export / Import",
                                                                                        "#export-vector")):
        owner.get_by_role("tab", name=tab).click()
        assert name in _choices(owner, picker), tab
    owner.get_by_role("tab", name="Explore").click()
    owner.locator("#explore-vector input").click()
    owner.locator("ul[role=listbox] li", has_text=name).first.click()
    time.sleep(1.0)  # the vector's own layer and α range arrive
    # Export opens on the vector Explore shows (it stayed on the random direction after a reload)
    owner.get_by_role("tab", name="Export / Import").click()
    owner.wait_for_function(f"() => document.querySelector('#export-vector input')?.value === {name!r}",
                            timeout=10_000)
    owner.get_by_role("tab", name="Explore").click()
    owner.locator("#alpha-slider input[type=number]").fill("0.5")  # a steered view, so the numbers say something
    owner.locator("#explore-prompt textarea").click()
    owner.wait_for_function("() => document.querySelector('#explore-readout')?.innerText.includes('KL')")
    owner.locator("#share-btn").click()
    owner.wait_for_function("() => document.querySelector('#explore-library-status')?.innerText.includes('Shared')",
                            timeout=20_000)
    time.sleep(1.0)  # the readout for the vector's own layer and α range, and the URL that carries its share id
    # the link Share shows is the whole view, the address bar's URL (issue #52: it was only ?vector=<id>, which
    # opened the vector at another layer and α range for a stranger)
    owner.wait_for_function("() => (document.querySelector('#explore-link textarea, #explore-link input')?.value "
                            "|| '').includes('alpha_max=')", timeout=10_000)
    link = owner.locator("#explore-link textarea, #explore-link input").first.input_value()
    assert link == owner.url
    assert all(f"{key}=" in link for key in ("prompt", "layer", "alpha", "alpha_max", "relative"))
    assert "vector=" in link and name.split()[0] not in link.split("vector=")[1]  # the id, not the name
    # gradio lays a "processing | 1.2s" line over a panel while a request for it runs: read the numbers alone
    owner.wait_for_function("() => !document.querySelector('#explore-readout').innerText.includes('processing')",
                            timeout=30_000)
    readout = owner.locator("#explore-readout").inner_text()

    stranger = _fresh(browser, link)
    stranger.wait_for_function(f"() => document.querySelector('#explore-vector input').value === "
                               f"{(name + ' (shared)')!r}", timeout=30_000)
    time.sleep(1.0)
    assert stranger.locator("#explore-readout").inner_text() == readout  # the same numbers, digit for digit
    # the stranger passes it on: Share on a vector a link opened gives a link with the same share id (it was
    # refused as not the stranger's own, while the link under the refusal was copied all the same)
    stranger.locator("#share-btn").click()
    stranger.wait_for_function("() => document.querySelector('#explore-library-status')?.innerText"
                               ".includes('Shared on')", timeout=20_000)
    passed = stranger.locator("#explore-link textarea, #explore-link input").first.input_value()
    share_id = link.split("vector=")[1].split("&")[0]
    assert passed.split("vector=")[1].split("&")[0] == share_id
    # once its owner stops sharing it, Share says so and the view's link no longer carries the dead id (the link
    # under a refused Share was copied with it)
    owner_session = next(k for k, s in backend.sessions._kept.items() if name in s.vectors)
    assert backend.unshare_vector(owner_session, name)
    stranger.locator("#share-btn").click()
    stranger.wait_for_function("() => document.querySelector('#explore-library-status')?.innerText"
                               ".includes('stopped sharing')", timeout=20_000)
    stranger.wait_for_function(f"() => !window.location.search.includes({share_id!r})", timeout=10_000)


def test_a_saved_result_link_shows_the_saved_view_without_running_the_model(browser, url, monkeypatch):
    url, backend = url
    page = _fresh(browser, url)
    page.wait_for_function("() => document.querySelector('#steered-text')?.innerText.trim().split('\\n').length > 1",
                           timeout=60_000)
    # Save keeps the last finished generation: the per-token chart is drawn by its last frame (streamed frames
    # show the text before it ends; on a loaded machine the decode outlasted the one second waited here)
    page.wait_for_selector("#per-token-delta .js-plotly-plot", timeout=60_000)
    time.sleep(1.0)
    page.locator("#save-result-btn").click()
    page.wait_for_function("() => document.querySelector('#explore-library-status')?.innerText.includes('Saved')",
                           timeout=20_000)
    link = page.locator("#explore-link textarea, #explore-link input").first.input_value()
    saved = backend.result(link.split("result=")[1])
    model_calls = []
    for name in ("next_token", "stream_generate", "sweep"):  # count what reaches the model from here on
        real = getattr(backend, name)
        monkeypatch.setattr(backend, name, lambda *a, _real=real, _n=name, **k: (model_calls.append(_n),
                                                                                 _real(*a, **k))[1])
    stranger = _fresh(browser, link)
    stranger.wait_for_function("() => document.querySelector('#run-live-btn') !== null && "
                               "getComputedStyle(document.querySelector('#run-live-btn')).display !== 'none'",
                               timeout=30_000)
    time.sleep(2.0)
    shown = stranger.locator("#unsteered-text textarea").input_value()
    # a textarea's value turns every line break into \n (the tiny model emits \r)
    expected = saved["generation"]["unsteered"]["text"].replace("\r\n", "\n").replace("\r", "\n")
    assert shown == expected and model_calls == []
    stranger.locator("#run-live-btn").click()
    stranger.wait_for_function("() => document.querySelector('#explore-library-status')?.innerText"
                               ".includes('reproduced exactly')", timeout=60_000)
    assert "stream_generate" in model_calls


@pytest.mark.slow  # 18 s, for CI's 30 minutes; test_library_app opens saved comparisons over HTTP in CI
def test_a_saved_comparison_link_opens_the_whole_table_on_the_many_prompts_tab(browser, url):
    url, backend = url
    page = _fresh(browser, url)
    page.get_by_role("tab", name="Many prompts").click()
    page.locator("#compare-prompts textarea").fill("The capital of France is\nMy favourite food is")
    page.locator("#compare-run").click()
    # "2 prompts at α" is the summary line; the progress note while it runs says "generating 2 prompts"
    page.wait_for_function("() => /2 prompts at/.test(document.querySelector('#compare-summary').innerText)",
                           timeout=60_000)
    page.locator("#compare-save").click()
    page.wait_for_function("() => document.querySelector('#compare-summary')?.innerText.includes('Saved')",
                           timeout=20_000)
    link = page.locator("#compare-link textarea, #compare-link input").first.input_value()
    saved = backend.result(link.split("result=")[1])
    assert saved["kind"] == "comparison" and len(saved["comparison"]["rows"]) == 2
    stranger = _fresh(browser, link, ready=False)
    # the stranger lands on the Many prompts tab, with the saved prompts, the summary line and every row
    stranger.wait_for_function("() => /2 prompts at/.test(document.querySelector('#compare-summary')?.innerText "
                               "|| '')", timeout=60_000)
    assert stranger.locator("#compare-prompts textarea").input_value().splitlines() == [
        "The capital of France is", "My favourite food is"]
    table = stranger.locator("#compare-table").inner_text()
    assert "My favourite food is" in table and "The capital of France is" in table
    assert "A saved comparison" in stranger.locator("#model-banner").inner_text()
    # a row opens in Explore with the comparison's vector, layer and α, and Explore's panels follow it
    cell = stranger.locator("#compare-table [role=gridcell]", has_text="My favourite food is").first
    for _attempt in range(3):  # a click while the page-load chain redraws the table can miss the cell
        cell.click()
        try:
            stranger.wait_for_function("() => document.querySelector('#explore-prompt textarea')?.value === "
                                       "'My favourite food is'", timeout=5_000)
            break
        except Exception:  # noqa: BLE001 - try again; the assertion below says what is wrong
            stranger.get_by_role("tab", name="Many prompts").click()
    assert stranger.locator("#explore-prompt textarea").input_value() == "My favourite food is"
    stranger.wait_for_function("() => { const e = document.querySelector('#generations-made-for .made-for');"
                               " return e && JSON.parse(e.dataset.key).prompt === 'My favourite food is'; }",
                               timeout=60_000)
    settings = saved["settings"]
    shown = stranger.evaluate("() => JSON.parse(document.querySelector('#generations-made-for .made-for')"
                              ".dataset.key)")
    assert (shown["vector"], shown["layer"], shown["alpha"]) == (settings["vector"], settings["layer"],
                                                                 settings["alpha"])
    # on a phone the Many prompts tab is in gradio's overflow menu, and the link still opens on it
    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, locale="en-US").new_page()
    phone.goto(link)
    phone.wait_for_function("() => /2 prompts at/.test(document.querySelector('#compare-summary')?.innerText "
                            "|| '')", timeout=60_000)
    assert phone.locator("#compare-table").is_visible() and not phone.locator("#explore-prompt").is_visible()
    phone.close()


def test_a_saved_comparison_whose_vector_no_longer_fits_the_model_still_opens_and_says_why(browser, tmp_path):
    """A comparison saved with the owner's own vector, opened after the server switched to a model that vector does
    not fit (a block past the new model's last): its vector was opened by the Many prompts tab's own page-load
    event, which is unqueued, so the refusal showed nothing and the tab never opened (an audit of the unqueued
    events).  The link's vectors now open with the link, where a refusal becomes the banner's notice, and the
    saved table is shown."""
    import dataclasses

    from steer_ui.policy import Policy
    from steer_ui.service import Service
    from steer_ui.store import open_library
    from steer_ui.tiny import tiny_handle
    from steer_ui.ui.app import build_demo, launch_kwargs
    from steer_ui.vector import random_vector

    policy = Policy()
    backend = Service(handle=tiny_handle("llama"), workdir=tmp_path, policy=policy,
                      library=open_library(str(tmp_path / "library.db"), policy))
    owner = "switched-owner-aaaaaaaa"
    backend.claim_owner(owner, None)
    vector = backend.add_vector(owner, dataclasses.replace(random_vector(backend.handle.arch.hidden_size, 3, seed=5),
                                                           name="deep one"))
    backend.compare(owner, "The weather today is\nMy favourite food is", False, vector, 3, 0.5, True, 0, 1.0,
                    sampling=backend.sampling(max_new_tokens=4, greedy=True))
    result_id = backend.save_comparison(owner)
    backend.load_model("random:llama-mini")  # two blocks: the saved vector's block 3 is past its last
    demo = build_demo(backend)
    demo.queue()
    port = free_port()
    demo.launch(**launch_kwargs(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True))
    try:
        stranger = _fresh(browser, f"http://127.0.0.1:{port}/?result={result_id}", ready=False)
        stranger.wait_for_function("() => /2 prompts at/.test(document.querySelector('#compare-summary')?.innerText "
                                   "|| '')", timeout=60_000)
        assert "My favourite food is" in stranger.locator("#compare-table").inner_text()
        banner = stranger.locator("#model-banner").inner_text()
        assert "A saved comparison" in banner and "could not be imported" in banner, banner
        stranger.close()
    finally:
        demo.close()
