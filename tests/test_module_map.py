"""The module map in docs/developer.md is true: the import graph between files, derived here from
the sources (Rust ``use crate::`` / ``super::`` / ``self::`` paths and child-module paths, with
``pub use`` re-exports followed to the file that defines the item and not counted as imports of
the re-exporting file; Python ``import`` and ``from``
statements anywhere in a module, with package re-exports followed), has no cycle in any crate or
package, every file sits in one layer of the map, and every import points to the same layer or
one below. Nothing here lists files: a file moved, added or removed shows up as a failure that
names it and the map row to change."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "developer.md"
PY_ROOT = ROOT / "pyddstore" / "python"


# -- the map ----------------------------------------------------------------------------------


def read_map() -> dict[str, list[tuple[int, list[str]]]]:
    """Per section (the directory in its heading's backticks): (layer, file patterns) rows."""
    text = MAP.read_text()
    start = text.index("## Module map")
    end = text.find("\n## ", start + 1)
    sections: dict[str, list[tuple[int, list[str]]]] = {}
    current = None
    for line in text[start : end if end > 0 else None].splitlines():
        heading = re.match(r"^### .*?`([^`]+)`", line)
        if heading:
            current = heading.group(1).rstrip("/")
            sections[current] = []
            continue
        row = re.match(r"^\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row and current is not None:
            sections[current].append((int(row.group(1)), re.findall(r"`([^`]+)`", row.group(2))))
    return sections


def specificity(pattern: str) -> tuple[int, int]:
    """How narrowly a row's pattern names files: a plain name above any wildcard, then the
    longer fixed part (`torch/_dataset.py` over `torch/_*.py` over `*.py`)."""
    wild = any(c in pattern for c in "*?[")
    return (0 if wild else 1, len(re.sub(r"[*?]|\[[^]]*\]", "", pattern)))


def layer_of(rows: list[tuple[int, list[str]]], rel: str) -> int | None:
    """The layer of the most specific row that names `rel` (None: no row does)."""
    found = [
        (specificity(p), layer) for layer, patterns in rows for p in patterns if fnmatch.fnmatchcase(rel, p)
    ]
    return max(found)[1] if found else None


def ambiguous(rows: list[tuple[int, list[str]]], files) -> list[str]:
    """Files two equally specific rows of different layers name."""
    out = []
    for rel in files:
        found = [
            (specificity(p), layer)
            for layer, patterns in rows
            for p in patterns
            if fnmatch.fnmatchcase(rel, p)
        ]
        best = max(found, default=None)
        if best and any(s == best[0] and layer != best[1] for s, layer in found):
            out.append(rel)
    return sorted(out)


# -- Rust -------------------------------------------------------------------------------------


def rust_crates() -> list[Path]:
    """Every crate of the workspace with a library: its src directory."""
    found = []
    for toml in sorted(ROOT.glob("**/Cargo.toml")):
        rel = toml.relative_to(ROOT).parts
        if "target" in rel or any(p.startswith(".") for p in rel):
            continue
        if (toml.parent / "src" / "lib.rs").exists():
            found.append(toml.parent / "src")
    return found


def rust_modules(src: Path) -> dict[tuple[str, ...], Path]:
    mods = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib"):
            parts = parts[:-1]
        mods[tuple(parts)] = f
    return mods


def rust_code(f: Path) -> str:
    """The file without comments, string literals and its inline test module."""
    text = f.read_text()
    text = re.sub(r'r#*"(?:.|\n)*?"#*|"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests\b", text)
    return text[: cut.start()] if cut else text


def expand_use(spec: str) -> list[str]:
    """`a::{b, c::{d, e as f}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    spec = re.sub(r"\s+", " ", spec).strip()
    if "{" not in spec:
        return [spec.split(" as ")[0].strip()]
    i = spec.index("{")
    prefix, inner = spec[:i], spec[i + 1 : spec.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += (ch == "{") - (ch == "}")
        cur += ch
    parts.append(cur)
    return [prefix + q for p in parts if p.strip() for q in expand_use(p.strip())]


PATH = re.compile(r"\b(?:crate|super|self)(?:::\w+)+")


def rust_graph(src: Path) -> dict[str, set[str]]:
    mods = rust_modules(src)
    code = {m: rust_code(f) for m, f in mods.items()}

    def resolve(mod, path, reexports):
        segs = path.replace(" ", "").split("::")
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] == "super":
            base, rest = mod, segs
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            # Inside an inline `mod x { ... }`, `super` is the file's own module: a module path
            # that is not below `base` is looked for below the deeper modules of the file.
            if rest and base + (rest[0],) not in mods:
                deeper = [mod[:k] for k in range(len(base) + 1, len(mod) + 1)]
                base = next((d for d in deeper if d + (rest[0],) in mods), base)
        elif segs[0] == "self":
            base, rest = mod, segs[1:]
        elif mod + (segs[0],) in mods:  # a child module, named from its parent
            base, rest = mod, segs
        else:
            return None
        for k in range(len(rest), -1, -1):
            if base + tuple(rest[:k]) in mods:
                found, rest = base + tuple(rest[:k]), rest[k:]
                break
        else:
            return None
        seen = set()
        while rest and rest[0] in reexports.get(found, {}) and found not in seen:
            seen.add(found)
            found, rest = reexports[found][rest[0]], rest[1:]
        return found

    # A `pub use` re-export is followed to the defining file (below), not an import of its own.
    reexport_stmt = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+[^;]+;")
    own = {m: reexport_stmt.sub("", text) for m, text in code.items()}
    uses = {
        m: [p for spec in re.findall(r"\buse\s+([^;]+);", text) for p in expand_use(spec)]
        for m, text in own.items()
    }
    reexports: dict = {}
    for m, text in code.items():
        for spec in re.findall(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
            for p in expand_use(spec):
                target = resolve(m, p, {})
                if target is not None and target != m:
                    reexports.setdefault(m, {})[p.split("::")[-1]] = target
    name = lambda m: str(mods[m].relative_to(src))  # noqa: E731
    graph = {}
    for m, text in own.items():
        # Paths through a child module, named from its parent (`store::PyStore` in lib.rs).
        children = [c[-1] for c in mods if c[:-1] == m and c != m]
        child_paths = [p for c in children for p in re.findall(rf"(?<![\w:]){c}(?:::\w+)+", text)]
        targets = {resolve(m, p, reexports) for p in uses[m] + PATH.findall(text) + child_paths}
        graph[name(m)] = {name(t) for t in targets if t is not None and t != m}
    for f, targets in method_call_edges(src).items():
        graph[f] |= targets
    return graph


def braced(text: str, open_at: int) -> str:
    """The text inside the braces that open at `open_at`."""
    depth = 0
    for j in range(open_at, len(text)):
        depth += (text[j] == "{") - (text[j] == "}")
        if depth == 0:
            return text[open_at + 1 : j]
    return text[open_at + 1 :]


# Method names the standard library's types have too: `.trim(` on a `str` is not a call into the
# one crate file that happens to define a `trim`.
STD_METHODS = {"trim", "clear", "get", "insert", "remove", "push", "pop", "len", "iter", "take", "next"}
STD_METHODS |= {"drain", "extend", "contains", "retain", "split", "join", "map", "read", "write"}
STD_METHODS |= {"send", "recv", "lock", "wait", "flush", "reset", "close", "release", "hold"}

IMPL = re.compile(r"(#\[pymethods\]\s*)?\bimpl\b(?:\s*<[^{]*?>)?\s+([\w:]+)(?:<[^{]*?>)?\s*(?:where[^{]*)?\{")


def method_call_edges(src: Path) -> dict[str, set[str]]:
    """Edges a `use` does not show: a file calling a method that another file adds to a type
    defined elsewhere (`impl PyStore { fn read_indexed .. }` in store/read.rs, called as
    `store.read_indexed(..)` from store/device.rs). Only names defined once in the crate count, and
    not between the files that make up one type (its home and the files extending it), nor
    `#[pymethods]` (called from Python)."""
    mods = rust_modules(src)
    code = {str(f.relative_to(src)): rust_code(f) for f in mods.values()}
    homes: dict[str, set[str]] = {}
    defined: dict[str, set[str]] = {}
    for f, text in code.items():
        for ty in re.findall(r"\b(?:struct|enum|union|type)\s+(\w+)", text):
            homes.setdefault(ty, set()).add(f)
        for name in re.findall(r"\bfn\s+(\w+)", text):
            defined.setdefault(name, set()).add(f)
    added: dict[str, tuple[str, str]] = {}  # method -> (file adding it, its type)
    unit: dict[str, set[str]] = {}  # type -> its home and the files extending it
    for f, text in code.items():
        for m in IMPL.finditer(text):
            ty = m.group(2).split("::")[-1]
            if m.group(1) or f in homes.get(ty, {f}):
                continue
            unit.setdefault(ty, set(homes[ty])).add(f)
            depth = 0
            for tok in re.finditer(r"[{}]|\bfn\s+(\w+)", braced(text, m.end() - 1)):
                depth += (tok.group(0) == "{") - (tok.group(0) == "}")
                name = tok.group(1)
                if name and depth == 0 and defined[name] == {f} and name not in STD_METHODS:
                    added[name] = (f, ty)
    edges: dict[str, set[str]] = {}
    for name, (target, ty) in added.items():
        call = re.compile(rf"(?:\.|::)\s*{name}\s*(?:::<[^>]*>)?\(")
        for f, text in code.items():
            if f not in unit[ty] and call.search(text):
                edges.setdefault(f, set()).add(target)
    return edges


# -- Python -----------------------------------------------------------------------------------


def py_graph(pkg: Path) -> dict[str, set[str]]:
    """Edges between the modules of package `pkg` (and its subpackages), by file."""
    files = {}
    for f in pkg.rglob("*.py"):
        parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    for f in pkg.rglob("*.pyi"):  # extension modules (_native) are leaves
        files.setdefault(".".join(f.relative_to(pkg.parent).with_suffix("").parts), f)
    trees = {m: ast.parse(f.read_text()) for m, f in files.items() if f.suffix == ".py"}

    def absolute(m, node):
        if node.level == 0:
            return node.module
        base = m.split(".") if files[m].name == "__init__.py" else m.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def runtime_imports(tree):
        """Every import statement except those under `if TYPE_CHECKING:`."""
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for b in node.body for n in ast.walk(b))
        imports = (ast.Import, ast.ImportFrom)
        return [n for n in ast.walk(tree) if isinstance(n, imports) and id(n) not in skip]

    reexports: dict = {}
    for m, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                source = absolute(m, node)
                for a in node.names:
                    target = f"{source}.{a.name}" if f"{source}.{a.name}" in files else source
                    if target in files:
                        reexports.setdefault(m, {})[a.asname or a.name] = target
    graph = {}
    for m, tree in trees.items():
        out = set()
        for node in runtime_imports(tree):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in files)
                continue
            source = absolute(m, node)
            if source not in files:
                continue
            for a in node.names:
                target, name, seen = source, a.name, set()
                if f"{source}.{name}" in files:
                    out.add(f"{source}.{name}")
                    continue
                while name in reexports.get(target, {}) and target not in seen:
                    seen.add(target)
                    target = reexports[target][name]
                out.add(target)
        out.discard(m)
        graph[m] = out
    rel = lambda m: str(files[m].relative_to(pkg))  # noqa: E731
    out = {rel(m): set() for m in files}  # extension stubs too: they are imported
    out.update({rel(m): {rel(t) for t in ts} for m, ts in graph.items()})
    return out


def py_packages() -> list[Path]:
    return sorted(p.parent for p in PY_ROOT.glob("*/__init__.py"))


# -- checks -----------------------------------------------------------------------------------


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one file (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def subpackage_graph(graph: dict[str, set[str]], sub: str) -> dict[str, set[str]]:
    """The edges between the files of subpackage `sub` (a folder of the package), its paths."""
    cut = len(sub) + 1
    inside = lambda f: f.startswith(sub + "/")  # noqa: E731
    return {f[cut:]: {t[cut:] for t in ts if inside(t)} for f, ts in graph.items() if inside(f)}


def units() -> list[tuple[str, dict[str, set[str]]]]:
    """(directory relative to the repository, import graph) of every crate and package, and of
    every subpackage the map gives a section of its own (its layers among its own files)."""
    out = [(str(src.relative_to(ROOT)), rust_graph(src)) for src in rust_crates()]
    sections = read_map()
    for pkg in py_packages():
        graph = py_graph(pkg)
        out.append((str(pkg.relative_to(ROOT)), graph))
        for sub in sorted(p.parent for p in pkg.glob("*/__init__.py")):
            where = str(sub.relative_to(ROOT))
            if where in sections:
                out.append((where, subpackage_graph(graph, str(sub.relative_to(pkg)))))
    return out


UNITS = units()


@pytest.mark.parametrize("where,graph", UNITS, ids=[u[0] for u in UNITS])
def test_no_import_cycle_between_files(where, graph):
    found = cycles(graph)
    assert not found, f"{where}: import cycles between files: {found}"


@pytest.mark.parametrize("where,graph", UNITS, ids=[u[0] for u in UNITS])
def test_imports_follow_the_module_map(where, graph):
    sections = read_map()
    assert where in sections, f"docs/developer.md's module map has no section for `{where}`"
    rows = sections[where]
    unmapped = sorted(f for f in graph if layer_of(rows, f) is None)
    assert not unmapped, f"{where}: files the module map does not place in a layer: {unmapped}"
    stale = [p for _, patterns in rows for p in patterns if not any(fnmatch.fnmatchcase(f, p) for f in graph)]
    assert not stale, f"{where}: module map rows name no file: {stale}"
    both = ambiguous(rows, graph)
    assert not both, f"{where}: files two equally specific rows place in different layers: {both}"
    upward = upward_imports(rows, graph)
    assert not upward, f"{where}: imports against the map's layering:\n" + "\n".join(upward)


def upward_imports(rows: list[tuple[int, list[str]]], graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} (layer {layer_of(rows, a)}) imports {b} (layer {layer_of(rows, b)})"
        for a, targets in graph.items()
        for b in targets
        if layer_of(rows, b) > layer_of(rows, a)
    )


# -- what torch/ may use of the package ---------------------------------------------------------

PKG = PY_ROOT / "pyddstore"
# The store's class and the classes it is made of (their private names are the store's).
STORE_FILES = ("_store.py", "_store_internals.py", "_collectives.py", "_profile.py", "_attach.py")
STORE_CLASSES = {"PyDDStore", "StoreInternals", "StoreCollectives", "ProfileCounters"}


def internal_api() -> list[str]:
    """The store's internal API that docs/developer.md says torch/ may use."""
    text = MAP.read_text()
    line = next(x for x in text.splitlines() if "internal API (`_store_internals.py`):" in x)
    return re.findall(r"`(_\w+)`", line.split("internal API (`_store_internals.py`):", 1)[1])


def store_private_names() -> set[str]:
    """Private methods of the store's classes and the private attributes the store files set on a
    store (`self._x = ...`, `store._x = ...`)."""
    names = set()
    for f in STORE_FILES:
        tree = ast.parse((PKG / f).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in STORE_CLASSES:
                names |= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                names |= {
                    n.target.id
                    for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                }
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def torch_private_uses() -> list[str]:
    """torch/'s uses of the package it may not make: a private store attribute outside the
    internal API (on anything but `self`), or a private name (not a module) of a package module."""
    private, allowed = store_private_names(), set(internal_api())
    found = []
    for f in sorted((PKG / "torch").glob("*.py")):
        tree = ast.parse(f.read_text())
        where = f"torch/{f.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private - allowed:
                if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("pyddstore")
            ):
                if node.module.startswith("pyddstore.torch"):
                    continue
                folder = PY_ROOT.joinpath(*node.module.split("."))
                for a in node.names:
                    is_module = (folder / f"{a.name}.py").exists() or (folder / f"{a.name}.pyi").exists()
                    if a.name.startswith("_") and not is_module:
                        found.append(f"{where}:{node.lineno}: from {node.module} import {a.name}")
    return found


def test_torch_uses_the_store_api_only():
    """torch/ reaches a store through its public methods and the internal API the map lists,
    and imports no private name of the package (docs/developer.md, pyddstore.torch section)."""
    api = internal_api()
    assert api, "docs/developer.md names no internal API of the store"
    tree = ast.parse((PKG / "_store_internals.py").read_text())
    defined = {
        n.name
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for n in c.body
        if isinstance(n, ast.FunctionDef)
    }
    assert set(api) <= defined, (
        f"the map names methods _store_internals.py lacks: {sorted(set(api) - defined)}"
    )
    private = store_private_names()
    assert {"_native", "_ragged_units", "_publisher"} <= private, "the store's private names were not found"
    found = torch_private_uses()
    assert not found, "torch/ uses private parts of the store or the package:\n" + "\n".join(found)


def test_the_graph_is_derived_from_the_sources():
    """The parser finds edges it must find (a check that the checks above check something)."""
    core = dict(UNITS)["ddstore-core/src"]
    assert "error.rs" in core["layout.rs"] and "store/mod.rs" in core["store/rows.rs"]
    package = dict(UNITS)["pyddstore/python/pyddstore"]
    assert "_errors.py" in package["_store.py"] and "_native.pyi" in package["_kinds.py"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # A method another file adds to a type is an edge (no `use` names the file).
    assert "store/read.rs" in dict(UNITS)["pyddstore/src"]["store/device.rs"]
    # The most specific row wins: a torch file imported from below its layer is caught.
    torch_rows = read_map()["pyddstore/python/pyddstore/torch"]
    torch = dict(UNITS)["pyddstore/python/pyddstore/torch"]
    assert "_schema.py" in torch["_agree.py"]
    assert upward_imports(torch_rows, {**torch, "_windowed.py": {"_dataset_reader.py"}})
    assert layer_of([(3, ["torch/*.py"]), (1, ["torch/_field.py"])], "torch/_field.py") == 1
    assert ambiguous([(3, ["torch/_a.py"]), (1, ["torch/_a.py"])], ["torch/_a.py"]) == ["torch/_a.py"]
