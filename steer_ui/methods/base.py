"""The Method interface, typed settings with server-side bounds, and the registry of methods.

A method is an object with

* ``name`` (what ``--method`` and the API take) and ``label`` (for people);
* ``Settings``: a dataclass whose fields are declared with :func:`setting`
  (type, default, bounds, choices, help).  The CLI's ``train`` flags, the Train
  form and the API's settings JSON are all generated from it, and every value
  from any of them goes through :func:`parse_settings`, so the bounds hold
  whatever a client sends;
* ``train(handle, dataset, settings, progress) -> (SteeringVector, report)``;
* ``steering``: how its vectors act at inference — ``"static"`` (one
  direction per layer), ``"input"`` (a function of the prompt, L2S) or
  ``"heads"`` (per attention head, ITI) — and ``steers(...)``, which turns a
  stored vector plus α into hook specs for :mod:`steer_ui.model.hooks`.

Adding a method is one module that defines such an object plus one
:func:`register` call (built-in methods are listed in ``_BUILTIN`` and
imported on first use, so importing this module stays cheap).
"""
from __future__ import annotations

import dataclasses
import sys
import types
import typing
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

from ..messages import KeyedError
from ..model.hooks import Steer, SteeringError
from ..numbers import NOT_A_NUMBER, NOT_FINITE, NOT_WHOLE, TOO_LARGE, TOO_SMALL, NumberError, parse_number
from ..model.units import scaled_direction
from ..vector import SteeringVector

Progress = Callable[[float, str], None]
STEERING_KINDS = ("static", "input", "heads")
MAX_TEXT = 2000  # characters in any free-text setting (templates)
MAX_LIST = 16  # values in any list setting (e.g. bound sweeps)


class SettingsError(KeyedError):
    """A setting that is unknown, of the wrong type or out of bounds (one line, naming it); by key where it has one,
    so the Train tab says it in the visitor's language (the English, the CLI's, is the exception's own)."""


def noop(_f: float, _m: str = "") -> None:
    pass


# ====================================================================== settings
def setting(default: Any, help: str, *, minimum: float | None = None, maximum: float | None = None,
            choices: Sequence[Any] | None = None, flag: str | None = None, ui: bool = True,
            max_length: int = MAX_TEXT) -> Any:
    """A settings field: ``default`` plus what the CLI, the form and the validator need to know.

    ``minimum``/``maximum`` bound numbers (inclusive) and every element of a
    list; ``choices`` fixes the allowed values; ``flag`` overrides the CLI
    flag name; ``ui=False`` keeps an expert setting out of the form (it is
    still reachable through the settings JSON).
    """
    meta = {"help": help, "minimum": minimum, "maximum": maximum, "choices": tuple(choices) if choices else None,
            "flag": flag, "ui": ui, "max_length": max_length}
    if isinstance(default, (list, tuple)):
        frozen = tuple(default)
        return dataclasses.field(default_factory=lambda: frozen, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class SettingSpec:
    """One field of a settings dataclass, as the generators see it."""

    name: str
    kind: str  # "int" | "float" | "bool" | "str" | "floats"
    default: Any
    optional: bool  # None is allowed (and means "choose for me")
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple | None = None
    flag: str | None = None
    ui: bool = True
    max_length: int = MAX_TEXT

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["choices"] = list(self.choices) if self.choices else None
        out["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        return out


_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def _kind_of(annotation: Any) -> tuple[str, bool]:
    """('int' | 'float' | 'bool' | 'str' | 'floats', optional) for a field's type hint."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) != 1:
            raise TypeError(f"unsupported settings type {annotation!r}")
        annotation = args[0]
        origin = typing.get_origin(annotation)
    if origin is tuple:
        return "floats", optional
    if annotation in _KINDS:
        return _KINDS[annotation], optional
    raise TypeError(f"unsupported settings type {annotation!r}")


def specs(settings_cls: type) -> list[SettingSpec]:
    """The fields of ``settings_cls`` as :class:`SettingSpec` (in declaration order)."""
    module = sys.modules.get(settings_cls.__module__)
    hints = typing.get_type_hints(settings_cls, vars(module) if module else None)
    out = []
    for f in dataclasses.fields(settings_cls):
        if not f.init:
            continue
        kind, optional = _kind_of(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        meta = f.metadata or {}
        out.append(SettingSpec(name=f.name, kind=kind, default=default, optional=optional,
                               help=meta.get("help", ""), minimum=meta.get("minimum"), maximum=meta.get("maximum"),
                               choices=meta.get("choices"), flag=meta.get("flag"), ui=meta.get("ui", True),
                               max_length=meta.get("max_length", MAX_TEXT)))
    return out


def aliases(settings_cls: type) -> dict[str, tuple[str, ...]]:
    """Extra names a settings class accepts, each setting one or more fields (``{"epochs": ("init_epochs", …)}``)."""
    return dict(getattr(settings_cls, "ALIASES", {}) or {})


# a refused number's problem -> its message (the English is NumberError's own, naming the setting as written)
_NUMBER_KEYS = {NOT_A_NUMBER: "setting_not_a_number", NOT_FINITE: "setting_not_finite", NOT_WHOLE: "setting_not_whole",
                TOO_SMALL: "setting_too_small", TOO_LARGE: "setting_too_large"}


def _number(spec: SettingSpec, value: Any, kind: str) -> int | float:
    try:
        return parse_number(value, spec.name, integer=kind == "int", low=spec.minimum, high=spec.maximum)
    except NumberError as exc:
        if exc.problem in (TOO_SMALL, TOO_LARGE) and (exc.low if exc.problem == TOO_SMALL else exc.high) is None:
            raise SettingsError(str(exc)) from None  # "is too small/large": unbounded settings never say it
        raise SettingsError.from_key(_NUMBER_KEYS[exc.problem], name=exc.what, value=exc.value,
                                     low=exc.params["low"], high=exc.params["high"]) from None


def coerce(spec: SettingSpec, value: Any) -> Any:
    """``value`` converted to the field's type and checked against its bounds; raises :class:`SettingsError`."""
    if value is None:
        if spec.optional:
            return None
        return spec.default
    if spec.kind in ("int", "float"):
        out: Any = _number(spec, value, spec.kind)
    elif spec.kind == "bool":
        if isinstance(value, bool):
            out = value
        elif isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
            out = value.strip().lower() in ("true", "1", "yes")
        elif isinstance(value, (int, float)) and value in (0, 1):
            out = bool(value)
        else:
            raise SettingsError.from_key("setting_not_bool", name=spec.name, value=repr(value))
    elif spec.kind == "str":
        if not isinstance(value, str):
            raise SettingsError.from_key("setting_not_text", name=spec.name, type=type(value).__name__)
        if len(value) > spec.max_length:
            raise SettingsError.from_key("setting_too_long", name=spec.name, length=len(value), limit=spec.max_length)
        out = value
    else:  # floats
        if isinstance(value, str):
            value = [v for v in value.replace(";", ",").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise SettingsError.from_key("setting_not_list", name=spec.name, value=repr(value))
        if len(value) > MAX_LIST:
            raise SettingsError.from_key("setting_list_too_long", name=spec.name, count=len(value), limit=MAX_LIST)
        out = tuple(float(_number(spec, v, "float")) for v in value)
    if spec.choices and out not in spec.choices:
        raise SettingsError.from_key("setting_choice", name=spec.name, choices=", ".join(map(str, spec.choices)),
                                     value=repr(value))
    return out


def parse_settings(settings_cls: type, values: dict[str, Any] | None = None, *, ignore_unknown: bool = False) -> Any:
    """A validated ``settings_cls`` from loose values (CLI, form, JSON); unknown names are refused by name.

    ``None`` means "the default".  Aliases (``ALIASES`` on the class) fill
    their fields unless those are given too.  After the per-field checks the
    instance's own ``validate()`` (cross-field rules), if any, runs.
    """
    values = dict(values or {})
    if not isinstance(values, dict):
        raise SettingsError.from_key("setting_not_object")
    by_name = {s.name: s for s in specs(settings_cls)}
    for alias, targets in aliases(settings_cls).items():
        if alias in values:
            given = values.pop(alias)
            for target in targets:
                if values.get(target) is None:
                    values[target] = given
    unknown = sorted(k for k in values if k not in by_name)
    if unknown and not ignore_unknown:
        known = sorted(set(by_name) | set(aliases(settings_cls)))
        raise SettingsError.from_key("setting_unknown", names=", ".join(map(str, unknown))[:200], known=", ".join(known))
    kwargs = {name: coerce(by_name[name], value) for name, value in values.items() if name in by_name}
    try:
        instance = settings_cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise _settings_error(exc) from None
    check = getattr(instance, "validate", None)
    if callable(check):
        try:
            check()
        except SettingsError:
            raise
        except ValueError as exc:
            raise _settings_error(exc) from None
    return instance


def _settings_error(exc: BaseException) -> SettingsError:
    """``exc`` (a settings class's own refusal) as a SettingsError of one line, keeping its key where it has one."""
    key = getattr(exc, "key", None)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return SettingsError(text, key, **exc.params) if key else SettingsError(text)


def settings_dict(settings: Any) -> dict[str, Any]:
    """Plain, JSON-ready values of a settings instance (for reports and vector metadata)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(settings).items()}


# ====================================================================== methods
@runtime_checkable
class Method(Protocol):
    name: str
    label: str
    Settings: type
    steering: str

    def train(self, handle, dataset, settings: Any, progress: Progress) -> tuple[SteeringVector, dict]:
        ...

    def steers(self, handle, vector: SteeringVector, alpha: float, *, layer: int | None = None,
               relative: bool = False, positions: str | None = None) -> list:
        ...


def static_steers(handle, vector: SteeringVector, alpha: float, *, layer: int | None = None, relative: bool = False,
                  positions: str | None = None) -> list[Steer]:
    """Hook specs for a vector of fixed directions: at its own layer(s), or moved to ``layer`` (single-layer)."""
    positions = positions or vector.positions
    n_layers = handle.arch.num_layers
    if layer is not None and len(vector.layers) > 1 and layer not in vector.layers:
        raise SteeringError.from_key("steering_pick_vector_layer", layers=", ".join(map(str, vector.layers)))
    pairs = [(layer, vector.direction(layer if layer in vector.directions else None))] if layer is not None \
        else list(vector.directions.items())
    steers = []
    for target_layer, direction in pairs:
        if not 0 <= target_layer < n_layers:
            raise SteeringError.from_key("steering_no_such_layer", layer=target_layer, last=n_layers - 1)
        vec, multiplier = scaled_direction(handle, direction, alpha, target_layer, relative)
        steers.append(Steer(layer=target_layer, vector=vec, alpha=multiplier, positions=positions))
    return steers


class StaticMethod:
    """Base for methods whose vectors are fixed directions (mean-diff, probe, PCA, and most new ones)."""

    name: ClassVar[str]
    label: ClassVar[str]
    Settings: ClassVar[type]
    steering: ClassVar[str] = "static"

    def steers(self, handle, vector: SteeringVector, alpha: float, *, layer: int | None = None,
               relative: bool = False, positions: str | None = None) -> list:
        return static_steers(handle, vector, alpha, layer=layer, relative=relative, positions=positions)


# ====================================================================== registry
# Built-in methods, imported on first use: name -> "module:attribute".
_BUILTIN: dict[str, str] = {
    "mean-diff": "steer_ui.methods.mean_diff:METHOD",
    "probe": "steer_ui.methods.probe:METHOD",
    "pca": "steer_ui.methods.pca:METHOD",
    "iti": "steer_ui.methods.iti:METHOD",
    "tsv": "steer_ui.methods.tsv:METHOD",
    "l2s": "steer_ui.methods.l2s:METHOD",
}
_REGISTRY: dict[str, Any] = dict(_BUILTIN)


class UnknownMethod(SettingsError):
    pass


def register(method: Any, replace: bool = False) -> Any:
    """Add ``method`` (a :class:`Method`) to the registry; returns it, so it works as a class decorator too."""
    if isinstance(method, type):
        method = method()
    for attr in ("name", "label", "Settings", "steering", "train", "steers"):
        if not hasattr(method, attr):
            raise TypeError(f"a method needs '{attr}' (see steer_ui.methods.base.Method)")
    if method.steering not in STEERING_KINDS:
        raise TypeError(f"steering must be one of {STEERING_KINDS}, got {method.steering!r}")
    specs(method.Settings)  # fails now, not at the first request, on an unsupported field type
    if method.name in _REGISTRY and not replace:
        raise ValueError(f"a method named '{method.name}' is already registered")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (tests use it to clean up a toy method); built-ins come back as they were."""
    if name in _BUILTIN:
        _REGISTRY[name] = _BUILTIN[name]
    else:
        _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get(name: str) -> Any:
    """The method registered as ``name``; :class:`UnknownMethod` (naming the choices) otherwise."""
    entry = _REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        raise UnknownMethod(f"unknown method {str(name)[:80]!r} (choose from {', '.join(_REGISTRY)})")
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = _REGISTRY[name] = getattr(import_module(module), attr)
    return entry


def all_methods() -> list[Any]:
    return [get(n) for n in names()]


def method_of(vector: SteeringVector) -> Any | None:
    """The registered method that made ``vector``, or None (random directions, vectors from other tools)."""
    return get(vector.method) if vector.method in _REGISTRY else None


def build_steers(handle, vector: SteeringVector, alpha: float, *, layer: int | None = None, relative: bool = False,
                 positions: str | None = None) -> list:
    """Hook specs for ``vector`` at ``alpha``: through its method's ``steers``, else as fixed directions."""
    method = method_of(vector)
    make = method.steers if method is not None else static_steers
    return make(handle, vector, alpha, layer=layer, relative=relative, positions=positions)
