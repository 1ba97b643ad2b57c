"""gradio_client against the launched app: every named endpoint, errors that keep the session, concurrency.

The tiny-model tests are fast and always run; the last test drives the embedded
Gemma 3 270M and is marked ``integration``.
"""
from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from same_results import DECODE_TOL, same

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from steer_ui.service import RANDOM, Service  # noqa: E402

ENDPOINTS = ["/load_model", "/upload_dataset", "/train", "/next_token", "/generate", "/sweep", "/detect",
             "/export_vector", "/import_vector", "/compare"]
PROMPT = "The weather today is"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(handle, tmp_path_factory):
    from steer_ui.ui.app import build_demo, launch_kwargs

    backend = Service(handle=handle, workdir=tmp_path_factory.mktemp("app"))
    demo = build_demo(backend)
    demo.queue(default_concurrency_limit=4)
    port = _free_port()
    demo.launch(**launch_kwargs(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                                max_file_size=backend.max_file_bytes))
    return demo, backend, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    from steer_ui.tiny import tiny_handle

    demo, backend, url = launch(tiny_handle("llama"), tmp_path_factory)
    yield demo, backend, url
    demo.close()


@pytest.fixture(scope="module")
def app(launched):
    return launched[1:]


def client(url, download_to=None) -> Client:
    return Client(url, verbose=False, download_files=str(download_to) if download_to else False)


def next_token(c: Client, alpha: float, layer: int = 1, vector: str = RANDOM, seed: int = 0):
    return c.predict(PROMPT, vector, layer, alpha, True, seed, api_name="/next_token")


def generate(c: Client, alpha: float, tokens: int = 6, layer: int = 1, vector: str = RANDOM):
    return c.predict(PROMPT, vector, layer, alpha, True, 0, True, 0.8, 0, 1.0, 1.0, tokens, 0, api_name="/generate")


def test_named_endpoints_are_published(app):
    _, url = app
    api = client(url).view_api(return_format="dict", print_info=False)
    assert set(ENDPOINTS) <= set(api["named_endpoints"])


def test_alpha_zero_gives_identical_sides(app):
    _, url = app
    c = client(url)
    numbers = next_token(c, 0.0)[-1]
    assert numbers["kl"] == pytest.approx(0.0, abs=1e-6)
    assert same(numbers["unsteered"], numbers["steered"]) is None
    out = generate(c, 0.0)[-1]
    assert out["done"] and out["unsteered"]["text"] == out["steered"]["text"]
    steered = generate(c, 8.0)[-1]
    assert steered["steered"]["text"] != steered["unsteered"]["text"]
    assert len(steered["steered"]["tokens"]) == 6 and "delta_logit" in steered["steered"]["tokens"][0]


def test_a_delta_logit_limit_over_http_holds_every_steered_step(app):
    _, url = app
    c = client(url)
    # the 13 arguments clients sent before the limit existed still work: the limit defaults to the vector's own
    # bound, and the random direction states none
    assert "kept" not in generate(c, 8.0)[-1]["steered"]["tokens"][0]
    *_, table, out = c.predict(PROMPT, RANDOM, 1, 8.0, True, 0, True, 0.8, 0, 1.0, 1.0, 6, 0, 0.5,
                                    api_name="/generate")
    tokens = out["steered"]["tokens"]
    assert tokens and all(t["kept"] * t["max_delta_logit"] <= 0.5 + 1e-4 for t in tokens)
    assert any(t["kept"] < 1 for t in tokens)  # α 8 on a random direction goes over 0.5: the limit bit
    assert "change_kept" in table["headers"]


def test_a_long_generation_streams_at_most_four_frames_a_second_and_ends_with_all_of_it(app):
    """Each streamed frame costs the page a pass over every component's loading status: frames are paced."""
    import time

    from steer_ui.ui.explore_tab import FRAME_INTERVAL_S

    _, url = app
    job = client(url).submit(PROMPT, RANDOM, 1, 0.5, True, 0, True, 0.8, 0, 1.0, 1.0, 200, 0,
                             api_name="/generate")
    start = time.monotonic()
    final = job.result(timeout=120)
    elapsed = time.monotonic() - start
    frames = job.outputs()
    assert frames[-1][-1] == final[-1] and final[-1]["steered"]["tokens"]  # the last frame has every token
    assert final[-1]["steps"] > 60  # many tokens: unpaced, nearly every one would be a frame
    intermediate = len(frames) - 1
    assert intermediate <= elapsed / FRAME_INTERVAL_S + 1, (intermediate, elapsed)
    if elapsed > 3 * FRAME_INTERVAL_S:
        assert intermediate >= 1  # still streamed, not held back to the end


def test_of_two_generations_of_one_client_the_cancelled_one_says_so_in_one_line(app):
    """One session's newest generation cancels its older ones (they write the same panels); the page simply shows
    the newest, while an API caller is told, instead of taking the last partial frame for a whole answer."""
    _, url = app
    c = client(url)
    args = (PROMPT, RANDOM, 1, 0.5, True, 0, True, 0.8, 0, 1.0, 1.0, 200, 0)
    for _attempt in range(3):  # both must be decoding at once: sent together, the second starts within a step
        jobs = [c.submit(*args, api_name="/generate") for _ in range(2)]
        finished, told = [], []
        for job in jobs:
            try:
                finished.append(job.result(timeout=60))
            except Exception as exc:  # noqa: BLE001 - the refusal under test
                told.append(str(exc))
        if told:
            assert len(told) == 1 and len(finished) == 1, told
            assert "newer generation from this session took its place" in told[0] and "\n" not in told[0]
            assert finished[0][-1]["done"] and len(finished[0][-1]["steered"]["tokens"]) > 60
            return
    pytest.fail("in three tries neither generation was cancelled by the other")


def test_a_vector_that_states_its_bound_is_steered_within_it_unless_the_client_says_otherwise(app, tmp_path):
    import dataclasses

    from steer_ui.vector import random_vector

    backend, url = app
    c = client(url)
    bounded = dataclasses.replace(random_vector(backend.handle.arch.hidden_size, 1, seed=0), max_delta_logit=0.5)
    name = c.predict(handle_file(str(bounded.save(tmp_path / "bounded.safetensors"))),
                     api_name="/import_vector")[2]["value"]
    # the 13 arguments of clients from before the limit: the vector's own bound applies
    tokens = generate(c, 8.0, vector=name)[-1]["steered"]["tokens"]
    assert all(t["kept"] * t["max_delta_logit"] <= 0.5 + 1e-4 for t in tokens) and any(t["kept"] < 1 for t in tokens)
    # 0 turns it off; another limit replaces it
    off = c.predict(PROMPT, name, 1, 8.0, True, 0, True, 0.8, 0, 1.0, 1.0, 6, 0, 0, api_name="/generate")[-1]
    assert "kept" not in off["steered"]["tokens"][0]
    tighter = c.predict(PROMPT, name, 1, 8.0, True, 0, True, 0.8, 0, 1.0, 1.0, 6, 0, 0.1, api_name="/generate")[-1]
    assert all(t["kept"] * t["max_delta_logit"] <= 0.1 + 1e-4 for t in tighter["steered"]["tokens"])


def test_sweep_returns_the_dose_response_table(app):
    _, url = app
    *_, fig, tab = client(url).predict(PROMPT, RANDOM, 1, 0.5, True, 0, 2.0, "", api_name="/sweep")
    assert tab["headers"][:3] == ["alpha", "raw_alpha", "kl"]
    alphas = [row[0] for row in tab["data"]]
    assert alphas[0] == -2.0 and alphas[-1] == 2.0 and len(alphas) == 21
    assert fig is not None


def test_bad_uploads_error_and_the_session_keeps_working(app, tmp_path):
    _, url = app
    c = client(url)
    summary = c.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")[0]
    assert "capitals_statements.csv" in summary
    bad = tmp_path / "wrong_columns.csv"
    bad.write_text("foo,bar\n1,2\n")
    with pytest.raises(Exception, match="wrong_columns.csv"):
        c.predict(handle_file(str(bad)), "auto", api_name="/upload_dataset")
    pickle = tmp_path / "evil.pkl"
    pickle.write_bytes(b"\x80\x04\x95\x00\x00")
    with pytest.raises(Exception, match="evil.pkl"):
        c.predict(handle_file(str(pickle)), "auto", api_name="/upload_dataset")
    junk_vector = tmp_path / "junk.gguf"
    junk_vector.write_bytes(b"GGUF but not really")
    with pytest.raises(Exception, match="junk.gguf"):
        c.predict(handle_file(str(junk_vector)), api_name="/import_vector")
    # the same session still has its data and still answers
    assert c.predict(api_name="/bundled_dataset", name="capitals_statements.csv", schema="auto")[0] == summary
    assert next_token(c, 0.0)[-1]["kl"] == pytest.approx(0.0, abs=1e-6)


def test_export_then_import_in_another_session(app, tmp_path):
    _, url = app
    files, status = client(url, download_to=tmp_path).predict(RANDOM, "native", api_name="/export_vector")
    assert len(files) == 1 and files[0].endswith(".safetensors") and "native" in status
    other = client(url)
    result = other.predict(handle_file(files[0]), api_name="/import_vector")
    name = result[2]["value"]
    assert name in [c[0] for c in result[2]["choices"]]
    assert result[3]["value"] == result[4]["value"] == name  # every vector picker (Explore, Detect, Export)
    imported = next_token(other, 2.0, vector=name)[-1]
    random_ = next_token(other, 2.0, vector=RANDOM)[-1]  # same seeded direction, moved to the same layer
    assert imported["kl"] == pytest.approx(random_["kl"], rel=1e-4)
    gguf, _ = client(url, download_to=tmp_path).predict(RANDOM, "gguf", api_name="/export_vector")
    assert gguf[0].endswith(".gguf")


def test_errors_follow_the_session_language(app):
    _, url = app
    c = client(url)
    assert c.predict("zh-CN", api_name="/set_language") == "zh-CN"
    with pytest.raises(Exception, match="提示词为空"):
        c.predict("  ", RANDOM, 1, 1.0, True, 0, api_name="/next_token")
    english = client(url)
    with pytest.raises(Exception, match="prompt is empty"):
        english.predict("  ", RANDOM, 1, 1.0, True, 0, api_name="/next_token")


def test_train_and_detect_report_plainly(app):
    _, url = app
    c = client(url)
    c.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")
    out = c.predict("mean-diff", 1, False, '{"position": "last"}', api_name="/train")
    assert out["vector"].startswith("mean-diff L1") and out["vector"] in out["vectors"]
    assert out["report"]["layer"] == 1
    assert out["kept"] is False and "not kept" in out["note"]  # no X-Steer-Owner: told its work is not kept
    with pytest.raises(Exception, match="unknown setting"):
        c.predict("mean-diff", 1, False, '{"epochs": 3}', api_name="/train")
    assert c.predict(api_name="/methods")[0]["name"] == "mean-diff"
    # the probe's status is its whole line (a browser review saw "P": the line's first character)
    probed = c.predict("last", 0, api_name="/probe_layers")
    assert probed[-1] == f"Probed every layer: the best is layer {probed[3]['value']}, now on the layer slider."
    with pytest.raises(Exception, match="TSV"):
        c.predict(RANDOM, {"headers": ["prompt", "answer"], "data": [["q", "a"]]}, None, api_name="/detect")


def test_cancel_over_http_answers_with_how_the_job_ended(app):
    """An API client's Cancel always gets one line: nothing running, or the job's own end (it waits for it)."""
    import time

    backend, url = app
    c = client(url)
    assert c.predict(api_name="/cancel") == "Nothing is running in this session."
    c.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")
    before = backend.vector_names(c.session_hash)
    job = c.submit("tsv", 1, False, '{"epochs": 200, "compare": false}', api_name="/train")
    deadline = time.monotonic() + 60
    while backend.job_outcome(c.session_hash) != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.job_outcome(c.session_hash) == "running"
    assert c.predict(api_name="/cancel") == "Cancelled: nothing was kept, and your session is as it was."
    with pytest.raises(Exception, match="Cancelled"):
        job.result(timeout=60)
    assert backend.vector_names(c.session_hash) == before


def test_concurrent_sessions_get_exactly_their_own_results(app):
    """Several clients with different α at once: each result equals the one computed alone."""
    _, url = app
    alphas = [-6.0, -2.0, 0.0, 3.0, 7.0]
    alone = {a: (next_token(client(url), a)[-1], generate(client(url), a, tokens=5)[-1]) for a in alphas}

    def run(alpha):
        c = client(url)
        return alpha, next_token(c, alpha)[-1], generate(c, alpha, tokens=5)[-1]

    with ThreadPoolExecutor(max_workers=len(alphas)) as pool:
        results = list(pool.map(run, alphas * 2))
    def view(numbers, alpha):  # at α = 0 every Δlogit is float noise, so which tokens rank top is arbitrary
        return {k: v for k, v in numbers.items() if alpha or k not in ("promoted", "suppressed", "max_delta_token")}

    for alpha, numbers, gen in results:
        assert same(view(numbers, alpha), view(alone[alpha][0], alpha)) is None
        assert gen["steered"]["text"] == alone[alpha][1]["steered"]["text"]
        assert same(gen["steered"]["tokens"], alone[alpha][1]["steered"]["tokens"], DECODE_TOL) is None
    # each α its own view: the KLs of one α agree (to float noise: a view's sums may run in another order when
    # moves come together, so rounding them to a fixed decimal can split one α across a boundary) and differ
    # from every other α's
    kls = {}
    for alpha, numbers, _ in results:
        kls.setdefault(alpha, []).append(numbers["kl"])
    assert all(max(v) - min(v) <= 1e-6 for v in kls.values()), kls
    centres = sorted(v[0] for v in kls.values())
    assert len(centres) == len(alphas) and all(b - a > 1e-5 for a, b in zip(centres, centres[1:])), kls


@pytest.mark.integration
def test_embedded_model_through_the_app(gemma, tmp_path_factory):
    demo, backend, url = launch(gemma, tmp_path_factory)
    try:
        c = client(url)
        zero = c.predict("The capital of France is", RANDOM, 6, 0.0, True, 0, api_name="/next_token")[-1]
        assert zero["kl"] == pytest.approx(0.0, abs=1e-5) and same(zero["unsteered"], zero["steered"]) is None
        assert "Paris" in [t["token"].strip() for t in zero["unsteered"]]  # the real model, not a random one
        pushed = c.predict("The capital of France is", RANDOM, 6, 1.0, True, 0, api_name="/next_token")[-1]
        assert pushed["kl"] > 0.01
        out = c.predict("The capital of France is", RANDOM, 6, 0.0, True, 0, True, 0.8, 0, 1.0, 1.0, 6, 0,
                        api_name="/generate")[-1]
        assert out["unsteered"]["text"] == out["steered"]["text"] and len(out["steered"]["tokens"]) >= 1
    finally:
        demo.close()


def test_compare_runs_many_prompts_over_http_and_measures_pairs(app):
    """Issue #31 over the API: rows and summary with the documented names; pairs bring margins per α."""
    _, url = app
    c = client(url)
    out = c.predict("The weather today is\nMy favourite food is", False, RANDOM, 1, 0.5, True, 0, 1.0, 4,
                    api_name="/compare")
    assert [r["prompt"] for r in out["rows"]] == ["The weather today is", "My favourite food is"]
    assert {"prompt", "unsteered", "steered", "kl", "fluency", "concept_score"} <= set(out["rows"][0])
    c.predict("sentiment_pairs.csv", "auto", api_name="/bundled_dataset")
    paired = c.predict("", True, RANDOM, 1, 0.5, True, 0, 1.0, 2, api_name="/compare")
    summary = paired["summary"]
    assert {"alphas", "steerability_mean", "anti_steerable_share", "intended_share", "fluency_drop"} <= set(summary)
    assert all(len(r["margins"]) == len(summary["alphas"]) and "steerability" in r for r in paired["rows"])
    with pytest.raises(Exception, match="at most 64"):
        c.predict("\n".join(["a prompt"] * 65), False, RANDOM, 1, 0.5, True, 0, 1.0, 4, api_name="/compare")


def _page_call(url: str, api: str, data: list, session: str) -> list:
    """One event as the page sends it (gradio's page marks its calls ``x-gradio-user: app``): its output list."""
    import httpx

    from raw_http import joined_calls

    with httpx.Client(timeout=60, headers={"x-gradio-user": "app"}) as http:
        outcome = joined_calls(http, url, api, data, session, None, count=1)[0]
    assert outcome[0] == "ok", outcome
    return outcome[1]["data"]


def test_the_page_is_not_sent_the_bars_it_already_shows_but_an_api_client_always_is(app):
    """The slider's release repeats its last input's α: the page already has those bars (ui/drawn.py)."""
    _, url = app
    args = [PROMPT, RANDOM, 1, 0.25, True, 0, False]
    first = _page_call(url, "next_token", args, "drawn-page")
    assert first[1] and "plot" in first[1]  # the bars
    again = _page_call(url, "next_token_on_release", args, "drawn-page")
    assert all(o.get("__type__") == "update" and "value" not in str(o) for o in again), again  # nothing to redraw
    moved = _page_call(url, "next_token", args[:3] + [0.3] + args[4:], "drawn-page")
    assert moved[1] and "plot" in moved[1]
    back = _page_call(url, "next_token_on_release", args, "drawn-page")  # back to 0.25: drawn again
    assert back[1] and "plot" in back[1]
    other = _page_call(url, "next_token", args, "another-page")  # another page has drawn nothing yet
    assert other[1] and "plot" in other[1]
    c = client(url)
    assert next_token(c, 0.25)[-1] == next_token(c, 0.25)[-1] is not None  # an API client asks, it gets


def test_an_api_answer_carries_the_panel_key_as_data_and_the_page_its_element(app):
    """Issue #47: the stale note's HTML is the page's; an API client reads what the panel was made for."""
    import json

    _, url = app
    made_for = json.loads(next_token(client(url), 0.25)[0])
    assert made_for["panel"] == "bars" and made_for["made_for"]["alpha"] == 0.25
    assert made_for["made_for"]["prompt"] == PROMPT
    page = _page_call(url, "next_token", [PROMPT, RANDOM, 1, 0.25, True, 0, False], "element-page")
    assert page[0]["value"].startswith('<div class="made-for"') if isinstance(page[0], dict) else \
        page[0].startswith('<div class="made-for"')


def test_the_http_generation_timer_times_what_a_visitor_gets(app):
    """steer_ui.tools.http_generation (docs/bench.md's end-to-end figure) against the running app."""
    from steer_ui.tools.http_generation import measure

    _, url = app
    out = measure(url, tokens=5, repeats=2, layer=1)
    assert out["steps"] == 5 and len(out["seconds"]) == 2 and all(t > 0 for t in out["seconds"])
    assert out["median_ms_per_step"] == pytest.approx(out["median_s"] / 5 * 1000, rel=0.01)
    fresh = measure(url, tokens=5, repeats=2, layer=1, new_seed_each=True)  # each decodes its unsteered side
    assert fresh["new_seed_each"] and fresh["steps"] == 5 and len(fresh["seconds"]) == 2


def test_a_session_of_many_generations_keeps_only_the_pages_own_blocks(launched):
    """Gradio kept a new instance of each output a frame skipped, filed under an id of its own once a later frame
    sent a value: three more components with their values in the session per generation, for as long as it
    lived (~0.4 MB a 64-token generation; 300 of them grew the app by 120 MB).  request_guard drops them."""
    demo, _, url = launched
    c = client(url)
    for _ in range(6):
        generate(c, 0.5, tokens=64)
    session = demo.state_holder.session_data[c.session_hash]
    assert set(session.blocks_config.blocks) == set(demo.blocks)
    assert set(session.config_values) <= set(demo.blocks)


def test_a_forgotten_session_is_told_by_the_page_s_next_queued_event_not_lost_in_an_unqueued_one(app):
    """The first event after the server forgot an idle page's work said so once; when that event ran outside
    the queue, the line reached the page as a wordless red pill (no toast there) and was never said again
    (a review of the unqueued events).  Now the unqueued event runs on the new session and the next queued one
    says it."""
    import httpx

    from raw_http import joined_calls
    from steer_ui.vector import random_vector

    backend, url = app
    page = "forgotten-page-0001"
    s = backend.session(page)
    s.vectors["kept"] = random_vector(backend.handle.arch.hidden_size, 1, seed=3)  # work its visitor would lose
    s.touched -= backend.policy.session_idle_seconds + 1
    fn = {d.get("api_name"): d["id"] for d in httpx.get(url + "config", timeout=30).json()["dependencies"]}
    with httpx.Client(timeout=60, headers={"x-gradio-user": "app"}) as http:
        unqueued = http.post(url + "gradio_api/run/predict",
                             json={"data": [], "fn_index": fn["whoami"], "session_hash": page})
        assert unqueued.status_code == 200 and "error" not in unqueued.json(), unqueued.text
        told = joined_calls(http, url, "whoami", [], page, None, count=1)[0]
        assert told[0] == "error" and "idle for over" in told[1], told
        again = joined_calls(http, url, "whoami", [], page, None, count=1)[0]  # said once
        assert again[0] == "ok", again
