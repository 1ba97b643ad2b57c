"""``python app.py`` in its own process, as a stranger meets it: over HTTP, with its peak memory sampled.

Shared by the suites that drive the running app (security, many users, browser).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if "--store" not in args:  # a library of its own beside the log: nothing from other runs, nothing left behind
            args = [*args, "--store", str(Path(log).with_name("library.db"))]
        self.args, self.env = list(args), env
        self._start()
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _start(self) -> None:
        import psutil

        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(self.port), *self.args],
                                     cwd=ROOT, stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=self.env)
        self.ps = psutil.Process(self.proc.pid)

    def restart(self, kill: bool = False) -> None:
        """Stop the app (SIGKILL with ``kill``: no chance to finish anything) and start it again, same port, same
        library; returns when it answers."""
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(timeout=30)
        self._start()
        self.wait_ready()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, self.ps.memory_info().rss)
            except Exception:  # noqa: BLE001 - between a stop and a restart there is no process to measure
                pass
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 900.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited early:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "gradio_api/info", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"app did not come up in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def alive(self) -> bool:
        import httpx

        return self.proc.poll() is None and httpx.get(self.url + "gradio_api/info", timeout=10).status_code == 200

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextmanager
def running(args: list[str], log: Path) -> Iterator[Server]:
    """``python app.py *args`` answering on its port for the ``with`` block, then stopped."""
    srv = Server(args, log)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@contextmanager
def served(backend):
    """``backend``'s app on a free local port while the block runs; yields its URL."""
    from steer_ui.ui.app import build_demo, launch_kwargs

    demo = build_demo(backend)
    demo.queue()
    port = free_port()
    demo.launch(**launch_kwargs(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True))
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()
