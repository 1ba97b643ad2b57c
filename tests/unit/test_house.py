"""The house rules, checked on the code's own imports (parsed, not run), so the structure stays clean.

* no import cycles among modules of ``steer_ui`` (a function-level import counts too);
* gradio and ``steer_ui.ui`` are imported only inside ``steer_ui/ui/``;
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
    found: set[str] = set()
    for node in ast.walk(TREES[name]):
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
