"""The only door: everything the app does, reachable from Python without gradio.

The UI, the HTTP API (through the UI's named events) and the CLI call these
functions; validation and limits live here once.  :class:`Service` holds the one shared :class:`ModelHandle` and a small store
of per-session things (uploaded data, trained and imported vectors, the last
generation).  The UI is a thin layer that passes ``request.session_hash`` as
``session`` and turns :class:`UserError` into ``gr.Error``.

Rules kept here so the UI cannot forget them:

* steering hooks act only in the thread that installed them, so sessions
  running the model at once never see each other's steering; long jobs
  (training, probing, detection) take ``handle.lock`` one at a time, and
  generation and the slider never wait for them;
* a failed action raises :class:`UserError` with a plain message and leaves the
  session's data and vectors as they were;
* generation joins one decode batch shared by every session (the engine in
  :mod:`steer_ui.model.engine`); a browser that disconnects mid-stream frees
  its rows at the next step.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import re
import tempfile
import uuid
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

from .jobs import job
from .keeping import Keeper
from .lessons import Lessons
from .messages import UserError, normalise_lang
from .paths import cache_root, prune
from . import admission, guards, names
from .guards import Guard
from .limits import MAX_DELTA_LOGIT_LIMIT
from .model.cpu_threads import hand_back_after_calls
from .policy import DTYPES, WEIGHTS, Policy, device_allowed
from .sessions import Session, Sessions, frame_bytes, vector_bytes
from .store.library import PUBLIC_ID
from .steering import steering_kind

log = logging.getLogger(__name__)

RANDOM = "random direction"
LAST_COMPARISON = "last_comparison"  # Session.cache key: the last Many prompts comparison, for Save result
FORMATS = ("native", "gguf", "steering-vectors", "neuronpedia", "caa")
DATASETS_DIR = Path(__file__).resolve().parents[1] / "assets" / "datasets"
DATASET_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
DEFAULT_MAX_FILE_BYTES = 50 * 1024 * 1024
Progress = Callable[[float, str], None]


def _noop(_f: float, _m: str = "") -> None:
    pass


MAX_VOCAB_TOP_K = 1 << 20  # no vocabulary is larger; a bigger top-k is a mistake or an attack
MAX_TARGET_CHARS = 200  # a sweep's target token, typed as text (only its first token counts)
MAX_TEMPERATURE = 100.0  # far past uniform sampling already
MAX_REPETITION_PENALTY = 100.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _dataset_refusal(name: str, exc: BaseException) -> UserError:
    """A dataset the readers refused, as one line: in its own message (translated) when the reader named one
    (a cell over the character gate), else "could not be used" with the reader's detail."""
    key = getattr(exc, "key", None)
    if key:
        return UserError(key, **exc.params)
    return UserError("dataset_invalid", name=name, detail=_first_line(exc))


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Exception types whose message is already written for a user (core and method modules).

    Every one of them is a ValueError except the loader's, so the tuple stays short.
    """
    from .model.loading import ModelLoadError

    return (ValueError, ModelLoadError, FileNotFoundError)


@dataclass
class Frame:
    """One snapshot of a streamed side-by-side generation (copied, so the worker may go on)."""

    prompt: str
    unsteered_text: str
    steered_text: str
    unsteered_tokens: list
    steered_tokens: list
    done: bool
    steps: int

    def token_frame(self) -> pd.DataFrame:
        """Per steered token: position, token, logprob, Δlogit (actual and direct), top alternatives; with a
        Δlogit limit also the step's max centred |Δlogit| before it and the share of the change kept."""
        tokens = self.steered_tokens
        frame = pd.DataFrame({
            "position": list(range(len(tokens))),
            "token": [t.token for t in tokens],
            "logprob": [t.logprob for t in tokens],
            "delta_logit": [t.delta_logit for t in tokens],
            "direct_delta_logit": [t.direct_delta_logit for t in tokens],
            "alternatives": [", ".join(f"{a!r} {p:.2f}" for a, p in t.alternatives[:5]) for t in tokens],
        })
        if any(t.max_delta_logit is not None for t in tokens):
            frame.insert(5, "max_delta_logit_before_limit", [t.max_delta_logit for t in tokens])
            frame.insert(6, "change_kept", [t.kept for t in tokens])
        return frame

    def as_dict(self) -> dict:
        return {"prompt": self.prompt, "done": self.done, "steps": self.steps,
                "unsteered": {"text": self.unsteered_text, "tokens": [t.as_dict() for t in self.unsteered_tokens]},
                "steered": {"text": self.steered_text, "tokens": [t.as_dict() for t in self.steered_tokens]}}


@hand_back_after_calls  # a request thread that has computed hands its OpenMP helpers back (model/cpu_threads.py)
class Service:
    """The shared model, per-session stores, and one method per app feature."""

    def __init__(self, handle=None, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, workdir: str | Path | None = None,
                 policy: Policy | None = None, default_view: bool = False, library=None):
        self.policy = policy or Policy()
        # The view a fresh page opens on (steer_ui.default_view), made at model load when asked for.
        self.want_default_view = default_view
        self.default_view = None
        self.bundled_vectors: "OrderedDict[str, Any]" = OrderedDict()
        self._handle = handle
        self._load_error: str | None = None
        self._loading = threading.Event()
        self._loaded = threading.Event()
        if handle is not None:
            self._loaded.set()
        self._load_message = "" if handle is None else f"loaded {handle.model_id}"
        self._load_fraction = 0.0 if handle is None else 1.0
        self.sessions = Sessions(self.policy)
        self.guard = Guard(self.policy)
        self.lessons = Lessons(self)  # the Concepts tab's lessons, bounded and run as jobs
        self._engine = None  # the decode batch every session's generations join (model/engine.py)
        self._slider = None
        self._engine_lock = threading.Lock()
        self.max_file_bytes = int(max_file_bytes)
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="steer_ui-"))
        self.keeper = Keeper(library, self.max_file_bytes)  # owners' work in the library (off without one)
        self.published: list = []  # names of the host's listed vectors (app.py --vectors DIR, `library add`)
        self.publish_from: Path | None = None  # app.py --vectors DIR: read at each model load

    # ================================================================ model
    @property
    def handle(self):
        """The loaded model; waits for a load in progress (cold GGUF conversion can take a minute)."""
        if self._handle is None and self._loading.is_set():
            self._loaded.wait(timeout=600)
        if self._handle is None:
            if self._load_error:
                raise UserError("model_load_failed", detail=self._load_error)
            raise UserError("no_model")
        return self._handle

    @property
    def model_ready(self) -> bool:
        return self._handle is not None

    def model_status(self) -> dict:
        return {"ready": self._handle is not None, "loading": self._loading.is_set() and not self._loaded.is_set(),
                "message": self._load_message, "error": self._load_error,
                "fraction": self._load_fraction,  # how far the load is, for the banner
                "model_id": self._handle.model_id if self._handle is not None else None}

    def switch_model(self, source: str | None, device: str = "auto", dtype: str = "auto",
                     progress: Progress | None = None) -> dict:
        """A visitor's request to change the shared model: off unless the administrator allowed it, and then only
        to a source on the allow-list (so no request can name a host path, probe which paths exist, or start a
        download)."""
        if not self.policy.allow_model_switch:
            raise UserError("model_switch_off")
        source = str(source or "").strip()
        if source not in self.policy.model_sources:
            raise UserError("model_not_allowed", known=", ".join(self.policy.model_sources))
        # the device and dtype stay the administrator's: a visitor may not move the shared model to another
        # device or precision
        return self.load_model(source, self.policy.device, self.policy.dtype, progress, self.policy.weights)

    def load_model(self, source: str | None = None, device: str = "auto", dtype: str = "auto",
                   progress: Progress | None = None, weights: str = "auto") -> dict:
        """Load and share a model: 'embedded' (default), a hub id, a local dir, a .gguf, or tiny:FAMILY.

        The administrator's path (command line, Python); visitors go through :meth:`switch_model`.
        """
        progress = progress or _noop
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
        self._load_message, self._load_fraction = f"loading {source}", 0.0
        try:
            if source.startswith("tiny:"):
                from .tiny import tiny_handle

                try:
                    handle = tiny_handle(source.split(":", 1)[1])
                except ValueError as exc:
                    raise UserError("model_load_failed", detail=_first_line(exc)) from None
            else:
                from .model.loading import load_model

                def report(frac: float, msg: str) -> None:
                    self._load_message, self._load_fraction = msg, frac
                    progress(frac, msg)

                try:
                    handle = load_model(source, device=device or "auto", dtype=dtype or "auto", progress=report,
                                        weights=weights or "auto")
                except UserError:
                    raise
                except _expected_errors() + (OSError, RuntimeError) as exc:
                    raise UserError("model_load_failed", detail=_first_line(exc)) from None
            progress(0.9, "measuring residual norms")
            handle.layer_norms()
            self.bundled_vectors = OrderedDict()
            self.default_view = None
            if self.want_default_view:
                self._prepare_default_view(handle, progress)
            self._publish(handle)
            self._handle = handle
            self._load_message, self._load_fraction = f"loaded {handle.model_id}", 1.0
            return self.model_facts()
        except UserError as exc:
            self._load_error = exc.params.get("detail", str(exc))
            self._load_message = str(exc)
            raise
        finally:
            self._loaded.set()
            self._loading.clear()

    def _prepare_default_view(self, handle, progress: Progress) -> None:
        """Train and calibrate (or read from the cache) the default vector; a failure leaves the app usable."""
        from .default_view import load_or_calibrate

        def report(frac: float, msg: str) -> None:
            self._load_message, self._load_fraction = msg, 0.9 + 0.1 * frac
            progress(0.9 + 0.1 * frac, msg)

        try:
            view, vector = load_or_calibrate(handle, report)
        except Exception as exc:  # never worth refusing the whole model over
            log.warning("no default vector: %s", _first_line(exc))
            return
        self.bundled_vectors[view.name] = vector
        self.default_view = view

    def _publish(self, handle) -> None:
        """The host's listed vectors (``--vectors DIR`` and the library's listed ones), read and checked like an
        import; each joins every visitor's list, read-only.  A file that cannot be used is skipped and logged."""
        from .formats import read_vector

        self.published = []
        listed = list(self.keeper.listed(handle))
        folder = self.publish_from
        for path in sorted(folder.iterdir()) if folder is not None and folder.is_dir() else []:
            try:
                vector, _warnings = read_vector(path, handle, max_bytes=self.max_file_bytes)
            except (ValueError, OSError, KeyError, TypeError) as exc:
                log.warning("--vectors: %s skipped: %s", path.name, _first_line(exc))
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
                self.load_model(source, device, dtype, weights=weights)
            except UserError as exc:
                log.error("model load failed: %s", exc)
            except Exception as exc:  # never let the thread die silently
                self._load_error = _first_line(exc)
                self._loaded.set()
                log.exception("model load failed")

        thread = threading.Thread(target=run, name="steer_ui-load", daemon=True)
        thread.start()
        return thread

    def model_facts(self) -> dict:
        facts = dict(self.handle.facts())
        facts["source"] = self.handle.source
        from .model import static_decode

        path, reason = static_decode.decide(self.handle)
        facts["decode"] = {"path": path, "reason": reason}  # issue #20: say which decode path generation takes
        return facts

    def layer_norm_frame(self) -> pd.DataFrame:
        norms = self.handle.layer_norms()
        return pd.DataFrame({"layer": list(range(len(norms))), "norm": norms})

    # ============================================================= sessions
    def session(self, session: str | None, client: str | None = None) -> Session:
        """The store of session ``session``; ``None`` gets a fresh one that is not kept (an anonymous call).

        ``client``, the caller's address where known, is what new sessions are admitted by; see
        :mod:`steer_ui.sessions` for who may get a new one and what is never evicted.
        """
        s = self.sessions.get(session, client)
        if s.owner is None and self.keeper.on and session is not None:
            token = self.sessions.token_of(session)
            if token:  # a tab whose session was let go comes back to its owner's work
                self.keeper.claim(s, token, self._handle, issue=False)
        return s

    def set_language(self, session: str | None, lang: str) -> str:
        s = self.session(session)
        s.lang = normalise_lang(lang)
        self.keeper.keep_settings(s)
        return s.lang

    # ================================================================ owners
    def claim_owner(self, session: str | None, token=None, client: str | None = None, issue: bool = True) -> str:
        """Bind the session to the owner of ``token`` (a browser's or an API client's), issuing a new owner when
        the token is not one this server issued (unless ``issue`` is False: an API client's header that names no
        owner leaves the session unkept); returns the token to keep ("" when nothing is kept)."""
        return self.keeper.claim(self.session(session, client), token, self._handle, issue)

    @property
    def browser_secret(self) -> str:
        """What the page's local storage keys the owner token with: the library's, the same in every process."""
        if self.keeper.on:
            return self.keeper.library.browser_secret
        return self.__dict__.setdefault("_browser_secret", uuid.uuid4().hex)

    def whoami(self, session: str | None) -> str:
        """The session's owner token, a new owner if it has none (API clients send it back as X-Steer-Owner)."""
        s = self.session(session)
        return s.owner_token or self.claim_owner(session, None)

    @property
    def keeps_work(self) -> bool:
        return self.keeper.on

    def kept(self, session: str | None) -> bool:
        """Whether the session's work outlives it (this server has a library and the session an owner)."""
        s = self.sessions.peek(session)
        return self.keeper.on and s is not None and s.owner is not None

    def share_vector(self, session: str | None, name: str) -> str:
        """Share the session's own kept vector ``name``: its unguessable share id (the same one each time)."""
        return self.keeper.share(self.session(session), guards.text(name, "vector", 200))

    def unshare_vector(self, session: str | None, name: str) -> bool:
        return self.keeper.unshare(self.session(session), guards.text(name, "vector", 200))

    def open_shared(self, session: str | None, share_id, client: str | None = None) -> str:
        """Add the vector shared under ``share_id`` to the session, read-only; its name in the session's list."""
        return self.keeper.open_shared(self.session(session), share_id, client, self.handle)

    def share_id_of(self, session: str | None, name: str | None) -> str:
        return self.keeper.share_id_of(self.session(session), name) if name else ""

    def vectors(self, session: str | None) -> list[dict]:
        """What this session can use, each with where it comes from (own / shared / listed / bundled / random)."""
        s = self.session(session)
        own = list(dict.fromkeys([n for n in s.vectors if n not in s.shared] + list(s.stored)))
        rows = [{"name": RANDOM, "kind": "random"}]
        rows += [{"name": n, "kind": "listed" if n in self.published else "bundled"} for n in self.bundled_vectors]
        rows += [{"name": n, "kind": "own", "share_id": self.keeper.share_id_of(s, n) or None} for n in own]
        rows += [{"name": n, "kind": "shared", "share_id": i} for n, i in s.shared.items()]
        return rows

    def save_result(self, session: str | None, view: dict) -> str:
        """Freeze the session's last Explore view (``view``: its settings and next-token numbers) with its last
        generation; its id opens it for anyone, without running the model."""
        s = self.session(session)
        if not s.last_generation:
            raise UserError("no_generation")
        payload = {"view": view, "generation": s.last_generation, "model_id": self.handle.model_id,
                   "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        text = json.dumps(payload)
        if len(text) > self.policy.max_result_chars:
            raise UserError("text_too_long", what="result", size=len(text), limit=self.policy.max_result_chars)
        return self.keeper.save_result(s, payload, view.get("vector"), self.handle)

    def save_comparison(self, session: str | None) -> str:
        """Freeze the session's last *Many prompts* comparison (its settings, every row and the summary); its id
        opens the whole table for anyone, without running the model."""
        s = self.session(session)
        last = s.cache.get(LAST_COMPARISON)
        if not last:
            raise UserError("no_comparison")
        payload = {"kind": "comparison", "comparison": last["comparison"], "settings": last["settings"],
                   "model_id": self.handle.model_id,
                   "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        text = json.dumps(payload)
        if len(text) > self.policy.max_result_chars:
            raise UserError("text_too_long", what="result", size=len(text), limit=self.policy.max_result_chars)
        return self.keeper.save_result(s, payload, last["settings"].get("vector"), self.handle)

    def open_result_vector(self, session: str | None, result_id, client: str | None = None) -> str | None:
        """Put the vector a saved result was made with into the session (read-only, as a shared one is), so the
        result can run live; its name there, or None when the result used a bundled or random vector."""
        vector = self.keeper.result_vector(result_id, client, self.handle)
        if vector is None:
            return None
        s = self.session(session)
        name = f"{vector.name} (saved result)"
        s.vectors.setdefault(name, vector)
        return name

    def result(self, result_id, client: str | None = None) -> dict:
        """A saved result as it was saved, read without running the model."""
        return self.keeper.result(result_id, client)

    def language(self, session: str | None) -> str:
        """The session's language; asking makes no session (an error for a refused newcomer is told in English)."""
        s = self.sessions.peek(session)
        return s.lang if s is not None else "en"

    # =============================================================== vectors
    def vector_names(self, session: str | None) -> list[str]:
        """Every vector this session can use: the random direction, the server's bundled and listed ones, its own
        (kept in the library too), and those opened by a share link."""
        return [row["name"] for row in self.vectors(session)]

    def add_vector(self, session: str | None, vector, name: str | None = None, report: dict | None = None) -> str:
        s = self.session(session)
        if len(s.vectors) >= self.policy.max_vectors_per_session:
            raise UserError("too_many_vectors", limit=self.policy.max_vectors_per_session)
        self.sessions.check_bytes(s, vector_bytes(vector))
        base = name or vector.name or vector.method
        base = names.checked(re.sub(r"\s+", " ", str(base)).strip() or "vector")  # listed as it is, one line
        if base == RANDOM or base in self.bundled_vectors:
            base = f"{base} (saved)"
        unique, n = base, 2
        while unique in s.vectors or unique in s.stored or unique in self.bundled_vectors:
            unique, n = f"{base} ({n})", n + 1
        if not vector.name:
            vector.name = unique
        self.keeper.keep_vector(s, unique, vector, self._handle)  # first: a refused save changes nothing
        s.vectors[unique] = vector
        if report is not None:
            s.reports[unique] = report
        return unique

    def get_vector(self, session: str | None, name: str | None, layer: int | None = None, seed: int = 0):
        """The session's vector ``name``, or a seeded random direction at ``layer`` for :data:`RANDOM`."""
        from .vector import random_vector

        if not name or name == RANDOM:
            handle = self.handle
            layer = self.guard.layer(handle, layer if layer is not None else handle.arch.num_layers // 2)
            return random_vector(handle.arch.hidden_size, layer, seed=self.guard.seed(seed), model_id=handle.model_id,
                                 model_type=handle.model_type)
        s = self.session(session)
        if name in s.vectors:
            return s.vectors[name]
        if name in self.bundled_vectors:  # shared and read-only: nothing a session does changes them
            return self.bundled_vectors[name]
        kept = self.keeper.stored_vector(s, name, self.handle) if isinstance(name, str) else None
        if kept is not None:
            return kept
        if self.keeper.on and isinstance(name, str) and PUBLIC_ID.match(name):  # every endpoint takes a share id
            return self.get_vector(session, self.open_shared(session, name, s.client))  # its name in the session
        raise UserError("unknown_vector", name=str(name)[:80], known=", ".join(self.vector_names(session)[1:]) or
                        "none")

    def vector_info(self, session: str | None, name: str | None) -> dict:
        """Metadata of a vector (layers, method, recommended α range, metrics) for the pickers."""
        if not name or name == RANDOM:
            handle = self.handle
            return {"name": RANDOM, "method": "random", "layers": [handle.arch.num_layers // 2],
                    "alpha_range": None, "input_dependent": False}
        vector = self.get_vector(session, name)
        meta = vector.metadata()
        meta["input_dependent"] = steering_kind(vector) == "input"
        meta["steering"] = steering_kind(vector)
        return meta

    def _vector_layer(self, vector, layer) -> int | None:
        """Single-layer vectors move to the chosen layer; multi-layer and input-dependent ones keep theirs."""
        if layer is None or steering_kind(vector) != "static" or len(vector.layers) > 1:
            return None
        return int(layer)

    def steers(self, session: str | None, vector_name: str | None, layer: int | None, alpha: float,
               relative: bool = True, seed: int = 0, positions: str | None = None) -> list:
        """Hook specs for the chosen vector, layer and α (raw or relative units)."""
        from .steering import build_steers

        handle = self.handle
        if layer is not None:
            layer = self.guard.layer(handle, layer)
        vector = self.get_vector(session, vector_name, layer, seed)
        alpha = self.guard.alpha(alpha)
        try:
            steers = build_steers(handle, vector, alpha, layer=self._vector_layer(vector, layer),
                                  relative=guards.flag(relative, "relative"), positions=positions)
        except UserError:
            raise
        except _expected_errors() as exc:
            raise UserError("steering_failed", detail=_first_line(exc)) from None
        self.guard.pushes(handle, steers)
        return steers

    # =============================================================== explore
    def next_token(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None, alpha: float,
                   relative: bool = True, seed: int = 0, top_k: int = 10):
        """Top-k next tokens unsteered vs steered, KL, entropies, Δlogit extremes (analysis fast path)."""
        needed = self.guard.prompt(self.handle, prompt, rows=2)  # the unsteered and the steered row
        top_k = self.guard.number(top_k, "top_k", integer=True, low=1, high=self.policy.max_top_k)
        steers = self.steers(session, vector_name, layer, alpha, relative, seed)
        try:
            engine, slider = self._explore_workers()
            # the decode batch pauses between steps for a slider move
            with self.guard.reserve(needed), engine.interactive():
                return slider.next_token(prompt, steers, top_k=top_k)
        except _expected_errors() as exc:
            raise UserError("explore_failed", detail=_first_line(exc)) from None

    def calibrated_alpha_max(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None,
                             seed: int = 0) -> float:
        """Relative α where the next-token KL on ``prompt`` reaches ~5 nats for this vector at ``layer``.

        The slider then spans from no effect to strong-but-readable; one batched
        sweep of the fast path (a fraction of a second).  Vectors that do not
        steer with one fixed direction keep their own recommended range.
        """
        from .default_view import GRID, KL_AT_MAX, alpha_at_kl
        from .model.analysis import mean_kl_curve

        handle = self.handle
        layer = self.guard.layer(handle, layer if layer is not None else handle.arch.num_layers // 2)
        vector = self.get_vector(session, vector_name, layer, seed)
        needed = 0
        try:  # one row per α of the grid
            needed = self.guard.prompt(handle, prompt, rows=len(GRID))
            calibrate = steering_kind(vector) == "static" and (len(vector.layers) == 1 or layer in vector.layers)
        except UserError as exc:
            if exc.key != "request_too_large":
                raise
            calibrate = False  # a long prompt: the vector's own range, rather than a sweep over budget
        if not calibrate:
            rng = vector.alpha_range
            return float(max(abs(rng[0]), abs(rng[1]))) if rng else 1.0
        direction = vector.direction(layer if layer in vector.directions else None)
        try:
            with self.guard.reserve(needed):
                kl = mean_kl_curve(handle, direction, layer, GRID, (prompt,))
        except _expected_errors() as exc:
            raise UserError("explore_failed", detail=_first_line(exc)) from None
        return round(alpha_at_kl(GRID, kl, KL_AT_MAX), 4)

    def vocab_projection(self, session: str | None, vector_name: str | None, layer: int | None, seed: int = 0,
                         top_k: int = 12) -> pd.DataFrame:
        from .model.analysis import vocab_projection

        handle = self.handle
        vector = self.get_vector(session, vector_name, layer, seed)
        if steering_kind(vector) == "input":
            raise UserError("input_dependent_projection")
        direction = vector.direction(layer if layer in vector.directions else None)
        return vocab_projection(handle, direction, top_k=top_k)

    def sampling(self, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int = 0, greedy: bool | None = None,
                 max_delta_logit: float = 0.0):
        from .model.generation import GenerationError, Sampling

        number = self.guard.number
        s = Sampling(max_new_tokens=number(max_new_tokens, "max_new_tokens", integer=True, low=1,
                                           high=self.policy.max_new_tokens),
                     temperature=0.0 if guards.flag(greedy or False, "greedy") else
                     number(temperature, "temperature", low=0, high=MAX_TEMPERATURE),
                     top_k=number(top_k or 0, "top_k", integer=True, low=0, high=MAX_VOCAB_TOP_K),
                     top_p=number(top_p, "top_p", low=0, high=1),
                     repetition_penalty=number(repetition_penalty, "repetition_penalty", low=0,
                                               high=MAX_REPETITION_PENALTY),
                     seed=self.guard.seed(seed),
                     max_delta_logit=number(max_delta_logit or 0.0, "max_delta_logit", low=0,
                                            high=MAX_DELTA_LOGIT_LIMIT))
        try:
            s.validate()  # the open ends: top-p and the repetition penalty above 0
        except GenerationError as exc:
            raise UserError("bad_sampling", detail=_first_line(exc)) from None
        return s

    def delta_limit(self, session: str | None, vector_name: str | None, requested=None) -> float:
        """The Δlogit limit a generation steers under: ``requested`` where given (0 = off), else the vector's own
        bound (a constrained TSV vector states the one it was calibrated to), else off.

        ``requested`` is checked with the other sampling values (:meth:`sampling`); ``None`` or ``""`` is "not
        given" (an empty field, or a client that sends the arguments from before the limit existed).
        """
        if requested is not None and requested != "":
            return requested
        if not vector_name or vector_name == RANDOM:
            return 0.0
        own = self.get_vector(session, vector_name).max_delta_logit
        return own if own is not None else 0.0

    def engine(self):
        """The request batcher on the current model (a new one after a model switch; the old one drains)."""
        from .model.engine import Engine
        from .model.slider_batch import SliderBatcher

        handle = self.handle
        with self._engine_lock:
            if handle is not self._handle:  # the model changed while we waited: use the current one's engine
                handle = self._handle
            if self._engine is None or self._engine.handle is not handle:
                if self._engine is not None:
                    self._engine.close()
                p = self.policy
                self._engine = Engine(handle, max_requests=p.batch_requests, max_waiting=p.waiting_generations,
                                      timeout_seconds=p.generation_seconds)
                self._slider = SliderBatcher(handle)  # concurrent slider moves on one view share a pass
            return self._engine

    def engine_load(self) -> dict:
        """Generations running in the decode batch and waiting for it (no engine yet: none of either)."""
        engine = self._engine
        return engine.load if engine is not None else {"running": 0, "waiting": 0}

    def _explore_workers(self):
        """(engine, slider batcher) of the current model, made together."""
        engine = self.engine()
        with self._engine_lock:
            return engine, self._slider

    def stream_generate(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None,
                        alpha: float, relative: bool = True, seed: int = 0, sampling=None) -> Iterator[Frame]:
        """Unsteered and steered continuations, yielded as snapshots while they decode.

        The request joins the engine's decode batch beside every other
        session's generations (each gets exactly what it would get alone).
        This generator yields the newest snapshot whenever the consumer asks
        (intermediate ones are skipped if the consumer is slower than the
        model); closing it early drops the request's rows at the next step.
        A session has at most ``policy.generations_per_session`` at once.
        """
        from .model.engine import EngineBusy
        from .model.generation import Request

        sampling = sampling or self.sampling()
        # three rows (unsteered, steered, counterfactual) over the prompt and every new token
        needed = self.guard.prompt(self.handle, prompt, rows=3, new_tokens=sampling.max_new_tokens)
        steers = self.steers(session, vector_name, layer, alpha, relative, seed)
        engine = self.engine()
        try:
            request = Request.make(engine.handle, prompt, steers, sampling)
        except _expected_errors() as exc:
            raise UserError("generation_failed", detail=_first_line(exc)) from None
        s = self.session(session)
        # the KV cache is what a generation keeps while it decodes; its prefill's scratch is bounded per request,
        # and the decode batch holds at most policy.batch_requests of them
        with self.sessions.generation_slot(s), self.guard.reserve(needed.kv):
            try:
                ticket = engine.submit(request)
            except EngineBusy as exc:
                raise UserError("busy", detail=_first_line(exc)) from None
            settings = {"prompt": prompt, "vector": vector_name or RANDOM, "layer": layer, "alpha": alpha,
                        "relative": relative, "seed": seed, "sampling": dataclasses.asdict(sampling)}
            yield from self._frames(s, prompt, ticket, settings)

    @staticmethod
    def _frames(s: Session, prompt: str, ticket, settings: dict | None = None) -> Iterator[Frame]:
        """A ticket's events as frames (the newest each time), then the final one; errors as one line each."""
        from .model.engine import EngineBusy, EngineTimeout

        def frame(result, done: bool) -> Frame:
            return Frame(prompt=prompt, unsteered_text=result.unsteered.text, steered_text=result.steered.text,
                         unsteered_tokens=list(result.unsteered.tokens), steered_tokens=list(result.steered.tokens),
                         done=done, steps=result.steps)

        last = None
        try:
            for event in ticket.newest():
                last = event.result
                yield frame(last, False)
        except EngineTimeout as exc:
            raise UserError("generation_timeout", detail=_first_line(exc)) from None
        except EngineBusy as exc:  # the model was replaced while this request waited
            raise UserError("busy", detail=_first_line(exc)) from None
        except Exception as exc:  # noqa: BLE001 - whatever the engine met for this request, in one line
            raise UserError("generation_failed", detail=_first_line(exc)) from None
        finally:
            ticket.cancel()
        if last is not None:
            final = frame(last, True)
            s.last_generation = {**final.as_dict(), "settings": settings or {}}  # what Save result keeps
            yield final

    def generate(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None, alpha: float,
                 relative: bool = True, seed: int = 0, sampling=None) -> Frame:
        frame = None
        for frame in self.stream_generate(session, prompt, vector_name, layer, alpha, relative, seed, sampling):
            pass
        return frame

    def sweep(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None,
              alpha_max: float = 1.0, relative: bool = True, seed: int = 0, points: int = 21,
              target: str | None = None) -> pd.DataFrame:
        """Dose-response over α in [-alpha_max, alpha_max] (user units) from one batched pass."""
        from .model.analysis import sweep
        from .model.hooks import Steer

        points = self.guard.number(points, "points", integer=True, low=3, high=self.policy.max_sweep_points)
        alpha_max = abs(self.guard.alpha(alpha_max, "alpha_max"))
        if alpha_max == 0:
            raise UserError("number_not_positive", what="alpha_max", value="0")
        needed = self.guard.prompt(self.handle, prompt, rows=points)  # one row per α
        target = guards.text(target, "target", MAX_TARGET_CHARS, allow_empty=True).strip() or None
        unit = self.steers(session, vector_name, layer, 1.0, relative, seed)
        if len(unit) != 1 or not isinstance(unit[0], Steer) or unit[0].vector is None:
            raise UserError("sweep_unsupported")
        steer = unit[0]
        scale = float(steer.alpha.reshape(-1)[0])
        alphas = [alpha_max * (2 * i / (points - 1) - 1) for i in range(points)]
        handle = self.handle
        try:
            with self.guard.reserve(needed):
                frame = sweep(handle, prompt, steer.vector, steer.layer, [a * scale for a in alphas],
                              positions=steer.positions, target=target)
        except _expected_errors() as exc:
            raise UserError("explore_failed", detail=_first_line(exc)) from None
        frame = frame.rename(columns={"alpha": "raw_alpha"})
        frame.insert(0, "alpha", alphas)
        return frame

    def compare(self, session: str | None, prompts: Any = "", use_dataset: bool = False,
                vector_name: str | None = None, layer: int | None = None, alpha: float = 0.0, relative: bool = True,
                seed: int = 0, alpha_max: float = 1.0, sampling=None, progress=None, alphas=None,
                positions: str | None = None) -> dict:
        """One vector over many prompts (pasted, one per line, or the loaded dataset's held-out pairs): both
        generations of every prompt from the shared decode batch, and per prompt and overall the numbers of
        :mod:`steer_ui.steerability` (margins and steerability when the prompts come with pairs, over ``alphas``
        or a grid over ±``alpha_max``)."""
        from . import steerability
        from .model.budget import count_tokens
        from .model.engine import EngineBusy
        from .model.hooks import Steer

        p = self.policy
        flag = guards.flag(use_dataset, "use_dataset")
        pairs = self._held_out_pairs(session) if flag else None
        if flag:
            texts = [pair.prompt for pair in pairs][: p.max_compare_prompts]
            pairs = pairs[: p.max_compare_prompts]
        else:
            raw = guards.text(prompts, "prompts", p.max_prompt_chars * p.max_compare_prompts, allow_empty=True)
            texts = [line.strip() for line in raw.splitlines() if line.strip()]
            if len(texts) > p.max_compare_prompts:
                raise UserError("too_many_prompts", count=len(texts), limit=p.max_compare_prompts)
        if not texts:
            raise UserError("no_prompts")
        sampling = sampling or self.sampling()
        needed = self.guard.texts(self.handle, texts, "prompt", rows=3, new_tokens=sampling.max_new_tokens)
        alpha = self.guard.alpha(alpha)
        top = abs(self.guard.alpha(alpha_max, "alpha_max"))
        if top == 0:
            raise UserError("number_not_positive", what="alpha_max", value="0")
        layer = None if layer is None else self.guard.layer(self.handle, layer)  # once: the read-out and the save
        steers = self.steers(session, vector_name, layer, alpha, relative, seed, positions)
        unit = self.steers(session, vector_name, layer, 1.0, relative, seed, positions)
        unit_steer = unit[0] if len(unit) == 1 and isinstance(unit[0], Steer) else None
        scale = float(unit_steer.alpha.reshape(-1)[0]) if unit_steer is not None else 1.0
        if alphas is not None and len(alphas):
            if len(alphas) > p.max_sweep_points:
                raise UserError("too_many_values", what="alphas", count=len(alphas), limit=p.max_sweep_points)
            alphas = sorted({self.guard.alpha(a, "alphas") for a in alphas})
            if len(alphas) < 2:  # a slope needs two distinct α
                raise UserError("too_few_values", what="alphas", count=len(alphas), least=2)
        else:
            alphas = steerability.alpha_grid(top)
        alphas = alphas if pairs else None
        if pairs and unit_steer is None:
            raise UserError("sweep_unsupported")
        engine = self.engine()
        # the teacher-forced passes: a prompt with a generation (3 rows' worth covers both texts), and a pair's
        # completions with one row per α of the grid
        reading_rows = len(alphas or [0]) + 2
        reading = self.guard.texts(self.handle, texts, "prompt", rows=reading_rows, new_tokens=sampling.max_new_tokens)
        # its share of the working memory and its time at the engine's measured speed, before any model work
        plan = admission.plan_comparison(self.handle, engine.measured(), p, [count_tokens(self.handle, t) for t in texts],
                                         sampling.max_new_tokens, reading_rows)
        try:
            requests = steerability.requests_for(engine.handle, texts, steers, sampling)
        except _expected_errors() as exc:
            raise UserError("generation_failed", detail=_first_line(exc)) from None
        report = progress or (lambda _f, _m="": None)
        with self.guard.reserve(plan.reserve_bytes, long=True, waiting=lambda wait: report(0.0, str(wait))):
            try:
                report(0.0, f"generating {len(texts)} prompts")
                generated = steerability.generate_all(engine, requests, plan.in_flight, texts,
                                                      seconds=p.compare_seconds)
            except EngineBusy as exc:
                raise UserError("busy", detail=_first_line(exc)) from None
        finished = [i for i, g in enumerate(generated) if g is not None]
        if not finished:
            raise UserError("compare_timeout", limit=int(p.compare_seconds))
        asked = len(texts)
        stopped = len(finished) < asked
        if stopped:  # the time limit came first: the prompts that finished, and a line saying so
            generated, texts = [generated[i] for i in finished], [texts[i] for i in finished]
            pairs = [pairs[i] for i in finished] if pairs else pairs
        try:
            with self.guard.reserve(reading, long=True):
                out = steerability.compare(self.handle, generated, steers, unit_steer, scale, pairs, alphas, alpha,
                                           progress=lambda f, m="": report(0.5 + f / 2, m),
                                           vector=self.get_vector(session, vector_name, layer, seed))
        except _expected_errors() as exc:
            raise UserError("explore_failed", detail=_first_line(exc)) from None
        out["summary"]["units"] = "relative" if relative else "raw"
        if stopped:
            out["summary"]["stopped"] = {"done": len(finished), "total": asked, "limit": int(p.compare_seconds)}
        # what *Save result* on the Many prompts tab keeps: the table and the settings it was made from
        s = self.session(session)
        s.cache[LAST_COMPARISON] = {"comparison": out, "settings": {
            "prompts": texts, "use_dataset": flag, "vector": vector_name, "layer": layer, "alpha": alpha,
            "relative": bool(relative), "seed": int(seed or 0), "alpha_max": top,
            "max_new_tokens": sampling.max_new_tokens}}
        return out

    def _held_out_pairs(self, session: str | None) -> list:
        """The loaded dataset's contrastive pairs in the held-out groups (the split training uses)."""
        from .data.datasets import group_split
        from .methods.l2s.pairs import as_pairs

        s = self.session(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        try:
            pairs = as_pairs(s.dataset)
            _train, test = group_split([pair.group for pair in pairs])
        except _expected_errors() as exc:
            raise UserError("compare_needs_pairs", detail=_first_line(exc)) from None
        return [pairs[i] for i in test]

    # ================================================================== data
    @staticmethod
    def bundled_datasets() -> list[str]:
        if not DATASETS_DIR.is_dir():
            return []
        return sorted(p.name for p in DATASETS_DIR.iterdir() if p.suffix.lower() in DATASET_SUFFIXES)

    def upload_dataset(self, session: str | None, path: str | Path | None, schema: str | None = None,
                       bundled: str | None = None) -> dict:
        """Read and validate a dataset; on success it replaces the session's data, on failure nothing changes."""
        if bundled:
            if bundled not in self.bundled_datasets():
                raise UserError("unknown_bundled", name=bundled, known=", ".join(self.bundled_datasets()) or "none")
            path = DATASETS_DIR / bundled
        if not path:
            raise UserError("no_file")
        path = Path(path)
        names.checked(path.name)  # the dataset's name, shown as it is
        if not path.is_file():
            raise UserError("file_missing", name=path.name)
        size = path.stat().st_size
        if size > self.max_file_bytes:
            raise UserError("file_too_large", name=path.name, size=size >> 20, limit=self.max_file_bytes >> 20)
        from .data import load_dataset
        try:
            dataset = load_dataset(path, schema=None if schema in (None, "", "auto") else schema,
                                   max_bytes=self.max_file_bytes, max_cell_chars=self.policy.max_prompt_chars)
        except _expected_errors() + (UnicodeDecodeError,) as exc:
            raise _dataset_refusal(path.name, exc) from None
        s = self.session(session)
        held = frame_bytes(s.dataset)  # the dataset this one replaces does not count
        self.sessions.check_bytes(s, frame_bytes(dataset) - held)
        self.keeper.keep_dataset(s, path, path.name)  # bundled ones too: stored once, however many keep them
        s.dataset, s.dataset_name, s.probe = dataset, path.name, None
        return self.dataset_summary(session)

    def dataset_summary(self, session: str | None) -> dict:
        s = self.session(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        dataset = s.dataset
        summary = dataset.summary() if hasattr(dataset, "summary") else {}
        out = {"name": s.dataset_name, "kind": getattr(dataset, "kind", ""), "rows": int(len(dataset.frame)),
               "columns": [str(c) for c in dataset.frame.columns],
               "warnings": [str(w) for w in getattr(dataset, "warnings", [])]}
        if isinstance(summary, dict):
            out["summary"] = summary
        return out

    def dataset_preview(self, session: str | None, rows: int = 50) -> pd.DataFrame:
        s = self.session(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        return s.dataset.frame.head(rows).copy()

    def class_balance(self, session: str | None) -> pd.DataFrame:
        """Counts per label, and per train/test split when the data module can split by group."""
        s = self.session(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        frame = s.dataset.frame
        try:
            from .data import split_by_group

            parts = [("train", p.frame) for p in split_by_group(s.dataset, seed=0)[:1]] + \
                    [("test", p.frame) for p in split_by_group(s.dataset, seed=0)[1:]]
        except Exception:  # e.g. too few groups to split: plain counts still help
            parts = [(None, frame)]
        counts = []
        for name, part in parts:
            if "label" in part:
                c = part["label"].value_counts().sort_index()
                counts.append(pd.DataFrame({"label": c.index.astype(str), "count": c.values}))
            else:  # contrastive pairs: one bar of pairs per split
                counts.append(pd.DataFrame({"label": ["pairs"], "count": [len(part)]}))
            if name is not None:
                counts[-1]["split"] = name
        return pd.concat(counts, ignore_index=True)

    # ================================================================= train
    def probe_layers(self, session: str | None, position: str = "last", seed: int = 0,
                     progress: Progress | None = None) -> dict:
        s = self.session(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        from .methods import probe_layers
        handle = self.handle
        self.guard.dataset(handle, s.dataset)
        try:
            with self._job(s, handle, progress) as report:
                result = probe_layers(handle, s.dataset, position=position, seed=self.guard.seed(seed), progress=report)
        except _expected_errors() as exc:
            raise UserError("training_failed", detail=_first_line(exc)) from None
        prune(cache_root() / "activations", self.policy.activation_cache_max_bytes)
        s.probe = result
        return result

    # ------------------------------------------------------------- jobs
    def _job(self, s: Session, handle, progress: Progress | None = None):
        """A long job of session ``s`` (:func:`steer_ui.jobs.job`) within this server's time limit."""
        return job(s, handle, self.policy.job_seconds, progress)

    def cancel(self, session: str | None) -> bool:
        """Ask the session's running job to stop at its next progress report; True if one was running."""
        s = self.sessions.peek(session)
        if s is None or not s.running:
            return False
        s.cancel.set()
        return True

    def job_outcome(self, session: str | None, wait: float = 0.0) -> str:
        """How the session's last job ended ("finished", "cancelled", "failed"), waiting up to ``wait`` seconds
        for a running one; "running" if it still runs, "" if the session never ran one.  A cancelled job stops
        at its next progress report, so Cancel can answer with the job's end instead of "stopping"."""
        import time

        s = self.sessions.peek(session)
        if s is None:
            return ""
        deadline = time.monotonic() + wait
        while s.running and time.monotonic() < deadline:
            time.sleep(0.02)
        return "running" if s.running else s.job_end

    # ---------------------------------------------------------- methods
    @staticmethod
    def method_names() -> list[str]:
        from .methods.base import names

        return list(names())

    @staticmethod
    def methods_schema() -> list[dict]:
        """Every registered method with its settings (name, type, default, bounds, help): what forms and clients build on."""
        from .methods.base import all_methods, specs

        return [{"name": m.name, "label": m.label, "steering": m.steering,
                 "settings": [spec.as_dict() for spec in specs(m.Settings)]} for m in all_methods()]

    def parse_method_settings(self, method: str, values: dict[str, Any] | None,
                              layer: int | None = None) -> tuple[Any, Any]:
        """(method object, validated settings) for ``method`` with ``values``; refused with one line naming the problem."""
        from .methods.base import SettingsError, UnknownMethod, get, parse_settings, specs

        try:
            if not isinstance(method, str):
                raise UnknownMethod(method)
            m = get(method)
        except UnknownMethod:
            raise UserError("unknown_method", method=str(method)[:80], known=", ".join(self.method_names())) from None
        if values is not None and not isinstance(values, dict):
            raise UserError("bad_settings", detail="settings must be an object like {\"epochs\": 10}")
        values = dict(values or {})
        if layer is not None:
            layer = self.guard.layer(self.handle, layer)
            if any(spec.name == "layer" for spec in specs(m.Settings)):
                values["layer"] = layer
        try:
            return m, parse_settings(m.Settings, values)
        except SettingsError as exc:
            raise UserError("bad_settings", detail=_first_line(exc)) from None

    def train(self, session: str | None, method: str, layer: int | None = None, progress: Progress | None = None,
              name: str | None = None, settings: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Train ``method`` on the session's data; the vector joins the session's list under the returned name.

        ``settings`` are validated against the method's settings dataclass
        (types, bounds, unknown names) before any model work.
        """
        s = self.session(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        names.checked(name)  # before the job, not after it
        m, parsed = self.parse_method_settings(method, settings, layer)
        handle = self.handle
        self.guard.dataset(handle, s.dataset)
        try:
            with self._job(s, handle, progress) as job_progress:
                vector, report = m.train(handle, s.dataset, parsed, job_progress)
        except UserError:
            raise
        except _expected_errors() + (RuntimeError,) as exc:
            raise UserError("training_failed", detail=_first_line(exc)) from None
        prune(cache_root() / "activations", self.policy.activation_cache_max_bytes)
        label = name or f"{m.name} L{vector.layer}" + (f" · {s.dataset_name}" if s.dataset_name else "")
        unique = self.add_vector(session, vector, label, report=report or {})
        return unique, report or {}

    # ================================================================ detect
    def detect(self, session: str | None, vector_name: str, answers: list[tuple[str, str]] | None = None,
               path: str | Path | None = None) -> dict:
        """p(truthful) per (prompt, answer) from a detector vector (TSV); AUROC when a labelled file is given."""
        from .methods.base import method_of

        vector = self.get_vector(session, vector_name)
        method = method_of(vector)
        if method is None or not hasattr(method, "score"):  # only detector methods can score answers
            raise UserError("not_tsv", name=vector_name, method=vector.method)
        s = self.session(session)
        if path:  # a labelled file: read within the upload limits, at most max_train_rows rows
            from .data import load_dataset

            try:
                dataset = load_dataset(Path(path), max_bytes=self.max_file_bytes,
                                       max_cell_chars=self.policy.max_prompt_chars)
            except _expected_errors() + (UnicodeDecodeError,) as exc:
                raise _dataset_refusal(Path(path).name, exc) from None
            self.guard.dataset(self.handle, dataset)
        else:
            try:
                pairs = [(str(p or ""), str(a)) for p, a in (answers or []) if str(a or "").strip()]
            except (TypeError, ValueError):  # not (prompt, answer) pairs
                raise UserError("answers_table") from None
            if not pairs:
                raise UserError("no_answers")
            if len(pairs) > self.policy.max_detect_answers:
                raise UserError("too_many_answers", count=len(pairs), limit=self.policy.max_detect_answers)
            # each answer is scored after its prompt, unsteered and steered
            self.guard.texts(self.handle, [p + a for p, a in pairs], "answer", rows=2)
        handle = self.handle
        try:
            # one job at a time on the model: Cancel and the time limit reach it while it waits for the model;
            # scoring itself is bounded by policy.max_detect_answers
            with self._job(s, handle):
                if path:
                    out = method.detect(handle, vector, dataset)
                else:
                    scores = method.score(handle, vector, pairs)
                    out = {"scores": [{"prompt": p, "answer": a, "score": float(sc)}
                                      for (p, a), sc in zip(pairs, list(scores))]}
        except UserError:
            raise
        except _expected_errors() as exc:
            raise UserError("detect_failed", detail=_first_line(exc)) from None
        return out

    # ========================================================= export/import
    def export_vector(self, session: str | None, vector_name: str, fmt: str, layer: int | None = None,
                      seed: int = 0) -> list[Path]:
        """Write the vector in ``fmt`` into a fresh folder; returns the written files."""
        if fmt not in FORMATS:
            raise UserError("unknown_format", fmt=fmt, known=", ".join(FORMATS))
        vector = self.get_vector(session, vector_name, layer, seed)
        from .formats import export_path, write_vector

        prune(self.workdir, self.policy.export_max_bytes, self.policy.export_keep_seconds, pattern="export-*")
        out_dir = Path(tempfile.mkdtemp(prefix="export-", dir=self.workdir))
        out = export_path(out_dir, vector.name or vector.method, fmt)  # a name like '..' cannot leave out_dir

        try:
            written = write_vector(vector, fmt, out)
        except _expected_errors() as exc:
            raise UserError("export_failed", fmt=fmt, detail=_first_line(exc)) from None
        files: list[Path] = []
        for p in written or []:
            p = Path(p)
            files.extend(sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p])
        if not files:
            raise UserError("export_failed", fmt=fmt, detail="nothing was written")
        return files

    def import_vector(self, session: str | None, path: str | Path | None, name: str | None = None) -> tuple[str, list[str]]:
        """Read a vector file in any supported format, validated against the loaded model."""
        from .formats import read_vector

        if not path:
            raise UserError("no_file")
        path = Path(path)
        if not path.is_file():
            raise UserError("file_missing", name=path.name)
        if path.stat().st_size > self.max_file_bytes:
            raise UserError("file_too_large", name=path.name, size=path.stat().st_size >> 20,
                            limit=self.max_file_bytes >> 20)
        handle = self.handle
        try:
            vector, warnings = read_vector(path, handle, max_bytes=self.max_file_bytes)  # validates against the model
        except _expected_errors() + (OSError, KeyError, TypeError) as exc:
            raise UserError("import_failed", name=path.name, detail=_first_line(exc)) from None
        return self.add_vector(session, vector, name or vector.name or path.stem), list(warnings)
