"""Two app processes on one PostgreSQL library (issue #30): a vector shared on one opens on the other with the same
numbers.  The server is Debian's ``postgresql`` package, started here in a temporary folder (``.ci/run``
installs it when it runs as root); elsewhere the test says why it skips."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from gradio_client import Client

from app_process import running
from same_results import same

PROMPT = "The capital of France is"
BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))


def _why_not() -> str | None:
    if not BIN:
        return "Debian's postgresql package is not installed (apt-get install postgresql; .ci/run does as root)"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "starting PostgreSQL here needs root (to run it as the postgres user)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (requirements-dev.txt)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    folder = Path(tempfile.mkdtemp(prefix="steer_ui-pg-"))
    shutil.chown(folder, "postgres", "postgres")
    data, port = folder / "data", _port()
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run(as_postgres + [f"{BIN[-1]}/initdb", "-D", str(data), "-A", "trust", "-U", "steer"], check=True,
                   capture_output=True)
    subprocess.run(as_postgres + [f"{BIN[-1]}/pg_ctl", "-D", str(data), "-l", str(folder / "pg.log"), "-w", "-o",
                                  f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True)
    try:
        subprocess.run(as_postgres + [f"{BIN[-1]}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "steer",
                                      "steer_ui"], check=True, capture_output=True)
        yield f"postgresql://steer@127.0.0.1:{port}/steer_ui"
    finally:
        subprocess.run(as_postgres + [f"{BIN[-1]}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_vector_shared_on_one_app_process_opens_on_another(postgres, tmp_path):
    args = ["--model", "tiny:llama", "--store", postgres]
    with running(args, tmp_path / "a.log") as first, running(args, tmp_path / "b.log") as second:
        token = Client(first.url, verbose=False).predict(api_name="/whoami")
        owner = Client(first.url, verbose=False, headers={"X-Steer-Owner": token})
        owner.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")
        name = owner.predict("mean-diff", 1, False, "{}", api_name="/train")["vector"]
        share_id = owner.predict(name, api_name="/share_vector")["id"]
        mine = owner.predict(PROMPT, name, 1, 0.5, True, 0, api_name="/next_token")[-1]

        stranger = Client(second.url, verbose=False)  # another process, another port: one library
        theirs = stranger.predict(PROMPT, share_id, 1, 0.5, True, 0, api_name="/next_token")[-1]
        assert same(theirs, mine) is None
        same_owner = Client(second.url, verbose=False, headers={"X-Steer-Owner": token})
        assert name in {row["name"] for row in same_owner.predict(api_name="/vectors")}
