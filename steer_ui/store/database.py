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
"""
from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

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
"""

ITEM_COLUMNS = ("item_id", "owner", "kind", "name", "content_id", "meta", "share_id", "listed", "model", "size",
                "created", "touched")


class StoreError(Exception):
    """The library cannot be opened or written (its message is one line for the administrator)."""


class Database:
    """A connection to the library's tables; thread-safe; every method is one transaction."""

    def __init__(self, spec: str):
        self.spec = spec
        self.postgres = spec.startswith(("postgresql://", "postgres://"))
        self.moved_aside: Path | None = None  # a corrupt SQLite file found at start, kept under this name
        self._lock = threading.RLock()
        self._conn = self._connect_postgres() if self.postgres else self._connect_sqlite(Path(spec))
        real, blob = ("DOUBLE PRECISION", "BYTEA") if self.postgres else ("REAL", "BLOB")
        with self.transaction() as cur:
            for statement in SCHEMA.format(real=real, blob=blob).split(";"):
                if statement.strip():
                    cur.execute(statement)

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
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._open_sqlite(path)
        except sqlite3.DatabaseError:
            # unreadable: never deleted, moved aside so the app starts with an empty library
            self.moved_aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(str(path), str(self.moved_aside))
            for suffix in ("-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                if side.exists():
                    shutil.move(str(side), str(self.moved_aside) + suffix)
            conn = self._open_sqlite(path)
        return conn

    @staticmethod
    def _open_sqlite(path: Path):
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # an acknowledged save survives a power cut too
        if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            conn.close()
            raise sqlite3.DatabaseError("the integrity check failed")
        return conn

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---------------------------------------------------------------- transactions
    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor inside one transaction: committed at the end, rolled back on any error."""
        with self._lock:
            cur = self._conn.cursor()
            try:
                if not self.postgres:
                    cur.execute("BEGIN IMMEDIATE")
                yield _Cursor(cur, self.postgres)
                self._conn.commit() if self.postgres else cur.execute("COMMIT")
            except BaseException:
                try:
                    self._conn.rollback() if self.postgres else cur.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
                raise
            finally:
                cur.close()

    def rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        with self.transaction() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def setting(self, key: str, make) -> str:
        """The library's setting ``key``, made once by ``make()`` (the first process to ask wins)."""
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
    def put_item(self, item: dict, blob: bytes | None, max_items: int | None = None) -> bool:
        """Insert ``item`` (and its blob, once per content id), replacing the owner's item of that kind and name;
        with ``max_items``, only while the owner keeps fewer other items of that kind (counted in the same
        transaction, so saves racing each other, in one process or several, cannot pass the quota together).
        Whether it was kept."""
        with self.transaction() as cur:
            if max_items is not None and item["owner"] is not None:
                if self.postgres:  # writers of one owner take turns (SQLite's BEGIN IMMEDIATE already does)
                    cur.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (item["owner"],))
                cur.execute("SELECT COUNT(*) FROM items WHERE owner = ? AND kind = ? AND name <> ?",
                            (item["owner"], item["kind"], item["name"]))
                if int(cur.fetchall()[0][0]) >= max_items:
                    return False
            if blob is not None:
                cur.execute("INSERT INTO blobs (content_id, data, size, created) VALUES (?, ?, ?, ?) "
                            "ON CONFLICT (content_id) DO NOTHING",
                            (item["content_id"], blob, len(blob), item["created"]))
            if item["owner"] is None:
                cur.execute("DELETE FROM items WHERE owner IS NULL AND kind = ? AND name = ?",
                            (item["kind"], item["name"]))
            else:
                cur.execute("DELETE FROM items WHERE owner = ? AND kind = ? AND name = ?",
                            (item["owner"], item["kind"], item["name"]))
            cur.execute(f"INSERT INTO items ({', '.join(ITEM_COLUMNS)}) VALUES ({', '.join('?' * len(ITEM_COLUMNS))})",
                        tuple(item[c] for c in ITEM_COLUMNS))
            self._drop_orphans(cur)
        return True

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
        """(bytes of all blobs, or of ``owner``'s items; number of items)."""
        if owner is None:
            size = self.rows("SELECT COALESCE(SUM(size), 0) FROM blobs")[0][0]
            count = self.rows("SELECT COUNT(*) FROM items")[0][0]
        else:
            size, count = self.rows("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM items WHERE owner = ?", (owner,))[0]
        return int(size), int(count)

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
