"""The only door: everything the app does, reachable from Python without gradio.

The fronts (the UI in :mod:`steer_ui.ui`, whose named events are the HTTP API, and the CLI) call this class and
nothing behind it.  :class:`Service` finds the session and hands the request to the room named for what it keeps
or does (:mod:`steer_ui.rooms`).  Validation and limits live in the rooms, once; a refusal is a
:class:`UserError` with a plain message that leaves the session's data and vectors as they were.  Behind the door,
steering hooks act only in the thread that installed them (sessions running at once never see each other's
steering), long jobs run one at a time in a line the page shows (:mod:`steer_ui.jobs`), and generation joins one
decode batch shared by every session (:mod:`steer_ui.model.engine`), whose rows a disconnected client frees at the
next step.
"""
from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from .guards import Guard
from .keeping import Keeper
from .messages import UserError, normalise_lang
from .model.cpu_threads import hand_back_after_calls
from .policy import Policy
from .rooms.chat import Chat
from .rooms.common import RANDOM, Shared
from .rooms.datasets import DATASETS_DIR, Datasets, bundled_datasets
from .rooms.detection import Detection
from .rooms.evaluation import Evaluation
from .rooms.explore import Explore, Frame, last_frame
from .rooms.lessons import Lessons
from .rooms.library import LAST_COMPARISON, Library
from .rooms.models import Models
from .rooms.training import Training, method_names, methods_schema
from .rooms.transfer import FORMATS, Transfer
from .sessions import Session, Sessions

DEFAULT_MAX_FILE_BYTES = 50 * 1024 * 1024
LESSONS = ("lm_head", "sampling", "sample", "explode", "fix", "kv", "time_cache")  # what Service.lesson may run

__all__ = ["DATASETS_DIR", "DEFAULT_MAX_FILE_BYTES", "FORMATS", "Frame", "LAST_COMPARISON", "RANDOM", "Service",
           "Session", "UserError", "last_frame"]


@hand_back_after_calls  # a request thread that has computed hands its OpenMP helpers back (model/cpu_threads.py)
class Service:
    """The door: the session is found here, the work is done in the rooms (each method says which)."""

    def __init__(self, handle=None, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, workdir: str | Path | None = None,
                 policy: Policy | None = None, default_view: bool = False, library=None,
                 vectors_dir: Path | None = None, chat_template: str | None = None):  # app.py --vectors, --chat-template
        self.policy = policy or Policy()
        self.sessions = Sessions(self.policy)
        self.guard = Guard(self.policy)
        self.max_file_bytes = int(max_file_bytes)
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="steer_ui-"))
        self.keeper = Keeper(library, self.max_file_bytes)  # owners' work in the library (off without one)
        shared = Shared(self.policy, self.guard, self.sessions, self.keeper, self.session, self.max_file_bytes,
                        self.workdir)
        self.models = Models(shared, handle, default_view, vectors_dir, chat_template)
        self.library = Library(shared, self.models)
        self.datasets = Datasets(shared)
        self.explore = Explore(shared, self.models, self.library)
        self.chat = Chat(shared, self.models, self.library, self.explore)  # a conversation side by side
        self.training = Training(shared, self.models, self.library)  # its line of long jobs is everyone's
        self.evaluation = Evaluation(shared, self.models, self.library, self.datasets, self.explore, self.training)
        self.detection = Detection(shared, self.models, self.library, self.datasets, self.training)
        self.transfer = Transfer(shared, self.models, self.library)
        self.lessons = Lessons(shared, self.models, self.training)  # the Concepts tab's, run as jobs

    # ================================================================ sessions and owners (kept at the door)
    def session(self, session: str | None, client: str | None = None, say_expired: bool = True) -> Session:
        """The store of session ``session``; ``None`` gets a fresh one that is not kept (an anonymous call).

        ``client``, the caller's address where known, is what new sessions are admitted by; see
        :mod:`steer_ui.sessions` for who may get a new one, what is never evicted, and ``say_expired``.
        """
        s = self.sessions.get(session, client, say_expired)
        if s.owner is None and self.keeper.on and session is not None:
            token = self.sessions.token_of(session)
            if token:  # a tab whose session was let go comes back to its owner's work
                self.keeper.claim(s, token, self.models.current, issue=False)
        return s

    def peek_session(self, session: str | None) -> Session | None:
        """The session ``session`` if it exists; asking makes none (a page's cache read by a front)."""
        return self.sessions.peek(session)

    def language(self, session: str | None) -> str:
        """The session's language; asking makes no session (an error for a refused newcomer is told in English)."""
        s = self.sessions.peek(session)
        return s.lang if s is not None else "en"

    def set_language(self, session: str | None, lang: str) -> str:
        s = self.session(session)
        s.lang = normalise_lang(lang)
        self.keeper.keep_settings(s)
        return s.lang

    def claim_owner(self, session: str | None, token=None, client: str | None = None, issue: bool = True) -> str:
        """Bind the session to the owner of ``token`` (a browser's or an API client's), issuing a new owner when
        the token is not one this server issued (unless ``issue`` is False: an API client's header that names no
        owner leaves the session unkept); returns the token to keep ("" when nothing is kept)."""
        return self.keeper.claim(self.session(session, client), token, self.models.current, issue)

    @property
    def browser_secret(self) -> str:
        """What the page's local storage keys the owner token with: the library's, the same in every process."""
        if self.keeper.on:
            return self.keeper.library.browser_secret
        return self.__dict__.setdefault("_browser_secret", uuid.uuid4().hex)

    def whoami(self, session: str | None) -> str:
        """The session's owner token, a new owner if it has none (API clients send it back as X-Steer-Owner)."""
        return self.session(session).owner_token or self.claim_owner(session, None)

    @property
    def keeps_work(self) -> bool:
        return self.keeper.on

    def kept(self, session: str | None) -> bool:
        """Whether the session's work outlives it (this server has a library and the session an owner)."""
        s = self.sessions.peek(session)
        return self.keeper.on and s is not None and s.owner is not None

    # ================================================================ models (rooms/models.py)
    handle = property(lambda self: self.models.handle)
    model_ready = property(lambda self: self.models.ready)
    default_view = property(lambda self: self.models.default_view)

    # the plain delegations one line each, so the door stays within 300 lines
    def model_status(self) -> dict: return self.models.status()
    def model_facts(self) -> dict: return self.models.facts()
    def layer_norm_frame(self): return self.models.layer_norm_frame()
    def engine(self): return self.models.engine()
    def engine_load(self) -> dict: return self.models.engine_load()

    def switch_model(self, source: str | None, device: str = "auto", dtype: str = "auto", progress=None) -> dict:
        """A visitor's request to change the shared model (the device and dtype stay the administrator's)."""
        return self.models.switch(source, progress)

    def load_model(self, source: str | None = None, device: str = "auto", dtype: str = "auto", progress=None,
                   weights: str = "auto") -> dict:
        return self.models.load(source, device, dtype, progress, weights)

    def load_in_background(self, source=None, device: str = "auto", dtype: str = "auto", weights: str = "auto"):
        return self.models.load_in_background(source, device, dtype, weights)

    def chat_prompt(self, messages) -> str:
        """A conversation (OpenAI's messages) as the prompt the model continues, through its chat template."""
        return self.models.chat_prompt(messages)

    # ================================================================ library (rooms/library.py)
    def share_vector(self, session, name): return self.library.share_vector(session, name)
    def unshare_vector(self, session, name): return self.library.unshare_vector(session, name)
    def share_id_of(self, session, name): return self.library.share_id_of(session, name)
    def vectors(self, session): return self.library.vectors(session)
    def vector_names(self, session): return self.library.vector_names(session)
    def vector_info(self, session, name): return self.library.vector_info(session, name)

    def open_shared(self, session, share_id, client=None):
        return self.library.open_shared(session, share_id, client)

    def add_vector(self, session, vector, name=None, report=None):
        return self.library.add_vector(session, vector, name, report)

    def get_vector(self, session, name, layer=None, seed=0):
        return self.library.get_vector(session, name, layer, seed)

    def steers(self, session, vector_name, layer, alpha, relative=True, seed=0, positions=None):
        return self.library.steers(session, vector_name, layer, alpha, relative, seed, positions)

    def steers_for(self, session, steering):
        """Hook specs for a steering spec of one or more vectors (:mod:`steer_ui.steering_spec`)."""
        return self.library.steers_for(session, steering)

    def applied(self, session, steering) -> dict:
        return self.library.applied(session, steering)

    def save_result(self, session, view: dict, generation: bool = True) -> str:
        return self.library.save_result(session, view, generation)

    def save_comparison(self, session) -> str:
        return self.library.save_comparison(session)

    def open_result_vector(self, session, result_id, client=None):
        return self.library.open_result_vector(session, result_id, client)

    open_result_terms = property(lambda self: self.library.open_result_terms)  # a result's other vectors, read-only

    def result(self, result_id, client=None) -> dict:
        return self.library.result(result_id, client)

    # ================================================================ datasets (rooms/datasets.py)
    bundled_datasets = staticmethod(bundled_datasets)

    def upload_dataset(self, session, path, schema=None, bundled=None) -> dict:
        return self.datasets.upload(session, path, schema, bundled)

    def dataset_summary(self, session) -> dict:
        return self.datasets.summary(session)

    def dataset_preview(self, session, rows: int = 50):
        return self.datasets.preview(session, rows)

    def class_balance(self, session):
        return self.datasets.class_balance(session)

    # ================================================================ explore (rooms/explore.py)
    def next_token(self, session, prompt, vector_name, layer, alpha, relative=True, seed=0, top_k=10):
        return self.explore.next_token(session, prompt, vector_name, layer, alpha, relative, seed, top_k)

    def next_token_for(self, session, prompt, steering, top_k=10):
        return self.explore.next_token_for(session, prompt, steering, top_k)

    def calibrated_alpha_max(self, session, prompt, vector_name, layer, seed=0) -> float:
        return self.explore.calibrated_alpha_max(session, prompt, vector_name, layer, seed)

    def vocab_projection(self, session, vector_name, layer, seed=0, top_k=12):
        return self.explore.vocab_projection(session, vector_name, layer, seed, top_k)

    def sampling(self, *args, **kwargs):
        """Checked sampling settings (see :meth:`steer_ui.rooms.explore.Explore.sampling`)."""
        return self.explore.sampling(*args, **kwargs)

    def checked_alpha(self, alpha, what: str = "alpha") -> float:
        """``alpha`` within the server's bound (:meth:`.guards.Guard.alpha`), else a refusal naming ``what``."""
        return self.guard.alpha(alpha, what)

    def delta_limit(self, session, vector_name, requested=None) -> float:
        return self.explore.delta_limit(session, vector_name, requested)

    def stream_generate(self, session, prompt, vector_name, layer, alpha, relative=True, seed=0, sampling=None,
                        supersede=False):
        yield from self.explore.stream_generate(session, prompt, vector_name, layer, alpha, relative, seed, sampling,
                                                supersede)

    def stream_generate_for(self, session, prompt, steering, sampling=None, settings=None, supersede=False):
        yield from self.explore.stream_generate_for(session, prompt, steering, sampling, settings, supersede)

    def generate(self, session, prompt, vector_name, layer, alpha, relative=True, seed=0, sampling=None) -> Frame:
        # through this door's stream_generate, so whatever wraps the door's stream (a test's spy) sees the run
        return last_frame(self.stream_generate(session, prompt, vector_name, layer, alpha, relative, seed, sampling))

    def sweep(self, session, prompt, vector_name, layer, alpha_max=1.0, relative=True, seed=0, points=21,
              target=None, alphas=None, held=None):
        return self.explore.sweep(session, prompt, vector_name, layer, alpha_max, relative, seed, points, target,
                                  alphas, held)

    # ================================================================ chat (rooms/chat.py): plain values in and out
    def chat_turn(self, session, message, steering, system=None, steer_prompt=False, sampling=None):
        yield from self.chat.turn(session, message, steering, system, steer_prompt, sampling)

    chat_view = property(lambda self: self.chat.view)  # (session) -> the conversation; the same for the rest
    chat_reset, chat_save = property(lambda self: self.chat.reset), property(lambda self: self.chat.save)
    chat_prompts, chat_template = property(lambda self: self.chat.prompts), property(lambda self: self.chat.template)
    chat_answer = property(lambda self: self.chat.answer)  # a whole conversation given, nothing kept (--messages)
    chat_rerun = property(lambda self: self.chat.rerun)  # a saved conversation asked again, live (Run live)

    # ================================================================ evaluation (rooms/evaluation.py)
    def compare(self, session, *args, **kwargs) -> dict:
        """One vector over many prompts (see :meth:`steer_ui.rooms.evaluation.Evaluation.compare`)."""
        return self.evaluation.compare(session, *args, **kwargs)

    # ================================================================ training (rooms/training.py)
    method_names, methods_schema = staticmethod(method_names), staticmethod(methods_schema)

    def cancel(self, session) -> bool:
        return self.training.cancel(session)

    def job_outcome(self, session, wait: float = 0.0) -> str:
        return self.training.job_outcome(session, wait)

    def job_view(self, session) -> dict | None:  # where the session's job stands in the line
        return self.training.job_view(session)

    def parse_method_settings(self, method, values, layer=None):
        return self.training.parse_method_settings(method, values, layer)

    def probe_layers(self, session, position="last", seed=0, progress=None) -> dict:
        return self.training.probe_layers(session, position, seed, progress)

    def train(self, session, method, layer=None, progress=None, name=None, settings=None):
        return self.training.train(session, method, layer, progress, name, settings)

    # ================================================================ detection (rooms/detection.py)
    def detect(self, session, vector_name, answers=None, path=None, schema=None) -> dict:
        return self.detection.detect(session, vector_name, answers, path, schema)

    # ================================================================ lessons (rooms/lessons.py)
    def lesson(self, name: str, session, *args):
        """One of the Concepts tab's lessons (rooms/lessons.py) by its name, from a fixed list."""
        if name not in LESSONS:
            raise ValueError(f"no lesson {name!r}; the lessons are {', '.join(LESSONS)}")
        return getattr(self.lessons, name)(session, *args)

    # ================================================================ transfer (rooms/transfer.py)
    def export_vector(self, session, vector_name, fmt, layer=None, seed=0):
        return self.transfer.export_vector(session, vector_name, fmt, layer, seed)

    def import_vector(self, session, path, name=None):
        return self.transfer.import_vector(session, path, name)
