"""Threads that stop computing hand their OpenMP helpers back (steer_ui/model/cpu_threads.py).

Observed through the process's threads that Python does not know (the OpenMP runtime's helpers): libgomp gives
a thread that enters a parallel loop a helper (with 2 threads, a team of two), and a released team's helper
exits.  Counting only those keeps threads that the code under test starts (an engine) out of the count.
"""
import os
import threading
import time

import pytest
import torch

from steer_ui.model import cpu_threads
from steer_ui.model.engine import Engine
from steer_ui.model.generation import Request, Sampling
from steer_ui.model.loading import load_model
from steer_ui.service import RANDOM, Service

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc"),
    pytest.mark.skipif(torch.get_num_threads() < 2, reason="one torch thread makes no OpenMP team"),
]


def _threads() -> int:
    """Threads of this process that are not Python threads."""
    python = {t.native_id for t in threading.enumerate()}
    return len({int(task) for task in os.listdir("/proc/self/task")} - python)


def _settles_at(expected: int, seconds: float = 3.0) -> int:
    """The thread count once it reaches ``expected`` (helpers exit a moment after release), or where it stays."""
    deadline = time.monotonic() + seconds
    while _threads() != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return _threads()


def _parallel_work() -> None:
    torch.randn(4_000_000).exp_()  # far past torch's grain size: a parallel loop, so this thread gets a team


def _in_thread(fn, wait: float = 3.0) -> dict:
    """Run ``fn`` in a new thread that computed first; the counts with its team, and after ``fn`` (given up to
    ``wait`` seconds to drop by the one helper)."""
    seen = {}

    def body():
        _parallel_work()
        seen["with_team"] = _threads()
        fn()
        seen["after"] = _settles_at(seen["with_team"] - 1, wait)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(60)
    return seen


def test_a_released_thread_keeps_no_helper_and_an_unreleased_one_does():
    if not cpu_threads.release_helpers():
        pytest.skip("this OpenMP runtime has no omp_pause_resource_all")
    kept = _in_thread(lambda: None, wait=0.5)
    assert kept["after"] == kept["with_team"]  # the helper stays while its thread lives: what throttles libgomp
    released = _in_thread(cpu_threads.release_helpers)
    assert released["after"] == released["with_team"] - 1
    again = _in_thread(lambda: (cpu_threads.release_helpers(), _parallel_work()), wait=0.5)
    assert again["after"] == again["with_team"]  # the next parallel loop makes a team again
    prepared = _in_thread(lambda: (cpu_threads.release_helpers(), time.sleep(0.3), cpu_threads.prepare_helpers()),
                          wait=0.5)
    assert prepared["after"] == prepared["with_team"]  # prepare_helpers made the team again, before any work


def test_the_service_door_hands_back_after_plain_calls_and_each_generator_step(tiny, tmp_path):
    if not cpu_threads.release_helpers():
        pytest.skip("this OpenMP runtime has no omp_pause_resource_all")
    service = Service(handle=tiny("llama"), workdir=tmp_path)
    service.next_token("s", "Hello there", RANDOM, 1, 2.0)  # the tokenizer's own thread pool starts once, here
    view = _in_thread(lambda: service.next_token("s", "Hello there", RANDOM, 1, 2.0))
    assert view["after"] == view["with_team"] - 1

    steps = []

    def stream():
        for event in service.stream_generate("s", "Hello there", RANDOM, 1, 2.0,
                                            sampling=service.sampling(max_new_tokens=3)):
            _parallel_work()  # the consumer's own work between steps: released at the next step's end
            steps.append(event)
    streamed = _in_thread(stream)
    assert steps and streamed["after"] == streamed["with_team"] - 1
    assert Service.method_names() == Service.method_names.__wrapped__()  # static methods are wrapped too


def test_the_decorator_wraps_public_methods_only():
    if not cpu_threads.release_helpers():
        pytest.skip("this OpenMP runtime has no omp_pause_resource_all")

    @cpu_threads.hand_back_after_calls
    class Door:
        def enter(self):
            self._inside()

        def _inside(self):
            _parallel_work()

        @staticmethod
        def static():
            _parallel_work()

        def steps(self):
            _parallel_work()
            yield 1
            _parallel_work()
            yield 2

    door = Door()
    for call in (door.enter, Door.static, lambda: list(door.steps())):
        seen = _in_thread(call)
        assert seen["after"] == seen["with_team"] - 1
    private = _in_thread(door._inside, wait=0.5)  # not a door: its thread keeps the helper
    assert private["after"] == private["with_team"]
    # the outermost call hands back, not a nested one (the caller may still be computing)
    inside = []

    def nested():
        with cpu_threads.computing():
            with cpu_threads.computing():
                _parallel_work()
            time.sleep(0.3)
            inside.append(_threads())
    seen = _in_thread(nested)
    assert inside == [seen["with_team"]] and seen["after"] == seen["with_team"] - 1


def test_the_engine_and_its_client_keep_no_idle_helpers():
    """The client hands its team back when it submits; the engine its own when it goes idle (int8 weights:
    the kernel runs every product as a parallel loop, so the engine thread has a team while it decodes)."""
    if not cpu_threads.release_helpers():
        pytest.skip("this OpenMP runtime has no omp_pause_resource_all")
    handle = load_model("tiny:llama", device="cpu", weights="int8")
    engine = Engine(handle, gather_seconds=0.0)
    handle.tokenizer(["Hello there", "Hi"])  # the tokenizer's own thread pool starts once, here
    try:
        seen = {}

        def client():
            _parallel_work()
            seen["with_team"] = _threads()
            for _ in engine.submit(Request.make(handle, "Hello there", [], Sampling(max_new_tokens=4))):
                pass
            # the client's helper is gone, and the engine thread, idle now, has none either
            seen["after"] = _settles_at(seen["with_team"] - 1)

        thread = threading.Thread(target=client)
        thread.start()
        thread.join(60)
        assert engine.stats.steps >= 3
        assert seen["after"] == seen["with_team"] - 1

        def move():  # a slider move takes its turn, then the decode computes: the move's helper goes
            with engine.interactive():
                _parallel_work()
        moved = _in_thread(move)
        assert moved["after"] == moved["with_team"] - 1
    finally:
        engine.close(wait=10)
