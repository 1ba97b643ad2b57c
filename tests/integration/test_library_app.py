"""The library over HTTP (issue #30), against ``python app.py`` in its own process: work survives a restart and
a SIGKILL in the middle of saves, a shared vector opens for a stranger with the owner's numbers, a saved result
reads back without the model, and an API client is the same owner through ``X-Steer-Owner``."""
from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from gradio_client import Client

from app_process import running
from same_results import same

PROMPT = "The capital of France is"
GENERATE = (PROMPT, "random direction", 1, 0.5, True, 0, True, 0.8, 0, 1.0, 1.0, 6, 0)


@pytest.fixture()
def app(tmp_path):
    with running(["--model", "tiny:llama", "--store", str(tmp_path / "library.db")], tmp_path / "app.log") as srv:
        yield srv


def client(server, token: str | None = None) -> Client:
    headers = {"X-Steer-Owner": token} if token else None
    return Client(server.url, verbose=False, download_files=False, headers=headers)


def _train(c: Client) -> str:
    c.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")
    out = c.predict("mean-diff", 1, False, "{}", api_name="/train")
    assert out["kept"] is True and "note" not in out
    return out["vector"]


def test_a_restart_keeps_vectors_datasets_shares_results_and_comparisons(app):
    owner = client(app)
    token = owner.predict(api_name="/whoami")
    assert len(token) == 32
    owner = client(app, token)  # from now on the owner names itself on every call
    name = _train(owner)
    numbers = owner.predict(PROMPT, name, 1, 0.5, True, 0, api_name="/next_token")[-1]
    shared = owner.predict(name, api_name="/share_vector")
    *_, generated = owner.predict(*GENERATE, api_name="/generate")
    saved = owner.predict(api_name="/save_result")
    with pytest.raises(Exception, match="Nothing has been compared"):
        owner.predict(api_name="/save_comparison")
    compared = owner.predict("The capital of France is\nParis is a city in", False, name, 1, 0.5, True, 0, 1.0, 4,
                             api_name="/compare")
    comparison = owner.predict(api_name="/save_comparison")
    assert comparison["url"].endswith("?result=" + comparison["id"])

    app.restart()  # a new process: nothing in memory survives (one restart for all of it: each costs CI seconds)

    again = client(app, token)
    kinds = {row["name"]: row["kind"] for row in again.predict(api_name="/vectors")}
    assert kinds[name] == "own"
    assert same(again.predict(PROMPT, name, 1, 0.5, True, 0, api_name="/next_token")[-1], numbers) is None
    assert again.predict("probe", 1, False, "{}", api_name="/train")["vector"]  # the dataset is still loaded
    stranger = client(app)
    assert stranger.predict(api_name="/whoami") != token
    result = stranger.predict(saved["id"], api_name="/result")  # read without running the model
    assert result["generation"]["steered"]["text"] == generated["steered"]["text"]
    page = stranger.predict(api_name="/vectors")
    assert name not in {row["name"] for row in page}  # nobody else's until they open the link
    load = stranger.predict(api_name="/load")
    assert load["running"] == 0
    assert shared["url"].endswith("?vector=" + shared["id"])
    # the saved comparison reads back whole for a stranger, with the vector it ran with
    result = stranger.predict(comparison["id"], api_name="/result")
    assert result["kind"] == "comparison" and result["has_vector"] is True
    assert result["comparison"] == json.loads(json.dumps(compared))
    assert result["settings"]["vector"] == name and result["settings"]["prompts"] == [
        "The capital of France is", "Paris is a city in"]


def test_a_shared_vector_steers_a_stranger_exactly_as_its_owner(app):
    owner = client(app)
    owner = client(app, owner.predict(api_name="/whoami"))
    name = _train(owner)
    share_id = owner.predict(name, api_name="/share_vector")["id"]
    mine = owner.predict(PROMPT, name, 1, 0.5, True, 0, api_name="/next_token")[-1]
    stranger = client(app)
    theirs = stranger.predict(PROMPT, share_id, 1, 0.5, True, 0, api_name="/next_token")[-1]  # the id as a name
    assert same(theirs, mine) is None
    *_, a = owner.predict(PROMPT, name, 1, 0.5, True, 0, True, 0.8, 0, 1.0, 1.0, 6, 0, api_name="/generate")
    *_, b = stranger.predict(PROMPT, share_id, 1, 0.5, True, 0, True, 0.8, 0, 1.0, 1.0, 6, 0, api_name="/generate")
    assert a["steered"]["text"] == b["steered"]["text"]
    assert owner.predict(name, api_name="/unshare_vector") is True
    late = client(app)
    with pytest.raises(Exception) as info:
        late.predict(PROMPT, share_id, 1, 0.5, True, 0, api_name="/next_token")
    assert "no shared vector or saved result" in str(info.value)


def test_sigkill_in_the_middle_of_saves_loses_no_acknowledged_item(app, tmp_path):
    owner = client(app)
    token = owner.predict(api_name="/whoami")
    owner = client(app, token)
    owner.predict(*GENERATE, api_name="/generate")
    acknowledged: list[str] = []
    stop = threading.Event()

    def save_forever():
        c = client(app, token)
        c.predict(*GENERATE, api_name="/generate")
        while not stop.is_set():
            try:
                acknowledged.append(c.predict(api_name="/save_result")["id"])
            except Exception:  # noqa: BLE001 - the server died mid-call: that save was never acknowledged
                return

    workers = [threading.Thread(target=save_forever) for _ in range(3)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 120
    while len(acknowledged) < 12 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # saves under way when the kill comes
    app.restart(kill=True)  # SIGKILL: no chance to finish a transaction
    stop.set()
    for w in workers:
        w.join(timeout=60)
    assert len(acknowledged) > 10
    reader = client(app)
    for result_id in acknowledged:
        assert reader.predict(result_id, api_name="/result")["id"] == result_id
    db = sqlite3.connect(str(tmp_path / "library.db"))
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_the_library_cli_lists_adds_and_shares(app, tmp_path, capsys):
    from steer_ui.cli import main

    store = str(tmp_path / "library.db")
    owner = client(app)
    token = owner.predict(api_name="/whoami")
    name = _train(client(app, token))
    assert main(["library", "list", "--store", store, "--owner", token, "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert name in {row["name"] for row in listing["items"] if row["kind"] == "vector"}
    assert main(["library", "share", name, "--store", store, "--owner", token, "--json"]) == 0
    share_id = json.loads(capsys.readouterr().out)["share_id"]
    stranger = client(app)
    stranger.predict(PROMPT, share_id, 1, 0.5, True, 0, api_name="/next_token")
    assert main(["library", "share", name, "--store", store, "--owner", "f" * 32, "--json"]) == 2
    assert "no such owner" in json.loads(capsys.readouterr().out)["error"]
