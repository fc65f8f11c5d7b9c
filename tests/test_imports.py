"""The package's shape: no import cycles, standard-library imports at module top, one site list."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("webrl_core", "webrl_cli", "flows", "tasks", "benchmarks")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that ``name`` imports anywhere (module level or inside a function), with the packages Python
    imports on the way (``import a.b.c`` runs ``a/__init__`` and ``a/b/__init__``) unless ``name`` is inside
    them (a package's own modules run while it is being imported)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            parts = t.split(".")
            prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            out |= {p for p in prefixes if p in modules and (p == t or not name.startswith(p + "."))}
    out.discard(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert len(graph) > 50
    assert "webrl_core.pipeline.stage" in graph["tasks.stages"]  # the walk sees real edges
    assert _cycles(graph) == []


def test_standard_library_imports_sit_at_module_top():
    late = []
    for name, path in _modules().items():
        if name.split(".")[0] not in ("webrl_core", "benchmarks"):
            continue
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                late += [f"{path.relative_to(ROOT)}:{node.lineno} {m}" for m in mods
                         if m.split(".")[0] in sys.stdlib_module_names]
    assert late == []


def test_the_site_list_is_defined_once():
    sites = {"shopping", "shopping_admin", "reddit", "gitlab", "map"}
    listings = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if len(names & sites) >= 4:
                    listings.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert listings == ["webrl_core/websites.py:17"]


# webrl_core's layers, lowest first: a module may import its own layer and the layers below, never one above.
# Layer 0 is the package's top-level modules (settings, identities, the site list, the prompt and policy formats).
LAYERS = ["", "runs", "env", "sites", "learn", "agent", "scale", "pipeline", "experiments"]
APPS = ("tasks", "flows", "webrl_cli", "benchmarks")  # above the library: Prefect tasks, flows, the CLI, benchmarks


def _layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] in APPS:
        return len(LAYERS)
    sub = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""
    return LAYERS.index(sub)


def test_lower_layers_never_import_upper_ones():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        for dep in _imports(name, path, modules):
            if _layer(dep) > _layer(name):
                upward.append(f"{name} -> {dep}")
    assert _layer("webrl_core.runs.store") == 1 and _layer("webrl_core.config") == 0  # the walk sees the layers
    assert _layer("webrl_core.pipeline") == LAYERS.index("pipeline")
    assert upward == []


def test_the_library_imports_none_of_the_applications():
    """The library (webrl_core) imports neither the benchmarks nor the Prefect tasks, flows or CLI, not even
    lazily inside a function; they import it."""
    modules = _modules()
    assert "benchmarks.orm" in _imports("webrl_cli.bench_cmd", modules["webrl_cli.bench_cmd"], modules)  # lazy ones
    above = [f"{name} -> {dep}" for name, path in modules.items() if name.split(".")[0] == "webrl_core"
             for dep in _imports(name, path, modules) if dep.split(".")[0] in APPS]
    assert above == []


def test_webrl_core_top_level_holds_at_most_thirteen_modules():
    top = sorted(p.stem for p in (ROOT / "webrl_core").glob("*.py") if p.stem != "__init__")
    subpackages = {p.parent.name for p in (ROOT / "webrl_core").glob("*/__init__.py")}
    # the config is three of them: the schema (config), its sections (config_sections: each file <= 600 lines) and
    # the loader (config_loader)
    assert len(top) <= 13, top
    assert subpackages == set(LAYERS[1:]), subpackages  # every subpackage has its place in the layers
