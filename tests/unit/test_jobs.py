"""Long jobs end on request: Cancel stops a running TSV training within 2 s, a job past the time limit stops,
and in both cases the session keeps exactly the vectors it had."""
from __future__ import annotations

import threading
import time

import pytest

from steer_ui.policy import Policy
from steer_ui.service import Service, UserError


def _service(tiny, **policy) -> Service:
    service = Service(tiny("llama"), policy=Policy(**policy))
    service.upload_dataset("session-a", None, bundled="capitals_statements.csv")
    service.train("session-a", "mean-diff", layer=1)
    return service


def _long_training(service: Service) -> tuple[threading.Thread, dict]:
    """A 200-epoch TSV training of session-a in a thread, once it runs; the dict gets "finished" or "error" (the
    UserError) and "at" (when it ended)."""
    outcome: dict = {}

    def run():
        try:
            service.train("session-a", "tsv", layer=1, settings={"epochs": 200, "compare": False})
            outcome["finished"] = True
        except UserError as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while not service.session("session-a").running and time.monotonic() < deadline:
        time.sleep(0.05)
    return worker, outcome


def test_cancel_stops_a_tsv_training_within_two_seconds_and_keeps_the_session(tiny):
    service = _service(tiny)
    before = service.vector_names("session-a")
    worker, outcome = _long_training(service)
    time.sleep(1.0)  # let it train for a while
    assert service.cancel("session-a")
    asked = time.monotonic()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert "finished" not in outcome and outcome["error"].key == "job_cancelled"
    assert outcome["at"] - asked < 2.0
    assert service.job_outcome("session-a") == "cancelled"  # what Cancel answers the page with
    assert service.vector_names("session-a") == before
    assert not service.cancel("session-a")  # nothing is running any more
    name, _ = service.train("session-a", "mean-diff", layer=2)  # and the session works as before
    assert name in service.vector_names("session-a")
    assert service.job_outcome("session-a") == "finished"


def test_job_outcome_waits_for_a_running_job_and_says_how_it_ended(tiny):
    service = _service(tiny)
    assert service.job_outcome("session-a") == "finished" and service.job_outcome("nobody") == ""
    worker, outcome = _long_training(service)
    assert service.job_outcome("session-a", wait=0.1) == "running"
    assert service.cancel("session-a")
    assert service.job_outcome("session-a", wait=5.0) == "cancelled"  # within a step of the flag
    worker.join(timeout=30)
    assert not worker.is_alive() and "finished" not in outcome and outcome["error"].key == "job_cancelled"


def test_a_job_past_the_time_limit_stops_and_keeps_the_session(tiny):
    service = _service(tiny, job_seconds=0.5)
    before = service.vector_names("session-a")
    with pytest.raises(UserError) as info:
        service.train("session-a", "tsv", layer=1, settings={"epochs": 200, "compare": False})
    assert info.value.key == "job_too_long" and "0 s" not in str(info.value)
    assert service.vector_names("session-a") == before
    assert service.job_outcome("session-a") == "failed"


def test_a_flood_of_new_sessions_is_refused_and_never_takes_data_or_a_running_job(tiny):
    """Cheap calls with fresh ids must not push out a visitor's data, least of all one whose job is running."""
    service = Service(tiny("llama"), policy=Policy(max_sessions=3))
    service.upload_dataset("owner-with-data", None, bundled="capitals_statements.csv")
    busy = service.session("owner-running-a-job")
    busy.running = True
    refused = 0
    for k in range(50):
        try:
            service.set_language(f"flood-session-{k:04d}", "en")
        except UserError as exc:
            assert exc.key == "sessions_full"
            refused += 1
    assert refused == 49  # the one free place went to the first; the rest were told the server is busy
    assert service.dataset_summary("owner-with-data")["rows"] > 100
    assert service.session("owner-running-a-job") is busy
    busy.running = False


def test_detection_is_bounded_before_any_model_work(tiny):
    service = _service(tiny)
    name, _ = service.train("session-a", "tsv", layer=1, settings={"epochs": 1, "compare": False})
    too_many = [("q", f"a{i}") for i in range(service.policy.max_detect_answers + 1)]
    with pytest.raises(UserError) as info:
        service.detect("session-a", name, answers=too_many)
    assert info.value.key == "too_many_answers"
    with pytest.raises(UserError) as info:
        service.detect("session-a", name, answers=[("q", "x" * 10_000)])
    assert info.value.key == "text_too_long" and "answer" in str(info.value).lower()


def test_all_sessions_together_stay_within_the_server_budget(tiny):
    """Each visitor's cap alone would let 256 sessions hold 64 GB: the sum is capped too."""
    service = Service(tiny("llama"), policy=Policy(max_total_session_bytes=120_000))  # ~46 kB + ~99 kB
    service.upload_dataset("first-visitor", None, bundled="capitals_statements.csv")
    with pytest.raises(UserError) as info:
        service.upload_dataset("second-visitor", None, bundled="capitals_pairs.csv")
    assert info.value.key == "server_full"
    assert service.dataset_summary("first-visitor")["rows"] > 100
