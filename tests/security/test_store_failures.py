"""The library's store failing under a running app (issue #46, findings 3 and 4): read-only, missing or full.

Before, a read-only store stopped the start with a traceback (from writing the page's browser secret) and a full
disk answered every save with "Something went wrong on the server" and a traceback each in the log.  Now:

* a store the operator named (``--store PATH``) that cannot be opened or written stops the start with one line
  naming the path and the cause (exit 2);
* the default store that cannot be written leaves the app serving with keeping off: one log line, and the page
  and the API say the work is not kept;
* a store that fills up (or turns read-only) while serving refuses each save with one line in the visitor's
  language ("the library is full"), one log line, nothing acknowledged lost; reading and steering go on.

Through all of it the honest session's numbers stay exactly what they were.  The apps run ``tiny:llama`` (the
store is what is tested, not the model).  A read-only file is a read-only bind mount as root (root writes
through file modes), ``chmod`` otherwise; a full disk is a small tmpfs, which needs root: without it that test
skips and says why (tests/unit/test_library_failures.py covers the same refusals in-process everywhere).
"""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from gradio_client import Client

from app_process import ROOT, free_port, running
from hostile_kit import client, raw_call, refused
from same_results import same

PROMPT = "The capital of France is"
RANDOM = "random direction"
GENERATE = (PROMPT, RANDOM, 1, 0.5, True, 0, True, 0.8, 0, 1.0, 1.0, 4, 0)
TINY = ["--model", "tiny:llama"]


def _numbers(c: Client, vector: str = RANDOM) -> dict:
    return c.predict(PROMPT, vector, 1, 0.5, True, 0, api_name="/next_token")[-1]


def _owner(server) -> tuple[Client, str]:
    token = client(server).predict(api_name="/whoami")
    return Client(server.url, verbose=False, download_files=False, headers={"X-Steer-Owner": token}), token


def _empty_store(path: Path) -> Path:
    """A library with its tables and browser secret, as an earlier run leaves it."""
    from steer_ui.policy import Policy
    from steer_ui.store import open_for_serving

    open_for_serving(str(path), Policy()).db.close()
    return path


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextmanager
def read_only(path: Path):
    """``path`` (a file) cannot be written by the app, whoever runs it."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    if not _mount("--bind", str(path), str(path)):
        pytest.skip("as root a read-only file is a read-only bind mount, and mount is not allowed here")
    try:
        if not _mount("-o", "remount,bind,ro", str(path)):
            pytest.skip("as root a read-only file is a read-only bind mount, and remount is not allowed here")
        yield
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@contextmanager
def small_disk(folder: Path, size: str = "8m"):
    """A file system of its own, ``size`` big, that a test can fill."""
    why = "a full disk is a small tmpfs, and mounting one needs root"
    if os.geteuid() != 0:
        pytest.skip(why)
    folder.mkdir()
    if not _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)):
        pytest.skip(why + " (mount was refused here)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> None:
    """Every free byte of ``folder``'s file system taken by one file."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for block in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as exc:
                assert exc.errno == 28, exc  # ENOSPC
    finally:
        os.close(fd)


def start_refused(args: list[str], tmp_path: Path) -> str:
    """``python app.py *args``, which must stop before serving: its output (exit status 2)."""
    done = subprocess.run([sys.executable, str(ROOT / "app.py"), "--port", str(free_port()), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return out


def log_of(server) -> str:
    return Path(server.log).read_text(errors="replace")


def test_a_named_store_that_is_read_only_or_missing_stops_the_start_in_one_line(tmp_path):
    store = _empty_store(tmp_path / "kept" / "library.db")
    with read_only(store):
        out = start_refused([*TINY, "--store", str(store)], tmp_path)
    assert f"error: --store {store}: cannot be written (read-only: " in out, out
    (tmp_path / "a-file").write_text("not a folder")
    missing = tmp_path / "a-file" / "library.db"
    out = start_refused([*TINY, "--store", str(missing)], tmp_path)
    assert f"error: --store {missing}: cannot be opened (a file stands where its folder should be)" in out, out
    for line in out.splitlines():  # the line, and nothing after it: no page was served
        assert "running on" not in line


def test_a_read_only_default_store_serves_with_keeping_off_and_says_so(tmp_path, monkeypatch):
    from steer_ui.paths import cache_root

    cache = tmp_path / "cache"
    store = _empty_store(cache / "library.db")
    for entry in cache_root().glob("*"):  # the usual caches (norms, default view), so the start takes seconds
        if not entry.name.startswith("library.db"):
            (cache / entry.name).symlink_to(entry)
    monkeypatch.setenv("STEER_UI_CACHE", str(cache))
    log = tmp_path / "app.log"
    with read_only(store), running([*TINY, "--store", ""], log) as server:  # "": no --store given, the default
        honest = client(server)
        before = _numbers(honest)
        visitor = client(server)
        assert visitor.predict(api_name="/whoami") == ""  # nobody is made an owner
        visitor.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")
        trained = visitor.predict("mean-diff", 1, False, "{}", api_name="/train")
        assert trained["kept"] is False and "not kept" in trained["note"]  # the API says so where it reads
        numbers = _numbers(visitor, trained["vector"])  # the session's own vector works, in memory
        visitor.predict(*GENERATE, api_name="/generate")
        refused(lambda: visitor.predict(api_name="/save_result"), "keeps nothing")
        outcome = raw_call(server, "page_model", [])  # what the page shows at the top
        assert outcome[0] == "ok" and "not kept" in str(outcome[1]["data"][0]), outcome
        assert same(_numbers(visitor, trained["vector"]), numbers) is None
        assert same(_numbers(honest), before) is None
    text = log.read_text(errors="replace")
    notes = [line for line in text.splitlines() if "serving with keeping off" in line]
    assert len(notes) == 1 and str(store) in notes[0] and "read-only" in notes[0], text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_a_full_store_refuses_each_save_in_one_line_and_loses_nothing(tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        log = tmp_path / "app.log"
        with running([*TINY, "--store", str(disk / "library.db")], log) as server:
            honest = client(server)
            before = _numbers(honest)
            owner, token = _owner(server)
            owner.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")
            trained = owner.predict("mean-diff", 1, False, "{}", api_name="/train")
            assert trained["kept"] is True
            vector, numbers = trained["vector"], _numbers(owner, trained["vector"])
            *_, generated = owner.predict(*GENERATE, api_name="/generate")
            saved = owner.predict(api_name="/save_result")  # acknowledged: it must survive all that follows

            fill(disk)
            for call in (lambda: owner.predict(api_name="/save_result"),
                         lambda: owner.predict("mean-diff", 2, False, "{}", api_name="/train"),
                         lambda: owner.predict(vector, api_name="/share_vector"),
                         lambda: owner.predict("sentiment_pairs.csv", "auto", api_name="/bundled_dataset")):
                refused(call, "library is full", "could not be kept", "what you kept before is safe")
            assert client(server).predict(api_name="/whoami") == ""  # a newcomer works unkept, never an error
            rows = {r["name"]: r["kind"] for r in owner.predict(api_name="/vectors")}
            assert rows[vector] == "own" and "mean-diff L2" not in " ".join(rows)  # the refused one left nothing
            stranger = client(server)
            assert stranger.predict(saved["id"], api_name="/result")["generation"]["steered"]["text"] == \
                generated["steered"]["text"]
            assert same(_numbers(owner, vector), numbers) is None
            assert same(_numbers(honest), before) is None

            text = log.read_text(errors="replace")
            assert "Traceback" not in text and "Something went wrong" not in text, text[-3000:]
            lines = [line for line in text.splitlines() if "the library at" in line]
            # one line for all those refusals (at most once a minute per cause), naming the store and the cause
            assert 1 <= len(lines) <= 2 and "cannot be written (full" in lines[0], lines

            os.remove(disk / "filler")  # room again: saves work again, and a SIGKILL loses nothing acknowledged
            again = owner.predict(api_name="/save_result")
            server.restart(kill=True)
            owner = Client(server.url, verbose=False, download_files=False, headers={"X-Steer-Owner": token})
            assert {r["name"] for r in owner.predict(api_name="/vectors")} >= {vector}
            assert same(_numbers(owner, vector), numbers) is None
            for result_id in (saved["id"], again["id"]):
                assert client(server).predict(result_id, api_name="/result")["id"] == result_id
            assert same(_numbers(client(server)), before) is None

        fill(disk)  # a named store on a full disk: the start stops in one line
        out = start_refused([*TINY, "--store", str(disk / "library.db")], tmp_path)
        assert f"error: --store {disk / 'library.db'}: cannot be written (full: " in out, out
