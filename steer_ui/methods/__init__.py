"""Steering-vector methods; every one returns the shared :class:`~steer_ui.vector.SteeringVector`.

:mod:`.base` holds the :class:`~.base.Method` interface and the registry;
each method is one module (``mean_diff``, ``probe``, ``pca``, ``iti``) or a
small package (``tsv``, ``l2s``) that defines a ``METHOD`` object.
:func:`train` is the one entry point the service, the CLI and the benchmark
use; :func:`~.layers.probe_layers` scores every layer.
"""
from __future__ import annotations

from typing import Any

from ..vector import SteeringVector
from .base import (Method, Progress, SettingsError, all_methods, build_steers, get, method_of, names, noop,
                   parse_settings, register, unregister)
from .layers import probe_layers


def train(handle, dataset, method: str, progress: Progress | None = None,
          **values: Any) -> tuple[SteeringVector, dict]:
    """Train the registered ``method`` on ``dataset`` with settings ``values`` (validated; unknown names refused)."""
    m = get(method)
    settings = parse_settings(m.Settings, values)
    return m.train(handle, dataset, settings, progress or noop)


__all__ = ["Method", "SettingsError", "all_methods", "build_steers", "get", "method_of", "names", "parse_settings",
           "probe_layers", "register", "train", "unregister"]
