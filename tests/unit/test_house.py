"""The house rules, checked on the code's own imports (parsed, not run), so the structure stays clean.

* no import cycles among modules of ``steer_ui`` (a function-level import counts too);
* the layers: fronts (``steer_ui/ui/``, ``steer_ui/cli.py``, ``app.py``) -> the door (``steer_ui/service.py``) ->
  the rooms (``steer_ui/rooms/``) -> the core (model, store, methods, data, ...); no import runs upward, and no
  front reaches past the door into a room, neither by an import nor through the door's attributes
  (``backend.lessons.explode(...)``);
* gradio and ``steer_ui.ui`` are imported only inside ``steer_ui/ui/``;
* no class in ``steer_ui`` is over 400 lines, and the door stays thin (300 lines);
* ``steer_ui.tools`` (benchmark, report builders) is imported only by the CLI (and ``__main__`` aliases);
* nothing in ``steer_ui/methods/`` takes argparse;
* forward hooks are registered only by the activation reader, the interventions and the prefix engine;
* method names are compared as strings outside ``steer_ui/methods/`` at most twice.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "steer_ui"
HOOK_OWNERS = {"steer_ui.model.capture", "steer_ui.model.hooks", "steer_ui.model.prefix"}
METHOD_NAMES = {"mean-diff", "probe", "pca", "iti", "tsv", "l2s"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def imports_of(name: str) -> set[str]:
    """Every module (of any package) that ``name`` imports, resolved to the longest known module name."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    return imports_in(TREES[name], package)


def imports_in(tree: ast.AST, package: str) -> set[str]:
    """Every module that the parsed module ``tree``, a module of ``package``, imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:  # "from . import x" imports the module x
                if f"{target}.{alias.name}" in MODULES:
                    found.add(f"{target}.{alias.name}")
    return found


GRAPH = {name: {m for m in imports_of(name) if m in MODULES and m != name} for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_sees_a_cycle_when_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert "steer_ui.model.units" in GRAPH["steer_ui.model.handle"]  # a function-level import is an edge


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("forbidden, allowed_prefix", [("gradio", "steer_ui.ui"), ("steer_ui.ui", "steer_ui.ui"),
                                                       ("steer_ui.tools", "steer_ui.tools")])
def test_layers_stay_in_their_rooms(forbidden, allowed_prefix):
    # the CLI dispatches to tools, and a __main__ alias may run one; neither is imported by the runtime
    allowed_extra = {"steer_ui.cli"} if forbidden == "steer_ui.tools" else set()
    offenders = sorted(name for name in MODULES
                       if not name.startswith(allowed_prefix) and name not in allowed_extra
                       and not (forbidden == "steer_ui.tools" and name.endswith(".__main__"))
                       and any(m == forbidden or m.startswith(forbidden + ".") for m in imports_of(name)))
    assert offenders == []


def test_methods_take_no_argparse():
    offenders = [name for name in MODULES if name.startswith("steer_ui.methods")
                 and any(m == "argparse" for m in imports_of(name))]
    assert offenders == []
    for name in MODULES:
        if name.startswith("steer_ui.methods"):
            for node in ast.walk(TREES[name]):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    assert not node.name.endswith("from_args"), f"{name}.{node.name} takes CLI arguments"


def test_forward_hooks_only_in_the_reader_the_interventions_and_the_prefix_engine():
    offenders = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("register_forward_hook", "register_forward_pre_hook"):
                if name not in HOOK_OWNERS:
                    offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_method_names_are_not_branched_on_outside_methods():
    hits = []
    for name, tree in TREES.items():
        if name.startswith("steer_ui.methods"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for part in [node.left, *node.comparators]:
                    values = part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [part]
                    if any(isinstance(v, ast.Constant) and v.value in METHOD_NAMES for v in values):
                        hits.append(f"{name}:{node.lineno}")
    assert len(hits) <= 2, hits


# ------------------------------------------------------------------ layers
# steer_ui.tools: the benchmark and report builders are clients run by the CLI, as the CLI is one (the bench's /v1
# line serves the API front over a door in its own process); the runtime never imports them (checked above)
FRONTS = ("steer_ui.ui", "steer_ui.cli", "steer_ui.__main__", "steer_ui.openai_api", "steer_ui.tools", "app")
DOOR = ("steer_ui.service", "steer_ui.backend")  # backend: the door's old name, an alias
ROOMS = ("steer_ui.rooms",)
FRONT, DOOR_LAYER, ROOM, CORE = 3, 2, 1, 0
MAX_CLASS_LINES = 400
MAX_DOOR_LINES = 300


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer_of(name: str) -> int:
    if _under(name, FRONTS) or name.endswith(".__main__"):  # an entry point (python -m ...) is a front too
        return FRONT
    if _under(name, DOOR):
        return DOOR_LAYER
    if _under(name, ROOMS):
        return ROOM
    return CORE


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Each import that runs upward (a room or the core importing the door or a front, the core a room), or
    that reaches from a front past the door into a room, as "importer -> imported"."""
    breaks = []
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            if not target.startswith("steer_ui"):
                continue
            here, there = layer_of(importer), layer_of(target)
            if there > here or (here == FRONT and there == ROOM):
                breaks.append(f"{importer} -> {target}")
    return breaks


def _house_graph() -> dict[str, set[str]]:
    """The package's imports and ``app.py``'s (a front outside the package)."""
    graph = {name: set(deps) for name, deps in GRAPH.items()}
    app = ROOT / "app.py"
    graph["app"] = {m for m in imports_in(ast.parse(app.read_text(), filename=str(app)), "") if m in MODULES}
    return graph


def test_the_layer_checker_flags_a_planted_break():
    planted = ast.parse("from ..rooms.explore import Explore\nfrom ..service import Service\n")
    front = {m for m in imports_in(planted, "steer_ui.ui")}  # a tab that reaches past the door
    assert layer_breaks({"steer_ui.ui.some_tab": front}) == ["steer_ui.ui.some_tab -> steer_ui.rooms.explore"]
    upward = imports_in(ast.parse("from ..service import Service\nfrom ..ui import app\n"), "steer_ui.rooms")
    assert layer_breaks({"steer_ui.rooms.explore": upward}) == ["steer_ui.rooms.explore -> steer_ui.service",
                                                                "steer_ui.rooms.explore -> steer_ui.ui",
                                                                "steer_ui.rooms.explore -> steer_ui.ui.app"]
    assert layer_breaks({"steer_ui.model.prefix": {"steer_ui.rooms.models"}}) == [
        "steer_ui.model.prefix -> steer_ui.rooms.models"]
    assert layer_breaks({"steer_ui.ui.app": {"steer_ui.service", "steer_ui.plots"},
                         "steer_ui.service": {"steer_ui.rooms.models"}, "steer_ui.rooms.models": {"steer_ui.model"}}) == []


def test_imports_run_down_the_layers():
    assert layer_breaks(_house_graph()) == []


def test_gradio_stays_out_of_app_py_top_level_and_the_rooms():
    app = ROOT / "app.py"
    assert "gradio" not in imports_in(ast.parse(app.read_text()), "")
    assert [n for n in MODULES if _under(n, ROOMS + DOOR) and "gradio" in imports_of(n)] == []


def long_classes(trees: dict[str, ast.AST], limit: int = MAX_CLASS_LINES) -> list[str]:
    """Every class over ``limit`` lines (its decorators included), as "module.Class: N lines"."""
    out = []
    for name, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                lines = node.end_lineno - start + 1
                if lines > limit:
                    out.append(f"{name}.{node.name}: {lines} lines")
    return out


def test_the_class_length_check_sees_a_long_class():
    body = "\n".join(f"    x{i} = {i}" for i in range(12))
    assert long_classes({"m": ast.parse(f"class Big:\n{body}\n")}, limit=10) == ["m.Big: 13 lines"]
    assert long_classes({"m": ast.parse(f"class Big:\n{body}\n")}, limit=13) == []


def test_no_class_is_over_400_lines_and_the_door_is_thin():
    assert long_classes(TREES) == []
    assert len(MODULES["steer_ui.service"].read_text().splitlines()) <= MAX_DOOR_LINES


# ------------------------------------------------------------------ the door's attributes
DOOR_NAMES = {"backend", "service", "door"}  # what the fronts call the Service they are given
DOOR_PLAIN = {"policy", "max_file_bytes", "workdir"}  # settings and a path: plain values a front may read


def door_rooms(tree: ast.AST) -> set[str]:
    """What ``Service.__init__`` keeps on ``self`` (the rooms and the sessions, guard and keeper they share), less
    the plain values: the attributes a front must not reach through."""
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    kept = {t.attr for node in ast.walk(init) if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return kept - DOOR_PLAIN


def room_reaches(trees: dict[str, ast.AST], rooms: set[str]) -> list[str]:
    """Each ``<door>.<room>`` in the fronts (``backend.sessions.peek(...)``), as "module:line backend.room";
    the door is a name in DOOR_NAMES, alone or as an attribute (``self.backend``)."""
    out = []
    for name, tree in sorted(trees.items()):
        if not _under(name, FRONTS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in rooms:
                door = node.value
                door_name = door.id if isinstance(door, ast.Name) else door.attr if isinstance(door, ast.Attribute) \
                    else None
                if door_name in DOOR_NAMES:
                    out.append(f"{name}:{node.lineno} {door_name}.{node.attr}")
    return out


def test_the_door_check_flags_a_front_that_reaches_a_room_through_the_door():
    rooms = door_rooms(TREES["steer_ui.service"])
    assert {"models", "library", "explore", "training", "lessons", "sessions", "guard", "keeper"} <= rooms
    assert not rooms & DOOR_PLAIN
    planted = ast.parse("def explode(backend, sid):\n"
                        "    backend.lesson('explode', sid)\n"  # through the door: fine
                        "    limit = backend.policy.max_alpha\n"  # a setting: fine
                        "    return backend.lessons.explode(sid), self.service.sessions.peek(sid)\n")
    assert room_reaches({"steer_ui.ui.some_tab": planted}, rooms) == ["steer_ui.ui.some_tab:4 backend.lessons",
                                                                     "steer_ui.ui.some_tab:4 service.sessions"]
    assert room_reaches({"steer_ui.rooms.explore": planted}, rooms) == []  # a room may hold its neighbours


def test_fronts_reach_no_room_through_the_door():
    app = ROOT / "app.py"
    trees = dict(TREES, app=ast.parse(app.read_text(), filename=str(app)))
    assert room_reaches(trees, door_rooms(TREES["steer_ui.service"])) == []
