"""The only place SQL lives: the library's tables on SQLite (one file, WAL) or PostgreSQL (several processes).

One connection per process, every call under one lock, every write one transaction: a process killed in the
middle of a save leaves each item either complete or absent (SQLite's journal, PostgreSQL's transactions).
Queries are written once with ``?`` placeholders; PostgreSQL's driver gets ``%s``.

Tables:
  owners(token_hash, created, seen, settings)   an owner is a visitor's browser or API client; only the SHA-256
                                                of its token is kept
  blobs(content_id, data, size, created)        file bytes by content (a vector's native file, a dataset's upload),
                                                stored once however many items use them
  items(item_id, owner, kind, name, content_id, meta, share_id, listed, model, size, created, touched)
                                                a vector, a dataset or a saved result; owner NULL for the host's
                                                listed vectors
  settings(key, value)                          the library's own settings, the same for every app process

A store that cannot be written (its disk full, its file or file system read-only, locked by another process past
the wait, unreachable) fails in one line: every driver's error becomes :class:`StoreUnwritable`, a refusal the
visitor reads in their language ("the library is full" / "cannot be written"), logged once a minute per cause as
one line for the administrator, never a traceback per save.
"""
from __future__ import annotations

import errno
import logging
import re
import shutil
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..messages import UserError

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS owners (
    token_hash TEXT PRIMARY KEY, created {real} NOT NULL, seen {real} NOT NULL, settings TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (
    content_id TEXT PRIMARY KEY, data {blob} NOT NULL, size BIGINT NOT NULL, created {real} NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    item_id TEXT PRIMARY KEY, owner TEXT, kind TEXT NOT NULL, name TEXT NOT NULL, content_id TEXT,
    meta TEXT NOT NULL, share_id TEXT UNIQUE, listed INTEGER NOT NULL, model TEXT NOT NULL, size BIGINT NOT NULL,
    created {real} NOT NULL, touched {real} NOT NULL);
CREATE INDEX IF NOT EXISTS items_owner ON items (owner, kind);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS items_content ON items (content_id);
CREATE INDEX IF NOT EXISTS blobs_size ON blobs (size);
CREATE INDEX IF NOT EXISTS items_owner_size ON items (owner, size);
CREATE INDEX IF NOT EXISTS items_kind_size ON items (kind, size);
"""
# the size sums of the budgets read these covering indexes, not the rows (whose blobs and results' JSON come
# before the size column: SQLite would walk every overflow page of every row to reach it)

ITEM_COLUMNS = ("item_id", "owner", "kind", "name", "content_id", "meta", "share_id", "listed", "model", "size",
                "created", "touched")


class StoreError(Exception):
    """The library cannot be opened or written (its message is one line for the administrator)."""


class StoreUnwritable(StoreError, UserError):
    """A write (or, for a store that cannot be opened, a read) the store refused.  ``cause``: "full",
    "read-only", "locked", "cannot be opened", "a disk error" or "unreachable"; ``str()`` is the visitor's
    refusal in English (``key`` names it for the UI), :attr:`line` the administrator's."""

    def __init__(self, cause: str, detail: str):
        UserError.__init__(self, "library_full" if cause == "full" else "library_unwritable")
        self.cause, self.detail = cause, detail

    @property
    def line(self) -> str:
        return f"cannot be written ({self.cause}: {self.detail})"


class _Refused(Exception):
    """A save over a limit, found inside its transaction: rolled back, then said why (:meth:`Database.put_item`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# SQLite's primary result codes (the low byte of sqlite_errorcode) that mean the store, not the query, failed,
# and an extended one: the WAL's shared-memory file could not grow (on a full disk, at the first write after start)
_SQLITE_CAUSES = {13: "full", 8: "read-only", 3: "read-only", 5: "locked", 6: "locked", 14: "cannot be opened",
                  10: "a disk error"}
_SQLITE_IOERR_SHMSIZE = 4874
_OS_CAUSES = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EFBIG: "full", errno.EROFS: "read-only",
              errno.EACCES: "read-only", errno.EPERM: "read-only"}


def where(spec: str) -> str:
    """The store as an administrator names it in a log line: the file, or the URL without its password."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", str(spec))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def unwritable(exc: BaseException) -> StoreUnwritable | None:
    """``exc`` as the store's refusal when the store itself failed (full, read-only, locked, ...), else None
    (a query's own error: a bug, raised as it is)."""
    if isinstance(exc, StoreUnwritable):
        return exc
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        cause = (None if not isinstance(code, int) else "full" if code == _SQLITE_IOERR_SHMSIZE
                 else _SQLITE_CAUSES.get(code & 0xFF))
        if cause is None and isinstance(exc, sqlite3.OperationalError):
            text = str(exc).lower()
            cause = ("full" if "full" in text else "read-only" if "readonly" in text or "read-only" in text
                     else "locked" if "locked" in text else None)
        detail = "no room for the write-ahead log's index" if code == _SQLITE_IOERR_SHMSIZE else _first_line(exc)
        return StoreUnwritable(cause, detail) if cause else None
    if isinstance(exc, OSError):
        cause = _OS_CAUSES.get(exc.errno)
        return StoreUnwritable(cause, exc.strerror or _first_line(exc)) if cause else None
    state = getattr(exc, "sqlstate", None)  # psycopg
    if type(exc).__module__.startswith("psycopg"):
        if state == "25006" or state == "42501":  # read_only_sql_transaction, insufficient_privilege
            return StoreUnwritable("read-only", _first_line(exc))
        if state and state.startswith("53"):  # insufficient resources: disk_full, out_of_memory, too many
            return StoreUnwritable("full", _first_line(exc))
        if state in ("55P03", "40P01"):  # lock_not_available, deadlock_detected
            return StoreUnwritable("locked", _first_line(exc))
        if (state or "").startswith(("08", "57")) or (state is None and type(exc).__name__ == "OperationalError"):
            return StoreUnwritable("unreachable", _first_line(exc))  # the connection or the server went away
    return None


class Database:
    """A connection to the library's tables; thread-safe; every method is one transaction."""

    def __init__(self, spec: str):
        self.spec = spec
        self.postgres = spec.startswith(("postgresql://", "postgres://"))
        self.moved_aside: Path | None = None  # a corrupt SQLite file found at start, kept under this name
        self._lock = threading.RLock()
        self._logged: dict[str, float] = {}  # cause -> when a refused write was last logged
        self.serving = False  # an app process serving on it (check_writable passed): refusals are logged
        self._conn = self._connect_postgres() if self.postgres else self._connect_sqlite(Path(spec))
        real, blob = ("DOUBLE PRECISION", "BYTEA") if self.postgres else ("REAL", "BLOB")
        try:
            with self.transaction() as cur:
                for statement in SCHEMA.format(real=real, blob=blob).split(";"):
                    if statement.strip():
                        cur.execute(statement)
        except StoreError:
            self._conn.close()
            raise

    @property
    def where(self) -> str:
        return where(self.spec)

    def check_writable(self) -> None:
        """Raise :class:`StoreUnwritable` unless a write goes through now (an app process asks before serving)."""
        with self.transaction() as cur:
            cur.execute("INSERT INTO settings (key, value) VALUES ('opened', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (repr(time.time()),))
        self.serving = True

    # ------------------------------------------------------------------ connecting
    def _connect_postgres(self):
        try:
            import psycopg
        except ImportError:
            raise StoreError("a postgresql:// store needs the psycopg package (pip install psycopg[binary])") from None
        try:
            return psycopg.connect(self.spec, autocommit=False)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the PostgreSQL store: {str(exc).splitlines()[0]}") from None

    def _connect_sqlite(self, path: Path):
        if path.is_dir():
            raise StoreError("cannot be opened (it is a folder, not a file)")
        if path.parent.exists() and not path.parent.is_dir():
            raise StoreError("cannot be opened (a file stands where its folder should be)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                return self._open_sqlite(path)
            except sqlite3.DatabaseError as exc:
                if unwritable(exc) is not None:  # full, read-only, locked: the file may be fine, never moved
                    raise
            # unreadable: never deleted, moved aside so the app starts with an empty library
            self.moved_aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(str(path), str(self.moved_aside))
            for suffix in ("-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                if side.exists():
                    shutil.move(str(side), str(self.moved_aside) + suffix)
            return self._open_sqlite(path)
        except (sqlite3.Error, OSError) as exc:
            refusal = unwritable(exc)
            if refusal is None:
                detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else _first_line(exc)
                raise StoreError(f"cannot be opened ({detail})") from None
            raise refusal from None

    @staticmethod
    def _open_sqlite(path: Path):
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # an acknowledged save survives a power cut too
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("the integrity check failed")
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---------------------------------------------------------------- transactions
    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[Any]:
        """A cursor inside one transaction: committed at the end, rolled back on any error; a store that
        fails (full, read-only, locked, gone) raises :class:`StoreUnwritable`.  ``write``: take SQLite's write
        lock at the start (a reader takes none, so reads go on while a store is read-only or busy)."""
        with self._lock:
            try:
                cur = self._conn.cursor()
            except Exception as exc:  # noqa: BLE001 - a closed or broken connection
                raise self._refusal(exc) from None
            try:
                if not self.postgres:
                    cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield _Cursor(cur, self.postgres)
                self._conn.commit() if self.postgres else cur.execute("COMMIT")
            except BaseException as exc:
                try:
                    self._conn.rollback() if self.postgres else cur.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
                if isinstance(exc, Exception) and not isinstance(exc, (UserError, _Refused)):
                    refusal = unwritable(exc)
                    if refusal is not None:
                        raise self._refusal(refusal) from None
                raise
            finally:
                try:
                    cur.close()
                except Exception:  # noqa: BLE001 - a broken connection's cursor
                    pass

    def _refusal(self, exc: BaseException) -> StoreUnwritable:
        """``exc`` as the store's refusal, logged as one line at most once a minute per cause."""
        refusal = unwritable(exc) or StoreUnwritable("unreachable", _first_line(exc))
        now = time.monotonic()
        if self.serving and now - self._logged.get(refusal.cause, -1e9) >= 60.0:
            self._logged[refusal.cause] = now
            log.warning("the library at %s %s; saves are refused (each visitor told in one line) until it can be "
                        "written", self.where, refusal.line)
        return refusal

    def rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        with self.transaction(write=False) as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def setting(self, key: str, make) -> str:
        """The library's setting ``key``, made once by ``make()`` (the first process to ask wins); read without
        writing once it exists (a read-only store still answers)."""
        found = self.rows("SELECT value FROM settings WHERE key = ?", (key,))
        if found:
            return found[0][0]
        with self.transaction() as cur:
            cur.execute("INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                        (key, make()))
            cur.execute("SELECT value FROM settings WHERE key = ?", (key,))
            return cur.fetchall()[0][0]

    # ----------------------------------------------------------------------- owners
    def add_owner(self, token_hash: str, now: float) -> None:
        with self.transaction() as cur:
            cur.execute("INSERT INTO owners (token_hash, created, seen, settings) VALUES (?, ?, ?, '{}')",
                        (token_hash, now, now))

    def owner(self, token_hash: str) -> tuple | None:
        found = self.rows("SELECT token_hash, created, seen, settings FROM owners WHERE token_hash = ?", (token_hash,))
        return found[0] if found else None

    def touch_owner(self, token_hash: str, now: float, settings: str | None = None) -> None:
        with self.transaction() as cur:
            if settings is None:
                cur.execute("UPDATE owners SET seen = ? WHERE token_hash = ?", (now, token_hash))
            else:
                cur.execute("UPDATE owners SET seen = ?, settings = ? WHERE token_hash = ?",
                            (now, settings, token_hash))

    # ------------------------------------------------------------------------ items
    def put_item(self, item: dict, blob: bytes | None, max_items: int | None = None,
                 owner_max_bytes: int | None = None, store_max_bytes: int | None = None,
                 make_way: bool = False) -> str:
        """Insert ``item`` (and its blob, once per content id), replacing the owner's item of that kind and name;
        "kept", or why not, with nothing changed: "quota" (the owner keeps ``max_items`` other items of that
        kind; with ``make_way`` its oldest ones go instead, in this transaction: kept and removed together or
        neither), "owner_bytes" (the owner's items would exceed ``owner_max_bytes``), "store_full" (every kept byte
        would exceed ``store_max_bytes``, :meth:`usage`).  Counted in the same transaction as the insert, so saves
        racing each other, in one process or several, cannot pass a limit together (SQLite's BEGIN IMMEDIATE
        makes writers take turns; on PostgreSQL an advisory lock does)."""
        try:
            with self.transaction() as cur:
                if self.postgres:
                    cur.execute("SELECT pg_advisory_xact_lock(hashtext(?))", ("steer_ui.items",))
                owner = item["owner"]
                if max_items is not None and owner is not None:
                    cur.execute("SELECT item_id FROM items WHERE owner = ? AND kind = ? AND name <> ? "
                                "ORDER BY created", (owner, item["kind"], item["name"]))
                    others = [row[0] for row in cur.fetchall()]
                    if len(others) >= max_items and not make_way:
                        raise _Refused("quota")
                    for oldest in others[: max(0, len(others) - max_items + 1)]:
                        cur.execute("DELETE FROM items WHERE item_id = ?", (oldest,))
                if blob is not None:
                    cur.execute("INSERT INTO blobs (content_id, data, size, created) VALUES (?, ?, ?, ?) "
                                "ON CONFLICT (content_id) DO NOTHING",
                                (item["content_id"], blob, len(blob), item["created"]))
                if owner is None:
                    cur.execute("DELETE FROM items WHERE owner IS NULL AND kind = ? AND name = ?",
                                (item["kind"], item["name"]))
                else:
                    cur.execute("DELETE FROM items WHERE owner = ? AND kind = ? AND name = ?",
                                (owner, item["kind"], item["name"]))
                cur.execute(f"INSERT INTO items ({', '.join(ITEM_COLUMNS)}) "
                            f"VALUES ({', '.join('?' * len(ITEM_COLUMNS))})", tuple(item[c] for c in ITEM_COLUMNS))
                self._drop_orphans(cur)
                # the limits, counted with this item in and the one it replaces (and any orphaned blob) out
                if owner_max_bytes is not None and owner is not None and self._used(cur, owner) > owner_max_bytes:
                    raise _Refused("owner_bytes")
                if store_max_bytes is not None and self._used(cur) > store_max_bytes:
                    raise _Refused("store_full")
        except _Refused as refused:
            return refused.reason
        return "kept"

    def items(self, where: str, params: Sequence = ()) -> list[dict]:
        rows = self.rows(f"SELECT {', '.join(ITEM_COLUMNS)} FROM items WHERE {where} ORDER BY created", params)
        return [dict(zip(ITEM_COLUMNS, row)) for row in rows]

    def blob(self, content_id: str) -> bytes | None:
        found = self.rows("SELECT data FROM blobs WHERE content_id = ?", (content_id,))
        return bytes(found[0][0]) if found else None

    def update_item(self, item_id: str, **values) -> None:
        names = sorted(values)
        with self.transaction() as cur:
            cur.execute(f"UPDATE items SET {', '.join(f'{n} = ?' for n in names)} WHERE item_id = ?",
                        tuple(values[n] for n in names) + (item_id,))

    def delete_items(self, item_ids: Sequence[str]) -> None:
        with self.transaction() as cur:
            for item_id in item_ids:
                cur.execute("DELETE FROM items WHERE item_id = ?", (item_id,))
            self._drop_orphans(cur)

    def usage(self, owner: str | None = None) -> tuple[int, int]:
        """(every kept byte, or ``owner``'s; number of items): see :meth:`_used`."""
        with self.transaction(write=False) as cur:
            size = self._used(cur, owner)
            if owner is None:
                cur.execute("SELECT COUNT(*) FROM items")
            else:
                cur.execute("SELECT COUNT(*) FROM items WHERE owner = ?", (owner,))
            return size, int(cur.fetchall()[0][0])

    @staticmethod
    def _used(cur, owner: str | None = None) -> int:
        """Bytes kept: for the whole store every blob once (vectors' and datasets' files) and every saved result
        (its JSON is its item's meta, counted in its size); for an owner the sizes of its items (a vector's file,
        a dataset's, a result's JSON), shared blobs counted for each owner that keeps them."""
        if owner is None:
            cur.execute("SELECT (SELECT COALESCE(SUM(size), 0) FROM blobs) + "
                        "(SELECT COALESCE(SUM(size), 0) FROM items WHERE kind = 'result')")
        else:
            cur.execute("SELECT COALESCE(SUM(size), 0) FROM items WHERE owner = ?", (owner,))
        return int(cur.fetchall()[0][0])

    def drop_empty_owners(self, seen_before: float) -> None:
        with self.transaction() as cur:
            cur.execute("DELETE FROM owners WHERE seen < ? AND token_hash NOT IN "
                        "(SELECT owner FROM items WHERE owner IS NOT NULL)", (seen_before,))

    def idle_owners(self, seen_before: float) -> list[str]:
        return [r[0] for r in self.rows("SELECT token_hash FROM owners WHERE seen < ? ORDER BY seen", (seen_before,))]

    @staticmethod
    def _drop_orphans(cur) -> None:
        cur.execute("DELETE FROM blobs WHERE content_id NOT IN "
                    "(SELECT content_id FROM items WHERE content_id IS NOT NULL)")


class _Cursor:
    """A cursor that takes ``?`` placeholders on either driver."""

    def __init__(self, cur, postgres: bool):
        self._cur, self._postgres = cur, postgres

    def execute(self, sql: str, params: Sequence = ()) -> None:
        self._cur.execute(sql.replace("?", "%s") if self._postgres else sql, tuple(params))

    def fetchall(self) -> list[tuple]:
        return self._cur.fetchall()
