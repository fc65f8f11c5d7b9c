"""What code a stage runs, as a digest that moves and renames of files do not change.

A cached stage result is valid while the code that produced it is unchanged. "The code" is not the bytes of the
files: moving a function to another module, splitting a file, editing a docstring, a comment or an import line
changes no result, and must not make a stored run train again. So the identity of a stage is

    identity(stage) = sha256( sorted{ normalise(d) : d in reach(stage) } )

where ``reach(stage)`` is the set of the library's top-level definitions (functions, classes, assignments) the
stage's function refers to, directly or through the definitions it reaches, and ``normalise(d)`` is the
definition's syntax tree (``ast.dump``) without docstrings and import statements, its functions' local variables
renamed by order of first binding (renaming a local changes nothing it computes). A reference is a name, or an
attribute of a name bound to a library module (``T.foo``); it resolves as Python binds it: to the referring
module's definition of that name, else to what its import statements (anywhere in it) bind the name to, following
re-exports; a name bound by several imports resolves to each. Names bound to nothing of the library (locals,
builtins, other packages) reach nothing. A string constant that is a library module's name (an f-string prefix
such as ``webrl_core.sites.``) or a command's ``-m webrl_core.scale.launch`` reaches every definition of the modules
it names: code started in another process counts. A module's statements that define nothing (``if __name__ ==
"__main__": ...``) belong to every definition of it, and so do the data files it names beside it (a page script,
templates, a prompt format: ``_data_files``).

The module path of a definition is not part of its identity, so a stage keeps its identity through moves; a
change to any line it can run (a body, a default, a decorator, a constant) gives it a new one, and a change to
code it cannot reach does not.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

MODULE_STRING = re.compile(r"^webrl_core(?:\.\w+)+\.?$|(?<=-m )webrl_core(?:\.\w+)+")
"""A string constant that is a library module's name (``import_module``'s argument, an f-string's prefix such as
``webrl_core.sites.``), or a command line's ``-m`` target; a module named in prose (a help text) is not code."""


@dataclass
class _Module:
    name: str
    aliases: dict[str, set[tuple[str, str | None]]] = field(default_factory=dict)  # name -> {(module, attribute)}
    unnamed: list[str] = field(default_factory=list)  # normalised statements that define no name
    defined: dict[str, list["_Definition"]] = field(default_factory=dict)


@dataclass
class _Definition:
    module: str
    dump: str
    names: set[str]  # names it refers to
    attributes: set[tuple[str, str]]  # (name, attribute) pairs it refers to: ``T.foo``
    modules: set[str]  # library modules named in its string constants (prefixes end with ".")


def _strip(node: ast.AST) -> ast.AST:
    """``node`` without docstrings (of modules, classes, functions and assignments) and import statements (neither
    changes what the code computes)."""
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if not isinstance(body, list):
            continue
        n.body = [s for s in body if not isinstance(s, (ast.Import, ast.ImportFrom)) and not _is_docstring(s)] \
            or [ast.Pass()]
    return node


COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _rename_locals(node: ast.AST, depth: int = 0) -> ast.AST:
    """``node`` with the local variables of every function and comprehension (each its own scope, as in Python)
    renamed by order of first binding (``_v<depth>_<i>``): a local's name is not what the code computes.
    Parameters, globals and attributes keep their names (a caller, or another module, sees those)."""
    for child in ast.iter_child_nodes(node):
        _rename_locals(child, depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                                         *COMPREHENSIONS)))
    if isinstance(node, COMPREHENSIONS):
        binders: list[ast.AST] = [n for g in node.generators for n in ast.walk(g.target)]
        keep: set[str] = set()
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        keep = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
        keep |= {n for s in ast.walk(node) if isinstance(s, (ast.Global, ast.Nonlocal)) for n in s.names}
        binders = list(ast.walk(node))
    else:
        return node
    order: dict[str, str] = {}
    for n in binders:
        bound = n.id if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load) else \
            n.name if isinstance(n, ast.ExceptHandler) else None
        if bound and bound not in keep and not bound.startswith("_v") and bound not in order:
            order[bound] = f"_v{depth}_{len(order)}"
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in order:
            n.id = order[n.id]
        elif isinstance(n, ast.ExceptHandler) and n.name in order:
            n.name = order[n.name]
    return node


def _is_docstring(stmt: ast.stmt) -> bool:
    """A bare string statement: a docstring of a module, class or function, or of the assignment above it."""
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _defined_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _references(node: ast.AST) -> tuple[set[str], set[tuple[str, str]], set[str]]:
    names: set[str] = set()
    attributes: set[tuple[str, str]] = set()
    modules: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            attributes.add((n.value.id, n.attr))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            modules |= set(MODULE_STRING.findall(n.value))
    return names, attributes, modules


def _aliases(tree: ast.Module, name: str, is_package: bool,
             known: set[str]) -> dict[str, set[tuple[str, str | None]]]:
    """The names the module's import statements (anywhere in it: a name a function imports is bound there too)
    bind to library modules or their members: ``import a.b as m`` -> (a.b, None); ``from a import b`` -> (a.b, None)
    if a.b is a module, else (a, b)."""
    out: dict[str, set[tuple[str, str | None]]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.asname and a.name in known:
                    out.setdefault(a.asname, set()).add((a.name, None))
                elif not a.asname and a.name.split(".")[0] in known:
                    out.setdefault(a.name.split(".")[0], set()).add((a.name.split(".")[0], None))
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - n.level + 1] + ([base] if base else []))
            if base not in known:
                continue
            for a in n.names:
                sub = f"{base}.{a.name}"
                out.setdefault(a.asname or a.name, set()).add((sub, None) if sub in known else (base, a.name))
    return out


OPAQUE = frozenset({"library_source_digest"})
"""Definitions outside every identity: the digest of the library names output versions (``rundir.output_key``) and
computes no result; counting it would make every stage's identity depend on how identities are computed."""


class CodeIndex:
    """The top-level definitions of the package at ``root`` (a folder named like the package, e.g. webrl_core)."""

    def __init__(self, root: Path):
        root = Path(root)
        files = {}
        for f in sorted(root.rglob("*.py")):
            parts = (root.name, *f.relative_to(root).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
        known = set(files)
        self.modules: dict[str, _Module] = {}
        for name, f in files.items():
            tree = ast.parse(f.read_text(), str(f))
            module = self.modules[name] = _Module(name, _aliases(tree, name, f.name == "__init__.py", known))
            module.unnamed += _data_files(tree, f.parent)
            for stmt in _strip(tree).body:
                if isinstance(stmt, ast.Pass):
                    continue
                _rename_locals(stmt)
                dump = ast.dump(stmt, annotate_fields=False)
                defined = _defined_names(stmt)
                if not defined:
                    module.unnamed.append(dump)
                definition = _Definition(name, dump, *_references(stmt))
                for d in (n for n in defined if n not in OPAQUE):
                    module.defined.setdefault(d, []).append(definition)

    def _member(self, module: str, name: str, depth: int = 0) -> list[_Definition]:
        """What ``module.name`` is: its definitions there, else what the module imported under that name."""
        m = self.modules.get(module)
        if m is None or depth > 20:
            return []
        if name in m.defined:
            return m.defined[name]
        out: list[_Definition] = []
        for target, attr in sorted(m.aliases.get(name, ()), key=str):
            out += self._module_definitions(target) if attr is None else self._member(target, attr, depth + 1)
        return out

    def _module_definitions(self, module: str) -> list[_Definition]:
        # a module object passed around as a value: everything in it
        return [d for ds in self.modules[module].defined.values() for d in ds] if module in self.modules else []

    def _resolve(self, d: _Definition) -> list[_Definition]:
        module = self.modules[d.module]
        out: list[_Definition] = []
        for n in d.names:  # a name: a definition of the module, or a member it imported (not a module itself)
            if n in module.defined:
                out += module.defined[n]
            else:
                for target, attr in module.aliases.get(n, ()):
                    if attr is not None:
                        out += self._member(target, attr)
        for base, attr in d.attributes:  # module.attribute, through every module the name is bound to
            if base in module.defined:
                continue
            for target, member in module.aliases.get(base, ()):
                if member is None:
                    sub = f"{target}.{attr}"
                    out += self._module_definitions(sub) if sub in self.modules else self._member(target, attr)
        for prefix in d.modules:
            for m in self.modules:
                if m == prefix or m.startswith(prefix.rstrip(".") + "."):
                    out += self._module_definitions(m)
        return out

    def reach(self, module: str, name: str) -> list[str]:
        """The normalised definitions (and their modules' unnamed statements) reachable from ``module.name``."""
        todo = list(self.modules[module].defined.get(name, [])) if module in self.modules else []
        if not todo:
            raise KeyError(f"{module}.{name} is not a top-level definition of the library")
        seen: set[int] = set()
        out: list[str] = []
        whole_modules: set[str] = set()
        while todo:
            d = todo.pop()
            if id(d) in seen:
                continue
            seen.add(id(d))
            out.append(d.dump)
            if d.module not in whole_modules:
                whole_modules.add(d.module)
                out.extend(self.modules[d.module].unnamed)
            todo.extend(self._resolve(d))
        return out

    def identity(self, module: str, name: str) -> str:
        """sha256 of what ``module.name`` can run (see the module docstring)."""
        return _digest(self.reach(module, name))

    def library_identity(self) -> str:
        """sha256 of every definition of the package, wherever it lives."""
        return _digest(list({id(d): d.dump for m in self.modules.values() for ds in m.defined.values()
                             for d in ds}.values()) + [s for m in self.modules.values() for s in m.unnamed])


DATA_NAME = re.compile(r"^[\w-]+(\.[\w-]+)*$")
NOT_CODE = (".py", ".pyc", ".yaml", ".yml")
"""Suffixes a data file's digest leaves out: Python is read as code; YAML is configuration, whose values reach a
stage as its inputs (the config sections it declares)."""


def _data_files(tree: ast.Module, folder: Path) -> list[str]:
    """The content of the data files a module names beside it (``with_name("observation.js")``, ``HERE /
    "templates"``: a string constant that is the name of a file or folder in the module's folder): a page script,
    a template or a prompt format is code the module runs. A folder counts with every file under it; a package (a
    folder with an ``__init__.py``, say a config section called "env") is not data."""
    out = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Constant) and isinstance(n.value, str) and DATA_NAME.match(n.value)):
            continue
        path = folder / n.value
        if not path.exists() or (path / "__init__.py").exists():
            continue
        files = [x for x in (sorted(path.rglob("*")) if path.is_dir() else [path])
                 if x.is_file() and x.suffix not in NOT_CODE]
        if files:
            h = hashlib.sha256()
            for x in files:
                h.update(x.relative_to(folder).as_posix().encode() + b"\0" + x.read_bytes() + b"\0")
            out.append(f"data {h.hexdigest()}")
    return sorted(set(out))


def _digest(dumps: list[str]) -> str:
    h = hashlib.sha256()
    for d in sorted(dumps):
        h.update(d.encode() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def library_index() -> CodeIndex:
    """The index of this checkout's library (``webrl_core``)."""
    return CodeIndex(Path(__file__).resolve().parents[1])


def stage_identity(stage_fn) -> str:
    """The identity of the code ``stage_fn`` (a library function) can run."""
    return library_index().identity(stage_fn.__module__, stage_fn.__name__)
