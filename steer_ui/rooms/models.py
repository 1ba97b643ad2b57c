"""The shared model: loading and switching it, its facts, the default view's calibration at load, the host's
listed vectors, and the decode engine every session's generations join."""
from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pandas as pd

from .. import names
from ..messages import Said, UserError
from ..policy import DTYPES, WEIGHTS, device_allowed
from .common import RANDOM, Progress, Shared, expected_errors, first_line, noop

log = logging.getLogger(__name__)


class Models:
    """The one shared :class:`ModelHandle` (loaded, loading or failed) and what is made with each model."""

    def __init__(self, shared: Shared, handle=None, default_view: bool = False, vectors_dir: Path | None = None,
                 chat_template: str | None = None):
        self.shared = shared
        # The view a fresh page opens on (steer_ui.default_view), made at model load when asked for.
        self.want_default_view = default_view
        self.default_view = None
        self.bundled_vectors: "OrderedDict[str, Any]" = OrderedDict()
        self.published: list = []  # names of the host's listed vectors (app.py --vectors DIR, `library add`)
        self.publish_from: Path | None = vectors_dir  # app.py --vectors DIR: read at each model load
        self.chat_template = chat_template  # app.py --chat-template FILE's text, over the model's own
        self.current = handle  # None until a model is loaded
        self._load_error: str | None = None
        self._loading = threading.Event()
        self._loaded = threading.Event()
        if handle is not None:
            self._loaded.set()
        self._load_message = "" if handle is None else Said("progress_loaded", model=handle.model_id)
        self._load_fraction = 0.0 if handle is None else 1.0
        self._engine = None  # the decode batch every session's generations join (model/engine.py)
        self._slider = None
        self._engine_lock = threading.Lock()

    @property
    def handle(self):
        """The loaded model; waits for a load in progress (cold GGUF conversion can take a minute)."""
        if self.current is None and self._loading.is_set():
            self._loaded.wait(timeout=600)
        if self.current is None:
            if self._load_error:
                raise UserError("model_load_failed", detail=self._load_error)
            raise UserError("no_model")
        return self.current

    @property
    def ready(self) -> bool:
        return self.current is not None

    def status(self) -> dict:
        return {"ready": self.current is not None, "loading": self._loading.is_set() and not self._loaded.is_set(),
                "message": self._load_message, "error": self._load_error,
                "fraction": self._load_fraction,  # how far the load is, for the banner
                "model_id": self.current.model_id if self.current is not None else None}

    def switch(self, source: str | None, progress: Progress | None = None) -> dict:
        """A visitor's request to change the shared model: off unless the administrator allowed it, and then only
        to a source on the allow-list (so no request can name a host path, probe which paths exist, or start a
        download)."""
        policy = self.shared.policy
        if not policy.allow_model_switch:
            raise UserError("model_switch_off")
        source = str(source or "").strip()
        if source not in policy.model_sources:
            raise UserError("model_not_allowed", known=", ".join(policy.model_sources))
        # the device and dtype stay the administrator's: a visitor may not move the shared model to another
        # device or precision
        return self.load(source, policy.device, policy.dtype, progress, policy.weights)

    def load(self, source: str | None = None, device: str = "auto", dtype: str = "auto",
             progress: Progress | None = None, weights: str = "auto") -> dict:
        """Load and share a model: 'embedded' (default), a hub id, a local dir, a .gguf, or tiny:FAMILY.

        The administrator's path (command line, Python); visitors go through :meth:`switch`.
        """
        progress = progress or noop
        source = (source or "embedded").strip() or "embedded"
        if not device_allowed(device):
            raise UserError("bad_device", device=str(device)[:40])
        if (dtype or "auto") not in DTYPES:
            raise UserError("bad_dtype", dtype=str(dtype)[:40], known=", ".join(DTYPES))
        if (weights or "auto") not in ("auto",) + WEIGHTS:
            raise UserError("bad_weights", weights=str(weights)[:40], known=", ".join(("auto",) + WEIGHTS))
        self._loading.set()
        self._loaded.clear()
        self._load_error = None
        self._load_message, self._load_fraction = Said("progress_loading", model=source), 0.0
        try:
            handle = self._read(source, device, dtype, progress, weights)
            progress(0.9, Said("progress_residual_norms"))
            handle.layer_norms()
            self.bundled_vectors = OrderedDict()
            self.default_view = None
            if self.want_default_view:
                self._prepare_default_view(handle, progress)
            self._publish(handle)
            self.current = handle
            self._load_message, self._load_fraction = Said("progress_loaded", model=handle.model_id), 1.0
            return self.facts()
        except UserError as exc:  # kept by key, so the model line says it in each visitor's language
            self._load_error = exc.params.get("detail", Said(exc.key, **exc.params))
            self._load_message = Said(exc.key, **exc.params)
            raise
        finally:
            self._loaded.set()
            self._loading.clear()

    def _read(self, source: str, device: str, dtype: str, progress: Progress, weights: str):
        """The model named by ``source``; a loader's failure as one line."""
        if source.startswith("tiny:"):
            from ..tiny import tiny_handle

            try:
                return tiny_handle(source.split(":", 1)[1])
            except ValueError as exc:
                raise UserError("model_load_failed", detail=_load_detail(exc)) from None
        from ..model.loading import load_model

        def report(frac: float, msg: str) -> None:
            self._load_message, self._load_fraction = msg, frac
            progress(frac, msg)

        try:
            return load_model(source, device=device or "auto", dtype=dtype or "auto", progress=report,
                              weights=weights or "auto")
        except UserError:
            raise
        except expected_errors() + (OSError, RuntimeError) as exc:
            raise UserError("model_load_failed", detail=_load_detail(exc)) from None

    def _prepare_default_view(self, handle, progress: Progress) -> None:
        """Train and calibrate (or read from the cache) the default vector; a failure leaves the app usable."""
        from ..default_view import load_or_calibrate

        def report(frac: float, msg: str) -> None:
            self._load_message, self._load_fraction = msg, 0.9 + 0.1 * frac
            progress(0.9 + 0.1 * frac, msg)

        try:
            view, vector = load_or_calibrate(handle, report)
        except Exception as exc:  # never worth refusing the whole model over
            log.warning("no default vector: %s", first_line(exc))
            return
        self.bundled_vectors[view.name] = vector
        self.default_view = view

    def _publish(self, handle) -> None:
        """The host's listed vectors (``--vectors DIR`` and the library's listed ones), read and checked like an
        import; each joins every visitor's list, read-only.  A file that cannot be used is skipped and logged."""
        from ..formats import read_vector

        self.published = []
        listed = list(self.shared.keeper.listed(handle))
        folder = self.publish_from
        for path in sorted(folder.iterdir()) if folder is not None and folder.is_dir() else []:
            try:
                vector, _warnings = read_vector(path, handle, max_bytes=self.shared.max_file_bytes)
            except (ValueError, OSError, KeyError, TypeError) as exc:
                log.warning("--vectors: %s skipped: %s", path.name, first_line(exc))
                continue
            listed.append((vector.name or path.stem, vector))
        for name, vector in listed:
            name = re.sub(r"\s+", " ", str(name)).strip()[:200] or "listed vector"
            if names.first_hidden(name) is not None:
                log.warning("listed vector '%s' skipped: its name holds a hidden character", names.escaped(name))
                continue
            if name not in self.bundled_vectors and name != RANDOM:
                self.bundled_vectors[name] = vector
                self.published.append(name)

    def load_in_background(self, source: str | None = None, device: str = "auto", dtype: str = "auto",
                           weights: str = "auto") -> threading.Thread:
        """Start loading now and return at once; model calls wait for it (see :attr:`handle`)."""
        self._loading.set()
        self._loaded.clear()

        def run():
            try:
                self.load(source, device, dtype, weights=weights)
            except UserError as exc:
                log.error("model load failed: %s", exc)
            except Exception:  # never let the thread die silently; its own words are for the log
                self._load_error = Said("model_error_unexpected")
                self._loaded.set()
                log.exception("model load failed")

        thread = threading.Thread(target=run, name="steer_ui-load", daemon=True)
        thread.start()
        return thread

    def chat_prompt(self, messages) -> str:
        """``messages`` rendered through the chat template (steer_ui/chat.py), within the prompt's token bound; a
        conversation over it is told how many of its earliest turns to drop to fit."""
        from .. import chat

        handle = self.handle
        messages = chat.checked(messages)
        text = chat.render(handle, messages, self.chat_template)
        limit = self.shared.policy.max_prompt_tokens
        tokens = len(handle.tokenizer(text).input_ids)
        if tokens > limit:
            system = 1 if messages[0]["role"] == "system" else 0
            drop = next((k for k in range(1, len(messages) - system)
                         if len(handle.tokenizer(chat.render(handle, messages[:system] + messages[system + k:],
                                                             self.chat_template)).input_ids) <= limit), None)
            if drop is None:
                raise UserError("too_many_tokens", what="message", tokens=tokens, limit=limit)
            raise UserError("chat_too_long", tokens=tokens, limit=limit, drop=drop)
        return text

    def facts(self) -> dict:
        facts = dict(self.handle.facts())
        facts["source"] = self.handle.source
        from ..model import static_decode

        path, reason = static_decode.decide(self.handle)
        facts["decode"] = {"path": path, "reason": reason}  # issue #20: say which decode path generation takes
        return facts

    def layer_norm_frame(self) -> pd.DataFrame:
        norms = self.handle.layer_norms()
        return pd.DataFrame({"layer": list(range(len(norms))), "norm": norms})

    # ------------------------------------------------------------ engine
    def engine(self):
        """The request batcher on the current model (a new one after a model switch; the old one drains)."""
        from ..model.engine import Engine
        from ..model.slider_batch import SliderBatcher

        handle = self.handle
        with self._engine_lock:
            if handle is not self.current:  # the model changed while we waited: use the current one's engine
                handle = self.current
            if self._engine is None or self._engine.handle is not handle:
                if self._engine is not None:
                    self._engine.close()
                p = self.shared.policy
                self._engine = Engine(handle, max_requests=p.batch_requests, max_waiting=p.waiting_generations,
                                      timeout_seconds=p.generation_seconds)
                self._slider = SliderBatcher(handle)  # concurrent slider moves on one view share a pass
            return self._engine

    def engine_load(self) -> dict:
        """Generations running in the decode batch and waiting for it (no engine yet: none of either)."""
        engine = self._engine
        return engine.load if engine is not None else {"running": 0, "waiting": 0, "rows": 0}

    def explore_workers(self):
        """(engine, slider batcher) of the current model, made together."""
        engine = self.engine()
        with self._engine_lock:
            return engine, self._slider


def _load_detail(exc: BaseException) -> Said:
    """Why a load failed, by key: the loader's own refusal (what to do about it), or, for another library's error
    (torch's, transformers' own words), a plain line in every language, the words themselves logged."""
    if getattr(exc, "key", None):
        return Said(exc.key, **exc.params)
    log.warning("model load failed: %s", first_line(exc))
    return Said("model_error_unexpected")
