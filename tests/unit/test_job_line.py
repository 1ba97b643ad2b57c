"""The server's line of long jobs (issue #52): first come, first served, what each session may see of it, Cancel on
a waiting job, and the one line the page writes from it."""
from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from steer_ui.jobs import JobLine, Ticket, job
from steer_ui.messages import UserError
from steer_ui.sessions import Session


class Handle:
    def __init__(self):
        self.lock = threading.RLock()


def _hold(line, handle, session, kind, release, started, errors):
    try:
        with job(session, handle, 60, line=line, kind=kind) as report:
            started.set()
            while not release.wait(0.02):
                report(0.25, "working")
    except UserError as exc:
        errors.append(exc.key)


def test_waiting_jobs_see_their_place_and_the_kind_of_the_job_ahead_and_start_in_order():
    line, handle = JobLine(), Handle()
    first, second, third = Session(), Session(), Session()
    release = [threading.Event() for _ in range(3)]
    started = [threading.Event() for _ in range(3)]
    errors: list = []
    threads = []
    for i, (s, kind) in enumerate(((first, "concepts_explode"), (second, "train"), (third, "probe"))):
        t = threading.Thread(target=_hold, args=(line, handle, s, kind, release[i], started[i], errors))
        t.start()
        threads.append(t)
        if s is first:
            assert started[0].wait(5)
        else:
            deadline = time.monotonic() + 5
            while line.view(s) is None and time.monotonic() < deadline:
                time.sleep(0.01)
    time.sleep(0.1)  # the running job has reported
    assert line.view(first)["state"] == "running" and line.view(first)["fraction"] == 0.25
    assert line.view(second) | {"seconds": 0} == {
        "state": "waiting", "kind": "train", "detail": "", "fraction": 0.0, "message": line.view(second)["message"],
        "seconds": 0, "cancelling": False, "place": 1, "waits_for": {"kind": "concepts_explode", "detail": ""}}
    assert line.view(third)["place"] == 2 and line.view(Session()) is None
    release[0].set()
    assert started[1].wait(5) and not started[2].is_set()  # first come, first served
    assert line.view(third)["place"] == 1 and line.view(third)["waits_for"]["kind"] == "train"
    release[1].set()
    release[2].set()
    for t in threads:
        t.join(5)
    assert errors == [] and line.view(third) is None


def test_cancel_on_a_waiting_job_takes_it_out_of_the_line_and_it_never_runs():
    line, handle = JobLine(), Handle()
    holder, waiter = Session(), Session()
    release, started, errors = threading.Event(), threading.Event(), []
    t = threading.Thread(target=_hold, args=(line, handle, holder, "train", release, started, errors))
    t.start()
    assert started.wait(5)
    outcome: dict = {}

    def wait_in_line():
        try:
            with job(waiter, handle, 60, line=line, kind="probe"):
                outcome["ran"] = True
        except UserError as exc:
            outcome["error"] = exc.key

    w = threading.Thread(target=wait_in_line)
    w.start()
    deadline = time.monotonic() + 5
    while line.view(waiter) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert line.view(waiter)["state"] == "waiting"
    waiter.cancel.set()
    w.join(2)  # within a poll of the line, while the job ahead still runs
    assert outcome == {"error": "job_dequeued"} and not waiter.running and waiter.job_end == "cancelled"
    assert line.view(waiter) is None
    release.set()
    t.join(5)


def test_a_job_that_needs_no_model_lock_still_waits_its_turn():
    line, handle = JobLine(), Handle()
    ahead, behind = Ticket(owner=Session(), kind="train"), Ticket(owner=Session(), kind="compare")
    line.join(ahead)
    line.join(behind)
    assert not line.try_start(behind)  # not first in line
    assert line.try_start(ahead, handle.lock)
    assert not line.try_start(behind)  # one job at a time, lock or not
    line.leave(ahead)
    handle.lock.release()
    assert line.try_start(behind)


@pytest.mark.parametrize("n, text", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                     (13, "13th"), (21, "21st"), (102, "102nd"), (111, "111th")])
def test_places_in_line_read_as_english_ordinals(n, text):
    from steer_ui.ui.job_line import ordinal

    assert ordinal("en", n) == text and ordinal("zh-CN", n) == str(n)


def test_the_status_line_says_what_a_job_waits_for_its_progress_and_stopping():
    from steer_ui.ui.job_line import status_line

    waiting = {"state": "waiting", "place": 1, "waits_for": {"kind": "concepts_explode", "detail": ""},
               "cancelling": False}
    assert status_line("en", waiting) == \
        "Waiting for another job (Concepts: Explode, then fix) to finish — 1st in line"
    assert "第 2 位" in status_line("zh-CN", waiting | {"place": 2})
    assert status_line("en", waiting | {"waits_for": None}).startswith("Waiting for the model")
    running = {"state": "running", "kind": "train", "detail": "tsv", "fraction": 0.3, "seconds": 12.4,
               "message": "TSV init: epoch 2/40", "cancelling": False}
    assert status_line("en", running) == "▰▰▰▱▱▱▱▱▱▱ 30% · Train \\(tsv\\) · 12 s · TSV init: epoch 2/40"
    assert status_line("en", running | {"cancelling": True}).startswith("Stopping")
    assert status_line("en", None) == "Starting…"


def test_a_comparison_reports_its_rows_as_they_finish_and_stops_when_the_report_raises():
    from steer_ui import steerability

    class Ticket_:
        def __init__(self, delay):
            self.delay, self.cancelled = delay, False

        def __iter__(self):
            time.sleep(self.delay)
            yield type("E", (), {"result": object()})()

        def cancel(self):
            self.cancelled = True

    class Engine:
        def submit(self, request, timeout_seconds=None):
            return Ticket_(request)

    seen: list = []
    original = steerability.Generated.of
    steerability.Generated.of = classmethod(lambda cls, prompt, last: prompt)
    try:
        out = steerability.generate_all(Engine(), [0.0, 0.0, 1.2], 3, ["a", "b", "c"],  # a stand-in engine
                                        progress=lambda done, total: seen.append((done, total)))
        assert out == ["a", "b", "c"]
        assert (2, 3) in seen and seen[-1] == (3, 3)  # two rows reported before the last one ended

        def stop(done, total):
            raise UserError("job_cancelled")

        started = time.monotonic()
        with pytest.raises(UserError):
            steerability.generate_all(Engine(), [1.0, 1.0], 2, ["a", "b"], progress=stop)
        assert time.monotonic() - started < 2.5  # at the first report, not after every row
    finally:
        steerability.Generated.of = original


def test_a_keyed_progress_line_reads_in_the_page_s_language_and_as_before_in_english():
    from steer_ui.messages import Said
    from steer_ui.ui.job_line import status_line

    line, handle, s = JobLine(), Handle(), Session()
    with job(s, handle, 60, line=line, kind="train", detail="tsv") as report:
        report(0.3, Said("progress_tsv_epoch_constrained", epoch=2, epochs=40, loss="0.123"))
        view = line.view(s)
    assert view["message"] == "TSV constrained: epoch 2/40, loss 0.123"  # what the CLI and an API client read
    assert status_line("en", view | {"seconds": 12}).endswith("· 12 s · TSV constrained: epoch 2/40, loss 0.123")
    chinese = status_line("zh-CN", view | {"seconds": 12})
    assert "第 2/40 轮" in chinese and "epoch" not in chinese and "constrained" not in chinese


def _reports_english(node) -> bool:
    """Whether ``node`` is a call progress(fraction, words) or report(fraction, words) with words written in place
    (a non-empty string literal or an f-string)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("progress", "report")
            and len(node.args) == 2):
        return False
    words = node.args[1]
    return isinstance(words, ast.JoinedStr) or (isinstance(words, ast.Constant) and bool(words.value))


def test_the_progress_check_sees_english_words():
    assert _reports_english(ast.parse('progress(0.5, f"epoch {n}")').body[0].value)
    assert _reports_english(ast.parse('report(1.0, "done")').body[0].value)
    assert not _reports_english(ast.parse('report(1.0, Said("progress_done"))').body[0].value)
    assert not _reports_english(ast.parse('progress(0.5, "")').body[0].value)


def test_the_core_reports_job_progress_by_key_not_in_english_words():
    """Every progress(fraction, words) call in the core (rooms, jobs, methods, data, a model's load) says its words
    by key (messages.Said), so the page can say them in Chinese; a string literal or f-string there is English
    only."""
    root = Path(__file__).resolve().parents[2]
    english = []
    for path in sorted((root / "steer_ui").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("steer_ui/ui/", "steer_ui/tools/")):  # the page's own words; the tools' reports
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if _reports_english(node):
                english.append(f"{rel}:{node.lineno}")
    assert english == []
