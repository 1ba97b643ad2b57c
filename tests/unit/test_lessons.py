"""The Concepts lessons behind the service's door (issue #34): bounded inputs, and each one a job that the time
limit and Cancel end, one at a time on the model."""
from __future__ import annotations

import re
import threading
import time

import pytest

from steer_ui.messages import UserError
from steer_ui.policy import Policy
from steer_ui.service import Service


def test_a_lesson_past_the_job_time_limit_stops_and_keeps_nothing(tiny):
    service = Service(tiny("llama"), policy=Policy(job_seconds=0.5))
    service.lessons.explode("visitor", "The capital of France is", layer=None, alpha=0.5, token=None)
    with pytest.raises(UserError) as info:
        service.lessons.fix("visitor", bound=0.01, steps=1000)
    assert info.value.key == "job_too_long"
    assert service.session("visitor").cache["concepts_explosion"].fixed is None  # the demo is as it was
    assert not service.session("visitor").running


def test_cancel_reaches_a_running_lesson(tiny):
    service = Service(tiny("llama"))
    outcome: dict = {}

    def run():
        try:
            service.lessons.time_cache("visitor", 128)
            outcome["done"] = True
        except UserError as exc:
            outcome["error"] = exc.key

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while not service.session("visitor").running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.cancel("visitor")
    worker.join(timeout=30)
    assert outcome in ({"error": "job_cancelled"}, {"done": True})


@pytest.mark.parametrize("call, key", [
    (lambda s: s.lessons.lm_head("v", 10**9), "number_too_large"),
    (lambda s: s.lessons.lm_head("v", 2.5), "number_not_whole"),
    (lambda s: s.lessons.sample("v", "hi", 1.0, 0, 0.9, 1.0, 10**6, 0), "number_too_large"),
    (lambda s: s.lessons.sampling("v", "hi", "nan", 0, 0.9, 1.0), "number_not_finite"),
    (lambda s: s.lessons.sampling("v", "x" * 5000), "prompt_too_long"),
    (lambda s: s.lessons.explode("v", "hi", None, 1e300, None), "number_too_large"),
    (lambda s: s.lessons.explode("v", "hi", None, -1.0, None), "number_not_positive"),
    (lambda s: s.lessons.explode("v", "hi", 2.5, 0.1, None), "number_not_whole"),
    (lambda s: s.lessons.fix("v", 2.0, 50), "concepts_no_demo"),
    (lambda s: s.lessons.kv("v", 10**300, 1, "bfloat16"), "number_too_large"),
    (lambda s: s.lessons.kv("v", 16, 1, "float128"), "not_a_choice"),
    (lambda s: s.lessons.time_cache("v", 100_000), "number_too_large"),
])
def test_lesson_inputs_are_bounded_before_any_work(tiny, call, key):
    service = Service(tiny("llama"))
    with pytest.raises(UserError) as info:
        call(service)
    assert info.value.key == key
    assert "\n" not in str(info.value)


def test_lessons_run_on_good_inputs(tiny):
    service = Service(tiny("llama"))
    facts, norms = service.lessons.lm_head("v", 20)
    assert len(norms.histogram) == 20 and facts["vocab_size"] == tiny("llama").arch.vocab_size
    assert service.lessons.sample("v", "hi", 1.0, 0, 0.9, 1.0, 50, 3).attrs["n"] == 50
    assert service.lessons.kv("v", 64, 2, "float32")["seq_len"] == 64


def test_a_word_that_is_not_one_token_is_refused_in_the_visitor_s_language(tiny):
    """The explosion lesson's word is typed on the page: its refusal names its message, so a Chinese page says it
    in Chinese (it was English inside the Chinese "cannot compute this panel" line: a browser review)."""
    from steer_ui.ui import i18n

    service = Service(tiny("llama"))
    with pytest.raises(UserError) as info:  # the tiny model's bytes: six tokens
        service.lessons.explode("v", "hi", None, 0.5, " zebra")
    assert info.value.key == "concepts_token_pieces", str(info.value)
    said = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert "6" in said and "{" not in said and set(re.findall(r"[A-Za-z]{3,}", said)) == {"zebra"}, said
