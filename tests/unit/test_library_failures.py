"""The library when its store fails (issue #46): full, read-only, missing.  A save says so in one line in the
visitor's language and changes nothing; what was kept stays readable and steers exactly as before; the honest
session's numbers do not move; the budgets count every kept byte, saved results too, inside the save's own
transaction.  (Over HTTP, against ``python app.py``: tests/security/test_store_failures.py.)"""
from __future__ import annotations

import errno
import sqlite3
import threading

import pytest

from steer_ui.messages import UserError
from steer_ui.policy import Policy
from steer_ui.service import Service
from steer_ui.store import StoreError, StoreUnwritable, open_for_serving, open_library
from steer_ui.store.database import Database, unwritable
from steer_ui.store.library import Library
from steer_ui.ui import i18n

PROMPT = "The capital of France is"
RANDOM = "random direction"


def _service(tiny, path, **policy) -> Service:
    p = Policy(**policy)
    return Service(tiny("llama"), policy=p, library=open_library(str(path), p))


class _FullDisk:
    """The store's connection on a full disk: every statement that writes fails as SQLite fails it there
    ("database or disk is full"; a real full file system is tests/security/test_store_failures.py's, as root).
    SQLite's own ``max_page_count`` is not enough: a small save still fits in its pages' free space."""

    def __init__(self, conn):
        self.conn = conn

    def cursor(self):
        return _FullCursor(self.conn.cursor())

    def __getattr__(self, name):
        return getattr(self.conn, name)


class _FullCursor:
    def __init__(self, cur):
        self.cur = cur

    def execute(self, sql, params=()):
        if sql.split()[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            raise sqlite3.OperationalError("database or disk is full")
        return self.cur.execute(sql, params)

    def __getattr__(self, name):
        return getattr(self.cur, name)


def _fill(db: Database) -> None:
    db._conn = _FullDisk(db._conn)


def _room_again(db: Database) -> None:
    if isinstance(db._conn, _FullDisk):
        db._conn = db._conn.conn
    db._conn.execute("PRAGMA query_only = 0")


def _read_only(db: Database) -> None:
    """Every write answers "attempt to write a readonly database" (SQLITE_READONLY), as on a read-only file."""
    db._conn.execute("PRAGMA query_only = 1")


def _owner_with_work(service: Service, session: str) -> dict:
    token = service.claim_owner(session)
    service.upload_dataset(session, None, bundled="capitals_statements.csv")
    name, _ = service.train(session, "mean-diff", layer=1)
    service.generate(session, PROMPT, name, 1, 0.5, sampling=service.sampling(max_new_tokens=4))
    result_id = service.save_result(session, {"prompt": PROMPT, "alpha": 0.5})
    return {"token": token, "vector": name, "result": result_id,
            "numbers": service.next_token(session, PROMPT, name, 1, 0.5).as_dict()}


def _refused(call, key: str) -> UserError:
    with pytest.raises(UserError) as info:
        call()
    assert info.value.key == key, (info.value.key, str(info.value))
    line = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert len(line.splitlines()) == 1 and line != str(info.value)  # one line, in the visitor's language
    return info.value


@pytest.mark.parametrize("failure, key", [(_fill, "library_full"), (_read_only, "library_unwritable")])
def test_a_store_that_cannot_be_written_refuses_saves_in_one_line_and_loses_nothing(tiny, tmp_path, failure, key):
    service = _service(tiny, tmp_path / "library.db")
    honest = service.next_token("honest-aaaaa", PROMPT, RANDOM, 1, 0.5).as_dict()
    kept = _owner_with_work(service, "owner-aaaaaa")
    before = sorted(service.vector_names("owner-aaaaaa"))
    failure(service.keeper.library.db)

    _refused(lambda: service.save_result("owner-aaaaaa", {"prompt": PROMPT, "alpha": 0.7}), key)
    _refused(lambda: service.train("owner-aaaaaa", "mean-diff", layer=2), key)
    _refused(lambda: service.share_vector("owner-aaaaaa", kept["vector"]), key)
    _refused(lambda: service.upload_dataset("owner-aaaaaa", None, bundled="sentiment_pairs.csv"), key)
    assert sorted(service.vector_names("owner-aaaaaa")) == before  # a refused save changes nothing
    assert service.set_language("owner-aaaaaa", "zh-CN") == "zh-CN"  # what only records a visit goes on
    assert service.claim_owner("newcomer-bbb") == ""  # a new visitor works unkept, never an error
    # a new tab of the same owner reads everything it kept, and it steers exactly as before
    assert service.claim_owner("owner-second", kept["token"]) == kept["token"]
    assert service.next_token("owner-second", PROMPT, kept["vector"], 1, 0.5).as_dict() == kept["numbers"]
    assert service.result(kept["result"])["view"]["alpha"] == 0.5
    assert service.dataset_summary("owner-second")["rows"] == 264
    assert service.next_token("honest-aaaaa", PROMPT, RANDOM, 1, 0.5).as_dict() == honest

    _room_again(service.keeper.library.db)
    assert service.save_result("owner-aaaaaa", {"prompt": PROMPT, "alpha": 0.7})


def test_a_dataset_at_the_quota_on_a_full_store_removes_nothing(tiny, tmp_path):
    """At the datasets quota the oldest makes way in the save's own transaction: a refused save keeps it."""
    service = _service(tiny, tmp_path / "library.db", owner_max_datasets=1)
    service.claim_owner("owner-aaaaaa")
    service.upload_dataset("owner-aaaaaa", None, bundled="capitals_statements.csv")
    owner = service.session("owner-aaaaaa").owner
    _fill(service.keeper.library.db)
    _refused(lambda: service.upload_dataset("owner-aaaaaa", None, bundled="sentiment_pairs.csv"), "library_full")
    assert [i["name"] for i in service.keeper.library.items(owner, "dataset")] == ["capitals_statements.csv"]


def test_the_store_budget_counts_saved_results(tmp_path):
    """Saved results (their JSON is all they keep) count against the whole store's budget, not only vectors."""
    policy = Policy(store_max_bytes=64 << 10)
    library = Library(Database(str(tmp_path / "library.db")), policy)
    payload = {"generation": "x" * (10 << 10)}
    kept = 0
    with pytest.raises(UserError) as info:
        for n in range(20):
            library.save(f"owner-{n}", "result", f"result {n}", None, payload, "model")
            kept += 1
    assert info.value.key == "store_full"
    used, count = library.db.usage()
    assert count == kept == 6 and used <= policy.store_max_bytes  # 6 × 10 KB fit in 64 KB, a 7th does not
    assert used >= kept * (10 << 10)


def test_concurrent_saves_cannot_pass_the_byte_budgets_together(tmp_path):
    """Six processes' saves at once (six connections to one file), each within the limits alone: the limits are
    counted in the insert's transaction, so only as many are kept as fit."""
    path = str(tmp_path / "library.db")
    Database(path).close()
    size, fit = 1 << 20, 2  # a megabyte each: checks made apart from the inserts all end before the first insert
    for policy, owners in ((Policy(owner_max_bytes=int(size * (fit + 0.5))), ["one-owner"] * 6),
                           (Policy(store_max_bytes=int(size * (fit + 0.5))), [f"owner-{k}" for k in range(6)])):
        libraries = [Library(Database(path), policy) for _ in owners]
        start = threading.Barrier(len(owners))
        outcomes: list = [None] * len(owners)

        def save(k: int) -> None:
            start.wait()
            try:
                libraries[k].save(owners[k], "vector", f"v{k}", bytes([k]) * size, {}, f"model-{len(owners[0])}")
                outcomes[k] = "kept"
            except UserError as exc:
                outcomes[k] = exc.key

        threads = [threading.Thread(target=save, args=(k,)) for k in range(len(owners))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes.count("kept") == fit, outcomes
        assert set(outcomes) == {"kept", "owner_bytes" if len(set(owners)) == 1 else "store_full"}, outcomes
        used, _ = libraries[0].db.usage(owners[0] if len(set(owners)) == 1 else None)
        assert used <= size * (fit + 0.5)
        for library in libraries:
            library.db.delete_items([i["item_id"] for i in library.db.items("1 = 1")])
            library.db.close()


def test_a_store_that_cannot_be_opened_is_one_line_naming_the_cause(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "a-folder.db").mkdir()
    for spec, words in ((tmp_path / "a-file" / "library.db", "cannot be opened"),
                        (tmp_path / "a-folder.db", "cannot be opened")):
        with pytest.raises(StoreError) as info:
            open_for_serving(str(spec), Policy())
        line = getattr(info.value, "line", None) or str(info.value)
        assert words in line and len(line.splitlines()) == 1, line
    assert not list((tmp_path / "a-folder.db").iterdir())  # nothing moved aside, nothing made


def test_a_read_only_store_still_reads_and_is_refused_for_serving(tmp_path):
    """The page's browser secret is read without a write (the finding: a read-only store stopped the start with
    a traceback from it); serving needs a write, refused in one line."""
    path = str(tmp_path / "library.db")
    first = open_for_serving(path, Policy())
    secret = first.browser_secret
    first.db.close()
    library = open_library(path, Policy())
    _read_only(library.db)
    assert library.browser_secret == secret
    with pytest.raises(StoreUnwritable) as info:
        library.db.check_writable()
    assert info.value.cause == "read-only" and "readonly" in info.value.line


def test_driver_errors_are_sorted_into_causes():
    assert unwritable(OSError(errno.ENOSPC, "No space left on device")).cause == "full"
    assert unwritable(OSError(errno.EROFS, "Read-only file system")).cause == "read-only"
    assert unwritable(sqlite3.OperationalError("database or disk is full")).cause == "full"
    assert unwritable(sqlite3.OperationalError("attempt to write a readonly database")).cause == "read-only"
    assert unwritable(sqlite3.OperationalError("database is locked")).cause == "locked"
    assert unwritable(sqlite3.OperationalError("no such column: nope")) is None  # a bug is raised as it is
    assert unwritable(sqlite3.IntegrityError("UNIQUE constraint failed")) is None

    class DiskFull(Exception):  # psycopg's, by its SQLSTATE
        sqlstate = "53100"

    DiskFull.__module__ = "psycopg.errors"
    assert unwritable(DiskFull("could not extend file")).cause == "full"
    assert unwritable(OSError(errno.ENOSPC, "x")).key == "library_full"
    assert unwritable(OSError(errno.EROFS, "x")).key == "library_unwritable"
