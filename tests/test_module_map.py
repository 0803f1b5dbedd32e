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


def layer_of(rows: list[tuple[int, list[str]]], rel: str) -> int | None:
    for layer, patterns in rows:
        if any(fnmatch.fnmatchcase(rel, p) for p in patterns):
            return layer
    return None


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
    return graph


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


def units() -> list[tuple[str, dict[str, set[str]]]]:
    """(directory relative to the repository, import graph) of every crate and package."""
    out = [(str(src.relative_to(ROOT)), rust_graph(src)) for src in rust_crates()]
    out += [(str(pkg.relative_to(ROOT)), py_graph(pkg)) for pkg in py_packages()]
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
    upward = sorted(
        f"{a} (layer {layer_of(rows, a)}) imports {b} (layer {layer_of(rows, b)})"
        for a, targets in graph.items()
        for b in targets
        if layer_of(rows, b) > layer_of(rows, a)
    )
    assert not upward, f"{where}: imports against the map's layering:\n" + "\n".join(upward)


def test_the_graph_is_derived_from_the_sources():
    """The parser finds edges it must find (a check that the checks above check something)."""
    core = dict(UNITS)["ddstore-core/src"]
    assert "error.rs" in core["layout.rs"] and "store/mod.rs" in core["store/rows.rs"]
    package = dict(UNITS)["pyddstore/python/pyddstore"]
    assert "_errors.py" in package["_store.py"] and "_native.pyi" in package["_kinds.py"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
