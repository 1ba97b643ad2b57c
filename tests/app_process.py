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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: list[str], log: Path):
        import psutil

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(self.port), *args],
                                     cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        self.ps = psutil.Process(self.proc.pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, self.ps.memory_info().rss)
            except Exception:
                return
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
