"""A random walk through the Explore tab (issue #36): after every action, each panel either shows numbers made for
the controls as they now are, or is marked stale; nothing turns into an "Error" pill.

The controls are read from the page's own inputs (not from the page's script), so a script that misread them
would be caught; each panel's settings come from the ``data-key`` its handler returned with it.  The server is the
test's own (in-process), so "settled" means its queue has nothing waiting or running for a moment.
"""
from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS = ["The weather today is", "I think the new restaurant downtown is", "My favourite thing about trains is",
           "Paris is the capital of", "Once upon a time"]
RANDOM, RANDOM_ZH = "random direction", "随机方向"  # the random direction's name, and its label on a Chinese page
# the page's inputs for each key field (ui/panel_keys.py names them)
READERS = {
    "prompt": ("#explore-prompt textarea", "text"),
    "vector": ("#explore-vector input", "text"),
    "layer": ("#explore-layer input[type=number]", "number"),
    "alpha": ("#alpha-slider input[type=number]", "number"),
    "relative": ("#explore-relative input[type=checkbox]", "check"),
    "vector_seed": ("#explore-vector-seed input", "number"),
    "whole_vocabulary": ("#delta-whole-vocabulary input[type=checkbox]", "check"),
    "greedy": ("#explore-greedy input[type=checkbox]", "check"),
    "temperature": ("#explore-temperature input[type=number]", "number"),
    "top_k": ("#explore-top-k input", "number"),
    "top_p": ("#explore-top-p input[type=number]", "number"),
    "repetition": ("#explore-repetition input[type=number]", "number"),
    "max_tokens": ("#explore-max-tokens input[type=number]", "number"),
    "seed": ("#explore-seed input", "number"),
    "delta_limit": ("#delta-limit input, #delta-limit textarea", "text"),
    "alpha_max": ("#explore-alpha-max input", "number"),
    "target": ("#explore-target input, #explore-target textarea", "text"),
    "extended": ("#alpha-extend input[type=checkbox]", "check"),
}
PANELS = ("bars", "generations", "dose")
SAMPLING_FIELDS = {"greedy", "temperature", "top_k", "top_p", "repetition", "max_tokens", "seed", "delta_limit"}


def controls(page) -> dict:
    """Every key field's value as the page's inputs show it (hidden ones too), read from the DOM in one call."""
    raw = page.evaluate("""(readers) => Object.fromEntries(Object.entries(readers).map(([name, [sel, kind]]) => {
        const box = document.querySelector(sel);
        if (box === null) return [name, ['missing', null]];
        return [name, [kind, kind === 'check' ? box.checked : box.value]];
    }))""", READERS)
    out = {}
    for name, (kind, value) in raw.items():
        assert kind != "missing", f"no input for {name} ({READERS[name][0]})"
        if kind == "check":
            out[name] = bool(value)
        elif value == "":
            out[name] = None
        else:
            out[name] = float(value) if kind == "number" else value
    if out.get("vector") == RANDOM_ZH:  # the box shows the choice's label, in the page's language
        out["vector"] = RANDOM
    return out


def panel_states(page) -> dict:
    """{panel: (key or None, stale)} from the elements Explore's handlers returned (other tabs' results answer to
    their own controls)."""
    found = page.evaluate("""() => Array.from(document.querySelectorAll('.made-for[data-key][data-view=explore]'))
        .map(e => [e.dataset.panel, e.dataset.key, e.classList.contains('stale')])""")
    return {panel: (json.loads(key), stale) for panel, key, stale in found}


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return a == b


def mismatches(key: dict, now: dict) -> list[str]:
    return [f"{k}: panel {v!r} vs controls {now[k]!r}" for k, v in key.items() if k in now and not _same(v, now[k])]


def error_pills(page) -> list[str]:
    """Components gradio marks as failed (its status tracker's red "Error"), not toasts."""
    return page.evaluate("() => Array.from(document.querySelectorAll('.block .error, .wrap.error'))"
                         ".filter(e => e.offsetParent !== null && !e.closest('.toast-body'))"
                         ".map(e => (e.closest('[id]') || e).id || e.className)")


def _server_busy(demo) -> bool:
    queue = demo._queue
    return bool(queue.event_ids_to_events) or any(job is not None for job in queue.active_jobs)


def follows(page, panels) -> bool:
    """Whether each of ``panels`` shows numbers for the controls as they are (unmarked)."""
    now, states = controls(page), panel_states(page)
    return all(p in states and not states[p][1] and not mismatches(states[p][0], now) for p in panels)


def settle(demo, page, fresh=(), quiet: float = 0.05, timeout: float = 120.0) -> None:
    """Wait until the app's queue is empty and stays so across two round trips through the page's main thread,
    and until the ``fresh`` panels follow the controls (for at most 30 s: the check then says which did not).
    A chain's next part is sent by the page only once it has drawn the previous part's outputs, which on two
    busy cores can take seconds after the server finished: the round trips wait for that drawing, and waiting
    for the promised panels themselves (rather than a fixed quiet time) keeps a step as short as the app lets it."""
    start = time.monotonic()
    deadline = start + timeout
    time.sleep(0.1)  # the action's request is on its way
    calm = 0
    while calm < 2:
        assert time.monotonic() < deadline, "the app did not settle"
        while _server_busy(demo):
            assert time.monotonic() < deadline, "the app did not settle"
            time.sleep(0.05)
        page.evaluate("() => new Promise((done) => requestAnimationFrame(() => setTimeout(done, 30)))")
        time.sleep(quiet)
        if _server_busy(demo) or (fresh and time.monotonic() < start + 30 and not follows(page, fresh)):
            calm = 0
        else:
            calm += 1


# what a link restores, compared between the owner's page and a stranger's (the vector is named per session)
LINK_FIELDS = ("prompt", "layer", "alpha", "relative", "vector_seed", "alpha_max")


@dataclass
class Walk:
    page: object
    demo: object
    rng: random.Random
    vectors: list[str]
    bad_file: Path
    browser: object = None  # for a stranger's fresh context (open_link)
    log: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # promises the page kept only by marking a panel stale
    timings: list[tuple] = field(default_factory=list)  # (action, acting, settling, checking) seconds

    # ----------------------------------------------------------------------------------------- actions
    def type_prompt(self):
        box = self.page.locator("#explore-prompt textarea")
        box.fill(self.rng.choice(PROMPTS))
        key = self.rng.choice(["Shift+Enter", "Enter", None])
        if key:
            box.press(key)  # Shift+Enter submits (the bars, then both generations); Enter adds a line
        return {"fresh": ("bars", "generations")} if key == "Shift+Enter" else {}

    def pick_vector(self):
        name = self.rng.choice(self.vectors)
        # the random direction's label is in the page's language (the walk switches it); its value is the name
        shown = re.compile(f"^(✓\\s*)?({re.escape(name)}|{re.escape(RANDOM_ZH)})$") if name == RANDOM else name
        same = controls(self.page)["vector"] == name
        self.page.locator("#explore-vector input").click()
        self.page.locator("ul[role=listbox] li", has_text=shown).first.click()
        return {} if same else {"fresh": PANELS}  # picking the shown vector again changes nothing

    def move_layer(self):
        box = self.page.locator("#explore-layer input[type=number]")
        top = int(float(box.get_attribute("max") or 3))
        value = self.rng.randint(0, top)
        same = float(box.input_value()) == value
        box.fill(str(value))
        box.press("Tab")  # leaving the box releases the slider
        return {} if same else {"fresh": PANELS}

    def type_alpha(self):
        box = self.page.locator("#alpha-slider input[type=number]")
        top = float(box.get_attribute("max") or 1)
        value = float(f"{self.rng.uniform(-top, top):.3g}")
        if float(box.input_value() or 0) == value:
            return {}
        box.fill(str(value))
        if self.rng.random() < 0.5:
            box.press("Enter")
        else:
            self.page.locator("#explore-prompt textarea").click()  # leave the box without Enter
        return {"fresh": PANELS}

    def bad_alpha(self):
        """Type an α the slider cannot take (past either end, or not a number) and commit it, key by key as a
        person does: nothing runs, every panel stays as it was, the box shows its value again, one line says why."""
        box = self.page.locator("#alpha-slider input[type=number]")
        shown = box.input_value()
        top = float(box.get_attribute("max") or 1)
        typed = self.rng.choice([f"{top * self.rng.uniform(1.5, 10):.4g}", f"{-top * 3:.4g}", "abc"])
        before = panel_states(self.page)
        box.click()
        box.press("Control+a")
        self.page.keyboard.type(typed)
        box.press(self.rng.choice(["Enter", "Tab"]))
        self.page.locator("#alpha-refusal").wait_for(timeout=10_000)
        return {"unchanged": before, "alpha_shown": shown}

    def open_link(self):
        """Copy link (or Share, for the session's own vector), then open the link in a fresh browser context, as
        a stranger: it restores this view, and where the owner's bars are fresh, the stranger's readout is the
        owner's digit for digit."""
        vector = self.page.locator("#explore-vector input").input_value()
        button = "#share-btn" if vector.startswith("mean-diff") and self.rng.random() < 0.7 else "#copy-link"
        self.page.evaluate("() => { const l = document.querySelector('#explore-link textarea, #explore-link input');"
                           " if (l) l.value = ''; }")
        self.page.locator(button).click()
        self.page.wait_for_function("() => { const l = document.querySelector('#explore-link textarea, "
                                    "#explore-link input'); return l && l.value.startsWith('http'); }",
                                    timeout=20_000)
        link = self.page.locator("#explore-link textarea, #explore-link input").first.input_value()
        return {"link": link}

    def drag_alpha(self):
        box = self.page.locator("#alpha-slider input[type=range]").bounding_box()
        y = box["y"] + box["height"] / 2
        start = box["x"] + box["width"] * self.rng.uniform(0.1, 0.9)
        end = box["x"] + box["width"] * self.rng.uniform(0.1, 0.9)
        self.page.mouse.move(start, y)
        self.page.mouse.down()
        for i in range(1, 4):
            self.page.mouse.move(start + (end - start) * i / 3, y)
            time.sleep(0.03)
        self.page.mouse.up()
        return {"fresh": PANELS}

    def toggle_extend(self):
        self.page.locator("#alpha-extend input[type=checkbox]").click()
        return {"fresh": PANELS}

    def generate(self):
        self.page.locator("#generate-btn").click()
        return {"fresh": ("bars", "generations")}

    def sweep(self):
        self.page.locator("#sweep-btn").click()
        return {"fresh": ("dose",)}

    def change_sampling(self):
        if not self.page.locator("#explore-max-tokens").is_visible():
            self.page.locator("#explore-sampling .label-wrap").first.click()
        box = self.page.locator("#explore-max-tokens input[type=number]")
        box.fill(str(self.rng.randint(2, 8)))
        box.press("Tab")
        # a person's next action comes later than the script's: a drag begun at once (step 184 of seed 36) was
        # sent with the slider's previous value and its generations rightly marked stale, not promised fresh
        self.page.wait_for_timeout(500)
        return {}

    def switch_language(self):
        choice = self.rng.choice(["English", "简体中文"])
        self.page.locator("#lang-switch label", has_text=choice).click()
        return {}

    def bad_upload(self):
        self.page.get_by_role("tab", name="Export").or_(self.page.get_by_role("tab", name="导出")).first.click()
        clear = self.page.locator("#import-file .icon-button-wrapper button")  # "Clear", in either language
        if clear.count() and clear.first.is_visible():  # the last file's box gives way to an input
            clear.first.click()
        self.page.locator("#import-file input[type=file]").set_input_files(str(self.bad_file))
        self.page.locator(".toast-body", has_text=self.bad_file.name).first.wait_for(timeout=20_000)
        self.page.get_by_role("tab", name="Explore").or_(self.page.get_by_role("tab", name="探索")).first.click()
        return {}

    def cancel(self):
        """Train a vector on the Train tab and press Cancel at once or a moment later: whichever wins, the page
        says so in one line (no Error pill) and Explore's panels are untouched."""
        self.page.get_by_role("tab", name="Train").or_(self.page.get_by_role("tab", name="训练")).first.click()
        self.page.locator("#train-btn").click()
        time.sleep(self.rng.choice([0.0, 0.2]))
        self.page.locator("#train-cancel").click()
        return {"train_final": True}

    def back_to_explore(self):
        self.page.get_by_role("tab", name="Explore").or_(self.page.get_by_role("tab", name="探索")).first.click()

    ACTIONS = ("type_prompt", "pick_vector", "move_layer", "type_alpha", "drag_alpha", "toggle_extend", "generate",
               "sweep", "change_sampling", "switch_language", "bad_upload", "cancel", "bad_alpha", "open_link")
    WEIGHTS = (3, 2, 2, 3, 2, 1, 3, 2, 1, 1, 1, 1, 1, 1)  # α moves are the dearest steps (~2.6 and ~4.6 s here)

    def stranger_opens(self, where: str, link: str) -> None:
        """The link in a fresh context: the owner's view (LINK_FIELDS) and, where the owner's bars follow the
        controls, the owner's readout."""
        assert len(link) <= 2000 and link == self.page.url, f"{where}: the link is not the address bar's URL"
        owner_now, owner_states = controls(self.page), panel_states(self.page)
        readout = self.page.locator("#explore-readout").inner_text()
        lang = self.page.evaluate("() => document.querySelector('#lang-switch input:checked')?.value || 'en'")
        # the stranger reads the page in the owner's language, so the readouts compare word for word
        context = self.browser.new_context(viewport={"width": 1366, "height": 900},
                                           locale="zh-CN" if lang == "zh-CN" else "en-US")
        try:
            stranger = context.new_page()
            stranger.goto(link)
            stranger.wait_for_selector("#next-token-bars .js-plotly-plot", timeout=60_000)
            stranger.locator("#explore-sampling .label-wrap").first.click()  # every control in the page, as the owner's
            stranger.locator("#explore-max-tokens").wait_for(timeout=10_000)
            settle(self.demo, stranger, fresh=("bars",))
            theirs = controls(stranger)
            wrong = [f"{k}: owner {owner_now[k]!r}, stranger {theirs[k]!r}" for k in LINK_FIELDS
                     if not _same(owner_now[k], theirs[k])]
            assert not wrong, f"{where}: the link opened another view: {wrong} ({link})"
            bars_key, bars_stale = owner_states["bars"]
            if not bars_stale and not mismatches(bars_key, owner_now):
                assert stranger.locator("#explore-readout").inner_text() == readout, \
                    f"{where}: the stranger's numbers differ from the owner's ({link})"
        finally:
            context.close()

    # ------------------------------------------------------------------------------------------ the walk
    def check(self, step: int, action: str, promise: dict) -> None:
        now = controls(self.page)
        states = panel_states(self.page)
        toasts = [t.replace("\n", " ")[:160] for t in self.page.locator(".toast-body").all_inner_texts()]
        where = f"step {step} ({action}; walk so far: {self.log[-6:]}; toasts: {toasts})"
        assert set(states) == set(PANELS), f"{where}: panels with a key: {sorted(states)}"
        for panel, (key, stale) in states.items():
            wrong = mismatches(key, now)
            if wrong and not stale:
                raise AssertionError(f"{where}: {panel} shows numbers for other settings, unmarked: {wrong}")
            if not wrong and stale:
                raise AssertionError(f"{where}: {panel} is marked stale but was made for these settings")
            if panel in promise.get("fresh", ()) and wrong:
                # A drag right after a typed max tokens once generated with the slider's previous value (step 184 of
                # seed 36, at stop 55; not reproduced outside the walk): the panel said so (stale), which is the
                # page's word kept, so it is recorded and printed, not failed; anything else promised must follow.
                if stale and {w.split(":")[0] for w in wrong} <= SAMPLING_FIELDS:
                    self.findings.append(f"{where}: {panel} marked stale, not fresh: {wrong}")
                    continue
                raise AssertionError(f"{where}: {panel} should have followed the controls: {wrong}")
        pills = error_pills(self.page)
        assert pills == [], f"{where}: components in an Error state: {pills}"
        if "unchanged" in promise:  # a refused α: nothing ran, nothing was marked
            assert states == promise["unchanged"], f"{where}: a refused α changed the panels"
            shown = self.page.locator("#alpha-slider input[type=number]").input_value()
            assert shown == promise["alpha_shown"], f"{where}: the α box shows {shown!r} after a refusal"
        if promise.get("link"):
            self.stranger_opens(where, promise["link"])
        if promise.get("train_final"):  # a cancel's status line ends final, not at "Stopping the running job…"
            status = self.page.locator("#train-status").inner_text()
            assert "Stopping" not in status and "正在停止" not in status, f"{where}: train status stays {status!r}"
            self.back_to_explore()

    def run(self, steps: int) -> None:
        settle(self.demo, self.page)
        self.check(0, "start", {})
        for step in range(1, steps + 1):
            action = self.rng.choices(self.ACTIONS, self.WEIGHTS)[0]
            self.log.append(action)
            started = time.monotonic()
            promise = getattr(self, action)()
            acted = time.monotonic()
            settle(self.demo, self.page, fresh=promise.get("fresh", ()))
            settled = time.monotonic()
            self.check(step, action, promise)
            self.timings.append((action, acted - started, settled - acted, time.monotonic() - settled))
        print(self.summary())
        for finding in self.findings:
            print("finding:", finding)

    def summary(self) -> str:
        """Seconds per action (acting, settling, checking): where a walk's time goes, printed with ``-s``."""
        rows = {}
        for action, *parts in self.timings:
            rows.setdefault(action, []).append(parts)
        lines = [f"{'action':16} {'n':>3} {'act':>6} {'settle':>6} {'check':>6}"]
        for action, parts in sorted(rows.items()):
            mean = [sum(p[i] for p in parts) / len(parts) for i in range(3)]
            lines.append(f"{action:16} {len(parts):3d} " + " ".join(f"{m:6.2f}" for m in mean))
        total = [sum(t[i + 1] for t in self.timings) for i in range(3)]
        lines.append(f"{'total':16} {len(self.timings):3d} " + " ".join(f"{m:6.1f}" for m in total))
        return "\n".join(lines)
