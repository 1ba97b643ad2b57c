"""The library (issue #30): an owner's vectors, datasets and settings outlive the session and the server; a share
id opens one vector for anyone, read-only, with the same numbers; ids cannot be guessed; a corrupt store is moved
aside, never deleted."""
from __future__ import annotations

import sqlite3

import pytest
import torch

from steer_ui.messages import UserError
from steer_ui.policy import Policy
from steer_ui.service import Service
from steer_ui.store import open_library

PROMPT = "The capital of France is"


def _service(tiny, path, **policy) -> Service:
    p = Policy(**policy)
    return Service(tiny("llama"), policy=p, library=open_library(str(path), p))


def _trained(service, session) -> str:
    service.upload_dataset(session, None, bundled="capitals_statements.csv")
    name, _ = service.train(session, "mean-diff", layer=1)
    return name


def test_a_restart_keeps_an_owner_s_vectors_dataset_and_language(tiny, tmp_path):
    db = tmp_path / "library.db"
    first = _service(tiny, db)
    token = first.claim_owner("tab-one-aaaa")
    name = _trained(first, "tab-one-aaaa")
    first.set_language("tab-one-aaaa", "zh-CN")
    before = first.next_token("tab-one-aaaa", PROMPT, name, 1, 0.5).as_dict()
    first.keeper.library.db.close()

    again = _service(tiny, db)  # a new process: nothing in memory
    assert again.claim_owner("tab-two-bbbb", token) == token  # a reload or a second tab with the same token
    assert name in again.vector_names("tab-two-bbbb")
    assert again.language("tab-two-bbbb") == "zh-CN"
    assert again.dataset_summary("tab-two-bbbb")["rows"] == 264
    after = again.next_token("tab-two-bbbb", PROMPT, name, 1, 0.5).as_dict()
    assert after == before  # the vector read back steers exactly as before
    stranger = again.claim_owner("tab-strange", "0" * 32)  # a token this server never issued owns nothing
    assert stranger != token and name not in again.vector_names("tab-strange")


def test_a_shared_vector_steers_a_stranger_exactly_as_its_owner_and_unsharing_closes_the_link(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db")
    service.claim_owner("owner-aaaaaa")
    name = _trained(service, "owner-aaaaaa")
    share_id = service.share_vector("owner-aaaaaa", name)
    assert len(share_id) == 22 and service.share_vector("owner-aaaaaa", name) == share_id
    service.claim_owner("stranger-bbb")
    shown = service.open_shared("stranger-bbb", share_id)
    assert shown == f"{name} (shared)" and shown in service.vector_names("stranger-bbb")
    mine = service.next_token("owner-aaaaaa", PROMPT, name, 1, 0.5).as_dict()
    theirs = service.next_token("stranger-bbb", PROMPT, shown, 1, 0.5).as_dict()
    assert theirs == mine
    with pytest.raises(UserError) as info:
        service.share_vector("stranger-bbb", shown)  # read-only for them
    assert info.value.key == "not_own_vector"
    assert service.unshare_vector("owner-aaaaaa", name)
    service.claim_owner("late-visitor")
    with pytest.raises(UserError) as unshared:
        service.open_shared("late-visitor", share_id)
    with pytest.raises(UserError) as never:
        service.open_shared("late-visitor", "A" * 22)
    assert unshared.value.key == never.value.key == "unknown_id" and str(unshared.value) == str(never.value)


def test_ids_that_do_not_resolve_are_rate_limited_per_client(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db", id_misses_per_minute=5)
    service.claim_owner("guesser-aaaa")
    for k in range(5):
        with pytest.raises(UserError) as info:
            service.open_shared("guesser-aaaa", f"{k:022d}", client="10.0.0.9")
        assert info.value.key == "unknown_id"
    with pytest.raises(UserError) as info:
        service.result(f"{6:022d}", client="10.0.0.9")
    assert info.value.key == "too_many_misses"
    with pytest.raises(UserError) as info:
        service.result(f"{6:022d}", client="10.0.0.1")  # another client is not held back
    assert info.value.key == "unknown_id"


def test_quotas_refuse_in_one_line_and_change_nothing(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db", owner_max_vectors=1)
    service.claim_owner("owner-aaaaaa")
    name = _trained(service, "owner-aaaaaa")
    with pytest.raises(UserError) as info:
        service.train("owner-aaaaaa", "mean-diff", layer=2)
    assert info.value.key == "owner_quota"
    assert [n for n in service.vector_names("owner-aaaaaa") if n.startswith("mean-diff")] == [name]


def test_a_saved_result_reads_back_without_the_model(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db")
    service.claim_owner("owner-aaaaaa")
    frame = service.generate("owner-aaaaaa", PROMPT, "random direction", 1, 0.5,
                             sampling=service.sampling(max_new_tokens=4))
    result_id = service.save_result("owner-aaaaaa", {"prompt": PROMPT, "alpha": 0.5})
    saved = service.result(result_id)
    assert saved["generation"]["steered"]["text"] == frame.steered_text and saved["view"]["alpha"] == 0.5
    assert saved["model_fingerprint"] and saved["id"] == result_id


def test_a_session_without_an_owner_works_and_keeps_nothing(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db")
    name = _trained(service, "no-owner-aaa")  # never claimed an owner
    assert name in service.vector_names("no-owner-aaa")
    with pytest.raises(UserError) as info:
        service.share_vector("no-owner-aaa", name)
    assert info.value.key == "not_kept"
    assert service.keeper.library.db.usage()[1] == 0


def test_a_corrupt_store_is_moved_aside_and_the_app_starts_empty(tiny, tmp_path):
    db = tmp_path / "library.db"
    db.write_bytes(b"this is not a database" * 100)
    service = _service(tiny, db)
    aside = service.keeper.library.db.moved_aside
    assert aside is not None and aside.exists() and aside.read_bytes().startswith(b"this is not")
    service.claim_owner("owner-aaaaaa")
    assert _trained(service, "owner-aaaaaa") in service.vector_names("owner-aaaaaa")
    assert sqlite3.connect(str(db)).execute("SELECT COUNT(*) FROM items WHERE kind = 'vector'").fetchone()[0] == 1


def test_the_same_vector_is_stored_once(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db")
    # One vector made once: made twice, its `created` second may differ, and then the files do too.
    vector = None
    for session in ("owner-aaaaaa", "owner-bbbbbb"):
        service.claim_owner(session)
        vector = vector or service.get_vector(session, "random direction", 1, seed=3)
        service.add_vector(session, vector, "same")
    rows = service.keeper.library.db.rows("SELECT COUNT(*) FROM blobs")
    assert rows[0][0] == 1 and service.keeper.library.db.usage()[1] == 2
    assert torch.equal(service.get_vector("owner-bbbbbb", "same").direction(1),
                       service.get_vector("owner-aaaaaa", "same").direction(1))


def test_housekeeping_removes_only_unshared_work_of_owners_who_stayed_away(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db", owner_idle_days=30)
    library = service.keeper.library
    service.claim_owner("gone-aaaaaaa")
    kept_name = _trained(service, "gone-aaaaaaa")
    shared_name, _ = service.train("gone-aaaaaaa", "mean-diff", layer=2)
    share_id = service.share_vector("gone-aaaaaaa", shared_name)
    service.claim_owner("present-bbbb")
    present = _trained(service, "present-bbbb")
    owner = service.session("gone-aaaaaaa").owner
    library.db.touch_owner(owner, 0.0)  # last seen in 1970: long gone
    assert library.housekeeping() >= 2  # the unshared vector and the dataset
    names = {i["name"] for i in library.items(owner, "vector")}
    assert kept_name not in names and shared_name in names  # the shared one stays
    assert library.shared(share_id, None) is not None
    assert present in {i["name"] for i in library.items(service.session("present-bbbb").owner, "vector")}


def test_an_owner_s_session_makes_room_and_the_same_tab_comes_back_to_its_work(tiny, tmp_path):
    """A session whose work is in the library holds nothing eviction could lose: when the server is full it is
    let go for a newcomer, and the same tab's next call finds its owner's vectors again."""
    service = _service(tiny, tmp_path / "library.db", max_sessions=2, session_grace_seconds=0)
    service.claim_owner("owner-aaaaaa")
    name = _trained(service, "owner-aaaaaa")
    before = service.next_token("owner-aaaaaa", PROMPT, name, 1, 0.5).as_dict()
    service.session("visitor-bbbb")
    service.session("visitor-cccc")  # the server is full: the owner's session, kept in the library, makes room
    assert service.sessions.peek("owner-aaaaaa") is None
    assert name in service.vector_names("owner-aaaaaa")
    assert service.next_token("owner-aaaaaa", PROMPT, name, 1, 0.5).as_dict() == before


def test_an_owner_at_the_datasets_quota_keeps_the_newest_upload(tiny, tmp_path):
    service = _service(tiny, tmp_path / "library.db", owner_max_datasets=2)
    service.claim_owner("owner-aaaaaa")
    for bundled in ("capitals_statements.csv", "sentiment_pairs.csv", "science_statements.csv"):
        service.upload_dataset("owner-aaaaaa", None, bundled=bundled)
    kept = [i["name"] for i in service.keeper.library.items(service.session("owner-aaaaaa").owner, "dataset")]
    assert kept == ["sentiment_pairs.csv", "science_statements.csv"]  # the oldest made room, nothing refused
