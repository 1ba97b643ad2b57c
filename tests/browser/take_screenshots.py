"""Screenshots of every tab with the embedded model, driven the way a user would (not a test).

    python tests/browser/take_screenshots.py [--out assets/screenshots] [--model embedded] [--only several,chat]

Loads bundled data, trains a mean-difference vector on the sentiment pairs and
a small TSV on the QA answers, steers, sweeps, scores and exports, saving one
PNG per tab (and the Explore tab in Chinese), then Explore with two vectors and a chat side by side (``--only``
takes just those).  Needs /usr/bin/chromium; CJK
text needs a font such as Debian's fonts-wqy-microhei.
"""
from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
PROMPT = "I went to the cinema yesterday and the film was"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick(page, elem_id: str, text: str) -> None:
    """Choose ``text`` in a gradio dropdown."""
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill(text)
    page.locator("ul[role=listbox] li", has_text=text).first.click()


def wait_text(page, selector: str, text: str, timeout: float = 600) -> None:
    try:
        page.wait_for_function(f"() => (document.querySelector('{selector}')?.innerText || '').includes({text!r})",
                               timeout=timeout * 1000)
    except Exception:
        page.screenshot(path="/tmp/steer_ui_screenshot_failure.png", full_page=True)
        raise


def settle(page, seconds: float = 1.0) -> None:
    """Wait until gradio shows no pending spinner, then a little more for plotly to draw."""
    page.wait_for_function("() => !document.querySelector('.progress-text, .eta-bar')", timeout=600_000)
    time.sleep(seconds)


def quiet(page) -> None:
    """Every Explore panel made for the controls (none marked stale), its generations finished, no toast left."""
    page.wait_for_function("() => document.querySelectorAll('.made-for').length >= 3 && "
                           "!document.querySelector('.made-for.stale')", timeout=600_000)
    settle(page, 3)
    for button in page.locator("[data-testid=toast-close]").all():
        button.click()


def several_vectors(page, out: Path) -> None:
    """Explore with a second vector added under the main one (the random direction, its own α), both steering."""
    page.get_by_role("tab", name="Explore").click()
    page.locator("#add-vector-btn").click()
    page.locator("#explore-term-2").wait_for(state="visible", timeout=30_000)
    quiet(page)
    number = page.locator("#alpha-slider-2 input[type=number]")
    number.fill("0.03")  # a random direction beside the default vector, gently: more breaks the small model's text
    number.press("Enter")
    page.wait_for_function("() => (window.__steerControls?.explore?.extra || '').includes('0.03')", timeout=60_000)
    wait_text(page, "#explore-readout", "Term 2", timeout=300)
    quiet(page)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(out / "several_vectors.png"))


def chat(page, out: Path) -> None:
    """Explore's Chat: two turns answered by the unsteered and the steered assistant side by side."""
    page.get_by_role("tab", name="Explore").click()
    quiet(page)
    page.locator("#explore-prompt-kind label", has_text="Chat").click()
    page.wait_for_selector("#explore-chat", state="visible", timeout=30_000)
    for n, text in enumerate(("What did you think of the film?", "And the ending?"), 1):
        page.locator("#chat-message textarea").fill(text)
        page.locator("#chat-send").click()
        page.wait_for_function(
            "(n) => ['unsteered', 'steered'].every(s => document.querySelectorAll(`#chat-${s} .message-row`).length"
            " >= 2 * n) && document.querySelector('#chat-message textarea').value === ''", arg=n, timeout=600_000)
        settle(page, 2)
    page.locator("#chat-sides").screenshot(path=str(out / "chat.png"))  # the group itself has no box of its own


def tsv(page, out: Path) -> None:
    """The Train tab after a short TSV run on the bundled QA answers: its curves, results and settings."""
    page.get_by_role("tab", name="Data").click()
    pick(page, "data-bundled", "qa_answers.csv")
    page.locator("#data-use-bundled").click()
    wait_text(page, "#data-summary", "qa_answers.csv")
    page.get_by_role("tab", name="Train").click()
    page.locator("#train-method label", has_text="tsv").click()
    page.locator("#train-tsv-init-epochs input[type=number]").fill("5")
    page.locator("#train-tsv-aug-epochs input[type=number]").fill("5")
    page.locator("#train-tsv-advanced").get_by_text("Advanced settings").click()
    page.locator("#train-tsv-compare input[type=checkbox]").uncheck()
    page.locator("#train-btn").click()
    # the status names the method while it trains too ("tsv: epoch 3 ..."): wait for the line that ends the run,
    # or the shot catches the curves half drawn and the Detect tab after it finds no TSV vector yet
    wait_text(page, "#train-status", "Trained tsv")
    settle(page, 2)
    page.screenshot(path=str(out / "train_tsv.png"), full_page=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "assets" / "screenshots"))
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--only", default="", help="comma-separated: several, chat, tsv (default: every view)")
    args = parser.parse_args()
    only = {v for v in args.only.split(",") if v}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    from steer_ui.service import Service
    from steer_ui.ui.app import build_demo, launch_kwargs

    backend = Service(default_view=True)  # the first page a person sees, as app.py starts it (explore_zh.png)
    backend.load_model(args.model)
    demo = build_demo(backend)
    demo.queue()
    port = free_port()
    demo.launch(**launch_kwargs(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True))
    url = f"http://127.0.0.1:{port}/"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000}, locale="en-US")
        page.goto(url)
        page.wait_for_selector("#next-token-bars .js-plotly-plot", timeout=120_000)
        settle(page)
        if only:
            views = {"several": (several_vectors, "several_vectors"), "chat": (chat, "chat"), "tsv": (tsv, "train_tsv")}
            for view, (shoot, _) in views.items():
                if view in only:
                    shoot(page, out)
            browser.close()
            demo.close()
            print("\n".join(str(out / f"{name}.png") for view, (_, name) in views.items() if view in only))
            return 0

        page.get_by_role("tab", name="Model").click()
        settle(page, 2)
        page.screenshot(path=str(out / "model.png"), full_page=True)

        page.get_by_role("tab", name="Data").click()
        pick(page, "data-bundled", "sentiment_pairs.csv")
        page.locator("#data-use-bundled").click()
        wait_text(page, "#data-summary", "sentiment_pairs.csv")
        settle(page, 2)
        page.screenshot(path=str(out / "data.png"), full_page=True)

        page.get_by_role("tab", name="Train").click()
        page.locator("#train-method label", has_text="mean-diff").click()
        page.locator("#train-btn").click()
        wait_text(page, "#train-status", "Trained")
        settle(page, 2)
        page.screenshot(path=str(out / "train.png"), full_page=True)

        page.get_by_role("tab", name="Explore").click()
        settle(page)
        prompt = page.locator("#explore-prompt textarea")
        prompt.fill(PROMPT)
        number = page.locator("#alpha-slider input[type=number]")
        number.fill("0.12")  # a mean-difference vector at relative α 0.4 repeated one word: steered, still text
        number.press("Enter")
        prompt.press("Enter")  # next-token view, then generate both sides
        wait_text(page, "#steered-text", " ", timeout=300)
        settle(page)
        page.locator("#sweep-btn").click()
        page.wait_for_selector("#dose-response .js-plotly-plot", timeout=300_000)
        # drag a little to show the live path, then release to regenerate
        box = page.locator("#alpha-slider input[type=range]").bounding_box()
        x, y = box["x"] + box["width"] * 0.56, box["y"] + box["height"] / 2
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x + box["width"] * 0.025, y, steps=5)
        page.mouse.up()
        settle(page, 3)
        page.screenshot(path=str(out / "explore.png"), full_page=True)

        tsv(page, out)

        page.get_by_role("tab", name="Detect").click()
        page.locator("#detect-from-explore").click()
        settle(page)
        page.locator("#detect-btn").click()
        wait_text(page, "#detect-summary", "AUROC")
        settle(page, 2)
        page.screenshot(path=str(out / "detect.png"), full_page=True)

        page.get_by_role("tab", name="Export / Import").click()
        pick(page, "export-vector", "mean-diff")
        page.locator("#export-format label", has_text="gguf").click()
        page.locator("#export-btn").click()
        wait_text(page, "#export-status", "gguf")
        settle(page, 2)
        page.screenshot(path=str(out / "export.png"), full_page=True)

        zh = browser.new_page(viewport={"width": 1440, "height": 1000}, locale="zh-CN")
        zh.goto(url)
        zh.wait_for_selector("#next-token-bars .js-plotly-plot", timeout=120_000)
        settle(zh, 2)
        zh.screenshot(path=str(out / "explore_zh.png"), full_page=True)
        several_vectors(page, out)
        chat(page, out)
        browser.close()
    demo.close()
    print("\n".join(str(p) for p in sorted(out.glob("*.png"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
