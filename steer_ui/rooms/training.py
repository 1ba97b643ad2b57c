"""Training: the registered methods and their settings, training a vector on the session's data, probing every
layer, and the long jobs they run as (one at a time on the model, within the time limit, stopped by Cancel)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .. import names
from ..jobs import JobLine, job
from ..messages import Said, UserError, said_of
from ..paths import cache_root, prune
from ..sessions import Session
from .common import Progress, Shared, expected_errors
from .library import Library
from .models import Models


def method_names() -> list[str]:
    from ..methods.base import names as registered

    return list(registered())


def methods_schema() -> list[dict]:
    """Every registered method with its settings (name, type, default, bounds, help): what forms and clients build on."""
    from ..methods.base import all_methods, specs

    return [{"name": m.name, "label": m.label, "steering": m.steering,
             "settings": [spec.as_dict() for spec in specs(m.Settings)]} for m in all_methods()]


@dataclass
class Training:
    shared: Shared
    models: Models
    library: Library
    line: JobLine = field(default_factory=JobLine)  # the server's long jobs: who runs, who waits

    # ------------------------------------------------------------- jobs
    def job(self, s: Session, handle, progress: Progress | None = None, kind: str = "job", detail: str = "",
            model_lock: bool = True):
        """A long job of session ``s`` (:func:`steer_ui.jobs.job`) in the server's line, within its time limit."""
        return job(s, handle, self.shared.policy.job_seconds, progress, line=self.line, kind=kind, detail=detail,
                   model_lock=model_lock)

    def job_view(self, session: str | None) -> dict | None:
        """The session's job as the page shows it (:meth:`steer_ui.jobs.JobLine.view`); None when it has none."""
        return self.line.view(self.shared.sessions.peek(session))

    def cancel(self, session: str | None) -> bool:
        """Ask the session's job to stop at its next progress report, or to leave the line if it waits; True if
        it had one."""
        s = self.shared.sessions.peek(session)
        if s is None or not s.running:
            return False
        s.cancel.set()
        return True

    def job_outcome(self, session: str | None, wait: float = 0.0) -> str:
        """How the session's last job ended ("finished", "cancelled", "failed"), waiting up to ``wait`` seconds
        for a running one; "running" if it still runs, "" if the session never ran one.  A cancelled job stops
        at its next progress report, so Cancel can answer with the job's end instead of "stopping"."""
        s = self.shared.sessions.peek(session)
        if s is None:
            return ""
        deadline = time.monotonic() + wait
        while s.running and time.monotonic() < deadline:
            time.sleep(0.02)
        return "running" if s.running else s.job_end

    def _with_data(self, session: str | None) -> Session:
        s = self.shared.find(session)
        if s.dataset is None:
            raise UserError("no_dataset")
        return s

    def _prune_activations(self) -> None:
        prune(cache_root() / "activations", self.shared.policy.activation_cache_max_bytes)

    # ----------------------------------------------------------- probes
    def probe_layers(self, session: str | None, position: str = "last", seed: int = 0,
                     progress: Progress | None = None) -> dict:
        s = self._with_data(session)
        from ..methods import probe_layers
        handle = self.models.handle
        self.shared.guard.dataset(handle, s.dataset)
        try:
            with self.job(s, handle, progress, kind="probe") as report:
                result = probe_layers(handle, s.dataset, position=position, seed=self.shared.guard.seed(seed),
                                      progress=report)
        except expected_errors() as exc:
            raise UserError("training_failed", detail=said_of(exc)) from None
        self._prune_activations()
        s.probe = result
        return result

    # ---------------------------------------------------------- methods
    def parse_method_settings(self, method: str, values: dict[str, Any] | None,
                              layer: int | None = None) -> tuple[Any, Any]:
        """(method object, validated settings) for ``method`` with ``values``; refused with one line naming the problem."""
        from ..methods.base import SettingsError, UnknownMethod, get, parse_settings, specs

        try:
            if not isinstance(method, str):
                raise UnknownMethod(method)
            m = get(method)
        except UnknownMethod:
            raise UserError("unknown_method", method=str(method)[:80], known=", ".join(method_names())) from None
        if values is not None and not isinstance(values, dict):
            raise UserError("bad_settings", detail=Said("setting_not_object"))
        values = dict(values or {})
        if layer is not None:
            layer = self.shared.guard.layer(self.models.handle, layer)
            if any(spec.name == "layer" for spec in specs(m.Settings)):
                values["layer"] = layer
        try:
            return m, parse_settings(m.Settings, values)
        except SettingsError as exc:
            raise UserError("bad_settings", detail=said_of(exc)) from None

    def train(self, session: str | None, method: str, layer: int | None = None, progress: Progress | None = None,
              name: str | None = None, settings: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Train ``method`` on the session's data; the vector joins the session's list under the returned name.

        ``settings`` are validated against the method's settings dataclass
        (types, bounds, unknown names) before any model work.
        """
        s = self._with_data(session)
        names.checked(name)  # before the job, not after it
        m, parsed = self.parse_method_settings(method, settings, layer)
        handle = self.models.handle
        self.shared.guard.dataset(handle, s.dataset)
        try:
            with self.job(s, handle, progress, kind="train", detail=m.name) as job_progress:
                vector, report = m.train(handle, s.dataset, parsed, job_progress)
        except UserError:
            raise
        except expected_errors() + (RuntimeError,) as exc:
            raise UserError("training_failed", detail=said_of(exc)) from None
        self._prune_activations()
        label = name or f"{m.name} L{vector.layer}" + (f" · {s.dataset_name}" if s.dataset_name else "")
        unique = self.library.add_vector(session, vector, label, report=report or {})
        return unique, report or {}
