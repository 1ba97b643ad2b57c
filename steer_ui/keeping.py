"""What a session keeps: sessions bound to owners, their work written through to the library, shared vectors
and saved results read back.

The service owns one :class:`Keeper`; with no library (``--store off``) every call here is a no-op and a
session's work lives in memory only, as the page then says.  Vectors travel as their native file's bytes and
are checked on the way in and again on the way out (:func:`steer_ui.formats.read_vector` against the loaded
model), so a tampered store cannot hand a visitor a malformed tensor.  A vector is read from the store once per
session and then kept in memory: the slider, the decode batch and the sweep never wait on the database.
"""
from __future__ import annotations

import json
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .messages import UserError
from .sessions import Session
from .store import StoreUnwritable

SHARED_SUFFIX = " (shared)"
TERM_VECTOR = "term_vector"  # the kind of a saved result's companion item keeping one of its added vectors


def native_bytes(vector) -> bytes:
    """``vector`` as the bytes of its native file (what the library stores)."""
    with tempfile.TemporaryDirectory(prefix="steer_ui-vector-") as folder:
        path = Path(folder) / "vector.safetensors"
        vector.save(path)
        return path.read_bytes()


class Keeper:
    def __init__(self, library, max_file_bytes: int):
        self.library = library
        self.max_file_bytes = max_file_bytes
        self._tmp = Path(tempfile.mkdtemp(prefix="steer_ui-keep-"))
        self._lock = threading.Lock()

    @property
    def on(self) -> bool:
        return self.library is not None

    # ------------------------------------------------------------------ owners
    def claim(self, s: Session, token: Any, handle, issue: bool = True) -> str:
        """Bind ``s`` to the owner of ``token`` (issued by this server), or (``issue``) to a new owner; the token
        to keep, "" when nothing is kept."""
        if not self.on:
            return ""
        if s.owner is not None and token == s.owner_token:
            return token
        owner = self.library.owner_of(token)
        if owner is None:
            if not issue:
                return ""
            try:
                token = self.library.issue_owner()
            except StoreUnwritable:  # full or read-only: the visitor works unkept (a save says why), never an error
                return ""
            owner = self.library.owner_of(token)
        self.bind(s, owner, handle)
        s.owner_token = token
        return token

    def bind(self, s: Session, owner: str, handle) -> None:
        """Give ``s`` its owner's kept work: vector names (read on first use), latest dataset, settings."""
        if s.owner == owner:
            return
        if s.owner is not None:  # another owner's session until now: none of its work carries over
            s.vectors.clear(), s.reports.clear(), s.shared.clear()
            s.dataset, s.dataset_name, s.probe, s.last_generation = None, "", None, None
        s.owner = owner
        settings = self.library.settings(owner)
        if isinstance(settings.get("lang"), str):
            s.lang = settings["lang"]
        model = self._model(handle)
        s.stored = {i["name"]: i for i in self.library.items(owner, "vector", model)} if model else {}
        if s.dataset is None:
            datasets = self.library.items(owner, "dataset")
            if datasets:
                self._restore_dataset(s, datasets[-1])

    @staticmethod
    def _model(handle) -> str | None:
        from .model.identity import model_fingerprint

        return model_fingerprint(handle) if handle is not None else None

    # ---------------------------------------------------------------- writing
    def keep_vector(self, s: Session, name: str, vector, handle) -> None:
        if not (self.on and s.owner):
            return
        data = native_bytes(vector)
        item = self.library.save(s.owner, "vector", name, data, {"method": vector.method, "layers": vector.layers},
                                 self._model(handle))
        s.stored[name] = item

    def keep_dataset(self, s: Session, path: Path, name: str) -> None:
        """Keep the dataset just loaded; an owner at the datasets quota gives up the oldest other one for it, in
        the same transaction (a save refused, by a limit or a full store, removes nothing)."""
        if not (self.on and s.owner):
            return
        self.library.save(s.owner, "dataset", name, Path(path).read_bytes(), {"file": name}, "any", make_way=True)

    def keep_settings(self, s: Session) -> None:
        if self.on and s.owner:
            self.library.save_settings(s.owner, {"lang": s.lang})

    # ---------------------------------------------------------------- reading
    def stored_vector(self, s: Session, name: str, handle):
        """``s``'s kept vector ``name``, read and checked once, then held in the session; None if it has none."""
        item = s.stored.get(name)
        if item is None:
            return None
        vector = self._read(self.library.data(item), name, handle)
        s.vectors[name] = vector
        return vector

    def _read(self, data: bytes, name: str, handle):
        from .formats import read_vector
        from .vector import file_detail

        with tempfile.TemporaryDirectory(dir=self._tmp) as folder:
            path = Path(folder) / "vector.safetensors"
            path.write_bytes(data)
            try:
                vector, _warnings = read_vector(path, handle, max_bytes=self.max_file_bytes)
            except (ValueError, OSError, KeyError, TypeError) as exc:
                raise UserError("import_failed", name=name[:80], detail=file_detail(exc)) from None
        vector.name = name
        return vector

    def _restore_dataset(self, s: Session, item: dict) -> None:
        from .data import load_dataset

        with tempfile.TemporaryDirectory(dir=self._tmp) as folder:
            path = Path(folder) / Path(item["name"]).name
            path.write_bytes(self.library.data(item))
            try:
                s.dataset, s.dataset_name = load_dataset(path, max_bytes=self.max_file_bytes), item["name"]
            except (ValueError, OSError, UnicodeDecodeError):  # kept under older rules: the session starts without
                s.dataset, s.dataset_name = None, ""

    # ---------------------------------------------------------------- sharing
    def share(self, s: Session, name: str) -> str:
        self._need_owner(s)
        if name not in s.stored:
            raise UserError("not_own_vector", name=name[:80])
        return self.library.share(s.owner, name)

    def unshare(self, s: Session, name: str) -> bool:
        self._need_owner(s)
        return self.library.unshare(s.owner, name)

    def share_id_of(self, s: Session, name: str) -> str:
        """The share id a link should carry for ``name`` in ``s``: its own share, or the one it was opened by."""
        if name in s.shared:
            return s.shared[name]
        item = s.stored.get(name)
        if item is not None and self.on:
            fresh = self.library.item(s.owner, "vector", name)
            return (fresh or {}).get("share_id") or ""
        return ""

    def open_shared(self, s: Session, share_id: Any, client: str | None, handle) -> str:
        """Add the vector shared under ``share_id`` to ``s`` (read-only); its name in the session's list."""
        if not self.on:
            raise UserError("unknown_id")
        item = self.library.shared(share_id, client)
        if item is None or item["model"] != self._model(handle):
            raise UserError("unknown_id")
        if s.owner is not None and item["owner"] == s.owner:  # the owner's own link: their own vector
            return item["name"]
        display = item["name"] + SHARED_SUFFIX
        if display not in s.vectors:
            s.vectors[display] = self._read(self.library.data(item), display, handle)
        s.shared[display] = item["share_id"]
        return display

    @staticmethod
    def _need_owner(s: Session) -> None:
        if s.owner is None:
            raise UserError("not_kept")

    # ---------------------------------------------------------------- results
    def save_result(self, s: Session, payload: dict, vector_name: str | None, handle, term_names=()) -> str:
        """Keep ``payload``; a kept or shared vector it was made with is kept with it (by content), so the result
        runs live for anyone even after its owner removes or unshares the vector.  ``term_names``: the other
        vectors it was steered with (several at once, issue #48), each kept the same way, by content, in an item
        of its own (an item keeps one blob) that the payload's ``term_vectors`` names: ``{name: item id}``."""
        self._need_owner(s)
        kept = {}
        for name in dict.fromkeys(term_names):
            uses = self._content_of(s, name) if name != vector_name else None
            if uses:
                kept[name] = self.library.save(s.owner, "result", self._result_name(), None,
                                               {"kind": TERM_VECTOR, "name": name}, self._model(handle),
                                               uses=uses)["item_id"]
        payload = {**payload, "term_vectors": kept} if kept else payload
        item = self.library.save(s.owner, "result", self._result_name(), None, payload, self._model(handle),
                                 uses=self._content_of(s, vector_name))
        return item["item_id"]

    def _content_of(self, s: Session, name: str | None) -> str | None:
        """The content id of a kept or shared vector of ``s`` named ``name``; None for a bundled or random one."""
        if name in s.stored:
            return s.stored[name]["content_id"]
        if name in s.shared:
            shared = self.library.shared(s.shared[name], None)
            return shared["content_id"] if shared else None
        return None

    @staticmethod
    def _result_name() -> str:
        # a name of its own: saving replaces an item of the same name, and "result N" counted by two saves at once
        # made one of two acknowledged results vanish (the SIGKILL test caught it)
        return f"result {time.strftime('%Y-%m-%d %H:%M:%S')} {secrets.token_hex(4)}"

    def result(self, result_id: Any, client: str | None) -> dict:
        if not self.on:
            raise UserError("unknown_id")
        item = self.library.result(result_id, client)
        if item is None:
            raise UserError("unknown_id")
        payload = json.loads(item["meta"])
        if payload.get("kind") == TERM_VECTOR:  # a result's added vector, nothing to show on its own
            raise UserError("unknown_id")
        payload["id"], payload["model_fingerprint"] = item["item_id"], item["model"]
        payload["has_vector"] = bool(item["content_id"])
        return payload

    def result_vector(self, result_id: Any, client: str | None, handle):
        """The vector a saved result was made with, when it was a kept or shared one (else None)."""
        item = self.library.result(result_id, client) if self.on else None
        if item is None or not item["content_id"]:
            return None
        meta = json.loads(item["meta"])  # an Explore view names its vector in "view", a comparison in "settings"
        name = (meta.get("view") or meta.get("settings") or {}).get("vector") or "vector"
        return self._read(self.library.data(item), name, handle)

    def result_term_vectors(self, result_id: Any, client: str | None, handle) -> dict:
        """The other vectors a saved result was steered with (:meth:`save_result`'s ``term_names``), read:
        ``{name as saved: vector}``."""
        item = self.library.result(result_id, client) if self.on else None
        kept = json.loads(item["meta"]).get("term_vectors") if item is not None else None
        out = {}
        for name, item_id in (kept if isinstance(kept, dict) else {}).items():
            term = self.library.result(item_id, client)
            if term is not None and term["content_id"] and term["owner"] == item["owner"]:
                out[name] = self._read(self.library.data(term), name, handle)
        return out

    # ------------------------------------------------------------------ listing
    def listed(self, handle) -> list[tuple[str, Any]]:
        """The host's listed vectors for the loaded model, read and checked: (name, vector)."""
        if not self.on:
            return []
        return [(i["name"], self._read(self.library.data(i), i["name"], handle))
                for i in self.library.items(None, "vector", self._model(handle))]
