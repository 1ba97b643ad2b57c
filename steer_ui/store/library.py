"""The library: what visitors make, kept for them and shared by link.

An **owner** is a browser (its token lives in the browser's local storage) or an API client (the
``X-Steer-Owner`` header); the token is 128 random bits issued by the server, and only its SHA-256 is
stored.  An owner's **vectors** (as their native file's bytes), **datasets** (as uploaded) and **settings**
outlive the tab, the session and the server.  A vector can be **shared**: it gets an unguessable share id
(128 bits) that anyone may open, read-only, until its owner unshares it.  A **saved result** (a frozen
Explore view) is read by its id.  The host's **listed** vectors (``app.py --vectors DIR``) are open to all.

Limits (``policy.py``): per owner a number of vectors, datasets and results and bytes in all, the whole
store a disk budget.  Housekeeping removes, oldest owner first, the unshared, unlisted vectors and datasets of
owners who have not come back for ``policy.owner_idle_days``, and when the store is over its budget, the
unshared, unlisted vectors and datasets of the owners seen longest ago; shared and listed vectors and saved
results are never removed by it.  Every limit is counted inside the save's own transaction
(:meth:`Database.put_item`), saved results' bytes included.  Lookups of ids that do not resolve are rate-limited
per client, so ids cannot be enumerated.

A store that cannot be written (full, read-only, locked) refuses a save with one line in the visitor's language
(:class:`~steer_ui.store.database.StoreUnwritable`); what only records a visit (an owner's last visit, an item's
last use, the language) is skipped instead, so reading and steering go on as before.
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from typing import Any

from ..messages import UserError
from .database import Database, StoreUnwritable

OWNER_TOKEN = re.compile(r"^[0-9a-f]{32}$")
PUBLIC_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")  # secrets.token_urlsafe(16): 128 bits
KINDS = ("vector", "dataset", "result")
DAY = 86400.0
SEEN_EVERY = 60.0


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def content_id(data: bytes, model: str) -> str:
    """The same bytes for the same model are stored once."""
    return hashlib.sha256(model.encode("utf-8") + b"\0" + data).hexdigest()[:40]


class Library:
    def __init__(self, db: Database, policy):
        self.db, self.policy = db, policy
        self._misses: dict[str, list[float]] = {}  # client -> times of lookups that found nothing
        self._misses_lock = threading.Lock()

    # ------------------------------------------------------------------ owners
    @property
    def browser_secret(self) -> str:
        """The key every app process on this library gives the page's local-storage owner token."""
        return self.db.setting("browser_secret", lambda: secrets.token_hex(16))

    def issue_owner(self) -> str:
        token = secrets.token_hex(16)
        self.db.add_owner(token_hash(token), time.time())
        return token

    def owner_of(self, token: Any) -> str | None:
        """The owner key for ``token`` if the server issued it, else None (a made-up token owns nothing)."""
        if not isinstance(token, str) or not OWNER_TOKEN.match(token):
            return None
        key = token_hash(token)
        found = self.db.owner(key)
        if found is None:
            return None
        if time.time() - found[2] > SEEN_EVERY:  # an owner's last visit, written at most once a minute
            try:
                self.db.touch_owner(key, time.time())
            except StoreUnwritable:  # a store that cannot be written still knows its owners
                pass
        return key

    def settings(self, owner: str) -> dict:
        found = self.db.owner(owner)
        try:
            return json.loads(found[3]) if found else {}
        except ValueError:
            return {}

    def save_settings(self, owner: str, settings: dict) -> None:
        """Keep ``owner``'s settings; a store that cannot be written keeps the ones it has (the session still
        switches: a language change never fails over the library)."""
        text = json.dumps(settings, ensure_ascii=False)[: self.policy.owner_settings_chars]
        try:
            self.db.touch_owner(owner, time.time(), text)
        except StoreUnwritable:
            pass

    # ------------------------------------------------------------------ saving
    def save(self, owner: str | None, kind: str, name: str, data: bytes | None, meta: dict, model: str,
             listed: bool = False, uses: str | None = None, make_way: bool = False) -> dict:
        """Keep ``data`` (or only ``meta``) as ``owner``'s ``kind`` named ``name`` (replacing one of that name).
        ``uses``: the content id of a blob this item needs kept (a saved result's vector); ``make_way``: at the
        owner's quota of ``kind`` its oldest goes, in the same transaction, instead of a refusal.  A limit reached
        or a store that cannot be written refuses it with one line (UserError) and changes nothing."""
        p = self.policy
        now = time.time()
        meta_text = json.dumps(meta, ensure_ascii=False)
        size = len(data) if data is not None else len(meta_text.encode("utf-8"))  # what the store keeps for it
        limit = {"vector": p.owner_max_vectors, "dataset": p.owner_max_datasets, "result": p.owner_max_results}
        item = {"item_id": secrets.token_urlsafe(16), "owner": owner, "kind": kind, "name": name,
                "content_id": content_id(data, model) if data is not None else uses,
                "meta": meta_text, "share_id": None, "listed": int(listed),
                "model": model, "size": size, "created": now, "touched": now}
        owned = owner is not None
        for attempt in range(2):  # over the store's budget: make room once, then try again
            outcome = self.db.put_item(item, data, max_items=limit[kind] if owned else None,
                                       owner_max_bytes=p.owner_max_bytes if owned else None,
                                       store_max_bytes=p.store_max_bytes, make_way=make_way)
            if outcome != "store_full" or attempt:
                break
            self._make_room(size)
        if outcome == "quota":
            raise UserError("owner_quota", kind=kind, limit=limit[kind])
        if outcome == "owner_bytes":
            raise UserError("owner_bytes", limit=p.owner_max_bytes >> 20)
        if outcome == "store_full":
            raise UserError("store_full", limit=p.store_max_bytes >> 20)
        return item

    def _make_room(self, size: int) -> None:
        """Bring the store to ``size`` bytes under its budget: remove what the module docstring says may go,
        oldest first; refused when that is not enough."""
        budget = self.policy.store_max_bytes
        used, _ = self.db.usage()
        if used + size <= budget:
            return
        for owner in self.db.idle_owners(time.time()):  # every owner, seen longest ago first
            for item in self._removable(owner):
                self.db.delete_items([item["item_id"]])
                used, _ = self.db.usage()
                if used + size <= budget:
                    return
        raise UserError("store_full", limit=budget >> 20)

    def _removable(self, owner: str) -> list[dict]:
        return sorted((i for i in self.db.items("owner = ? AND kind IN ('vector', 'dataset')", (owner,))
                       if not i["share_id"] and not i["listed"]), key=lambda i: i["touched"])

    def housekeeping(self) -> int:
        """Remove the removable items of owners not seen for ``policy.owner_idle_days``, and owners who keep
        nothing and have not come back for a day (a page opened once); how many items went."""
        gone = 0
        for owner in self.db.idle_owners(time.time() - self.policy.owner_idle_days * DAY):
            doomed = [i["item_id"] for i in self._removable(owner)]
            self.db.delete_items(doomed)
            gone += len(doomed)
        self.db.drop_empty_owners(time.time() - DAY)
        return gone

    def keep_tidy(self, every_seconds: float = 6 * 3600.0) -> threading.Thread:
        """Run :meth:`housekeeping` now and then every ``every_seconds`` in a daemon thread (an app process)."""
        def run():
            while True:
                try:
                    self.housekeeping()
                except Exception:  # noqa: BLE001 - a failed round is tried again at the next
                    pass
                time.sleep(every_seconds)

        thread = threading.Thread(target=run, name="steer_ui-library-housekeeping", daemon=True)
        thread.start()
        return thread

    # ---------------------------------------------------------------- reading
    def items(self, owner: str | None, kind: str, model: str | None = None) -> list[dict]:
        """``owner``'s items of ``kind`` (None: the host's listed ones), oldest first; for ``model`` only if given."""
        if owner is None:
            found = self.db.items("owner IS NULL AND kind = ? AND listed = 1", (kind,))
        else:
            found = self.db.items("owner = ? AND kind = ?", (owner, kind))
        return [i for i in found if model is None or i["model"] == model]

    def item(self, owner: str | None, kind: str, name: str) -> dict | None:
        return next((i for i in self.items(owner, kind) if i["name"] == name), None)

    def data(self, item: dict) -> bytes:
        try:
            self.db.update_item(item["item_id"], touched=time.time())  # its last use (housekeeping's clock)
        except StoreUnwritable:  # reading goes on while the store cannot be written
            pass
        blob = self.db.blob(item["content_id"]) if item.get("content_id") else None
        if blob is None:
            raise UserError("unknown_id")
        return blob

    def remove(self, owner: str | None, kind: str, name: str) -> bool:
        found = self.item(owner, kind, name)
        if found is not None:
            self.db.delete_items([found["item_id"]])
        return found is not None

    # ---------------------------------------------------------------- sharing
    def share(self, owner: str, name: str) -> str:
        found = self.item(owner, "vector", name)
        if found is None:
            raise UserError("unknown_vector", name=name[:80], known="")
        if not found["share_id"]:
            found["share_id"] = secrets.token_urlsafe(16)
            self.db.update_item(found["item_id"], share_id=found["share_id"])
        return found["share_id"]

    def unshare(self, owner: str, name: str) -> bool:
        found = self.item(owner, "vector", name)
        if found is None or not found["share_id"]:
            return False
        self.db.update_item(found["item_id"], share_id=None)
        return True

    def shared(self, share_id: Any, client: str | None) -> dict | None:
        """The vector shared under ``share_id``; None (counted against ``client``) when there is none."""
        return self._lookup("share_id = ? AND kind = 'vector'", share_id, client)

    def result(self, result_id: Any, client: str | None) -> dict | None:
        return self._lookup("item_id = ? AND kind = 'result'", result_id, client)

    def _lookup(self, where: str, public_id: Any, client: str | None) -> dict | None:
        self._check_misses(client)
        found = self.db.items(where, (public_id,)) if isinstance(public_id, str) and PUBLIC_ID.match(public_id) \
            else []
        if not found:
            with self._misses_lock:
                self._misses.setdefault(client or "?", []).append(time.monotonic())
            return None
        return found[0]

    def _check_misses(self, client: str | None) -> None:
        """Refuse a client that asked for too many ids that do not exist in the last minute."""
        now = time.monotonic()
        with self._misses_lock:
            recent = [t for t in self._misses.get(client or "?", []) if now - t < 60.0]
            self._misses[client or "?"] = recent
            if len(self._misses) > 4096:  # forget the quietest clients
                for key in [k for k, v in self._misses.items() if not v][:2048]:
                    self._misses.pop(key, None)
        if len(recent) >= self.policy.id_misses_per_minute:
            raise UserError("too_many_misses", limit=self.policy.id_misses_per_minute)
